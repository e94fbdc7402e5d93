"""The published formulas (docs/performance.md, docs/llm.md, docs/pod.md)
against values worked out by hand on small cases: the models' MACs, the KV
cache's bytes, the roofline, MFU and utilization, and NCCL's busbw."""

import pytest

from mxu.hdl import ChipConfig
from mxu.sim.models.causal_lm import PhaseStats
from mxu.sim.models.encoder import EncoderConfig
from mxu.sim.models.encoder import model_macs as encoder_macs
from mxu.sim.models.llama import LlamaConfig, kv_bytes, roofline_cycles
from mxu.sim.models.llama import model_macs as llama_macs
from mxu.sim.runtime.pod import busbw, link_bandwidth, pod_config
from mxu.sim.runtime.stats import RunStats

# hidden 8, 2 query heads of 4 sharing 1 KV head (kv_dim 4), SwiGLU 16, one layer, 10 tokens.
LLAMA = LlamaConfig(hidden=8, heads=2, kv_heads=1, ffn=16, layers=1, eps=1e-5,
                    rope_theta=10000.0, vocab=10, context=32)


def test_encoder_macs():
    # hidden 4 (two heads of 2), FFN 8, 2 layers; texts of 3 and 1 tokens.
    # A token: Q, K, V and the output projection 4 * (4*4) = 64, the FFN
    # 4*8 + 8*4 = 64: 128. A text of n: scores n*n*4 and P.V n*n*4.
    # n=3: 3*128 + 2*9*4 = 456; n=1: 128 + 2*1*4 = 136; two layers: 2 * 592.
    cfg = EncoderConfig(hidden=4, heads=2, ffn=8, layers=2)
    assert encoder_macs(cfg, [3, 1]) == 1184


def test_llama_macs_of_a_prefill_and_of_a_decode_step():
    # A token: Q 8*8 = 64, K and V 8*4 = 32 each, O 64, gate, up and down
    # 8*16 = 128 each: 576. Each (token, visible key) pair costs every query
    # head a score (4 MACs) and its share of P.V (4): 2 heads * 8 = 16.
    # Prefill of 3 tokens (context 3): token t sees t+1 keys, 1+2+3 = 6 pairs;
    # logits of the last row 8*10 = 80: 3*576 + 6*16 + 80 = 1904.
    assert llama_macs(LLAMA, [3], [3]) == 1904
    # Decode, batch 2, caches of 5 and 2 after the step: 5 + 2 = 7 pairs,
    # 2 logits rows: 2*576 + 7*16 + 2*80 = 1424.
    assert llama_macs(LLAMA, [1, 1], [5, 2]) == 1424
    # Every row's logits (logits_rows=3): 1728 + 96 + 3*80.
    assert llama_macs(LLAMA, [3], [3], logits_rows=3) == 2064


def test_kv_bytes():
    # A position holds K and V of kv_dim 4 in bf16: 2 * 4 * 2 = 16 bytes a
    # layer; 5 + 2 positions, one layer: 112 bytes; three layers: 336.
    assert kv_bytes(LLAMA, [5, 2]) == 112
    three = LlamaConfig(**{**LLAMA.__dict__, "layers": 3})
    assert kv_bytes(three, [5, 2]) == 336


def test_roofline_is_the_slower_of_the_bus_and_the_array():
    chip = ChipConfig(rows=4, cols=4, axi_data_bits=64)     # 8 bytes a cycle, 16 PEs
    # 1000 bytes / 8 = 125 cycles against 1424 MACs / 16 = 89: bus-bound.
    assert roofline_cycles(1424, 1000, chip) == 125
    # 4000 MACs / 16 = 250 against 80 / 8 = 10: compute-bound.
    assert roofline_cycles(4000, 80, chip) == 250


def test_mfu_and_utilization():
    # 1600 MACs asked of a 4x4 array in 100 cycles: 1600 / (100 * 16) = 1.0
    # utilization; of them 800 the model's: MFU 800 / 1600 = 0.5.
    s = RunStats(rows=4, cols=4, cycles=100, macs=1600, model_macs=800)
    assert s.ideal_cycles == 100 and s.utilization == 1.0 and s.mfu == 0.5
    # Without model MACs, MFU counts every MAC asked.
    assert RunStats(rows=4, cols=4, cycles=200, macs=1600).mfu == 0.5
    assert RunStats(rows=4, cols=4).mfu == 0.0
    # A phase: 1904 model MACs in 238 cycles on 16 PEs: 1904 / 3808 = 0.5,
    # its roofline of 119 cycles half the cycles.
    phase = PhaseStats(cycles=238, model_macs=1904, roofline_cycles=119.0, pe=16)
    assert phase.mfu == 0.5 and phase.roofline_share == 0.5


def test_busbw_is_nccls():
    # An all-reduce of 4096 bytes per chip on 4 chips in 100 link cycles:
    # algbw 40.96 B/cycle, busbw 40.96 * 2 * 3 / 4 = 61.44 B/cycle.
    assert busbw("all_reduce", 4096, 4, 100) == pytest.approx(61.44)
    # A reduce-scatter or an all-gather moves (n-1)/n: 40.96 * 3 / 4.
    assert busbw("reduce_scatter", 4096, 4, 100) == pytest.approx(30.72)
    assert busbw("all_gather", 4096, 4, 100) == pytest.approx(30.72)
    assert busbw("all_reduce", 4096, 4, 0) == 0.0


def test_a_links_bandwidth_is_at_most_a_flit_a_cycle():
    # The pod preset's 512-bit bus: a flit is 64 bytes. A 256 B/cycle link
    # carries 64; so 61.44 B/cycle of busbw is 96 % of it, not 24 %.
    config = pod_config(None, "ring")
    assert config.link_flit_bytes == 64
    assert link_bandwidth(config, 256) == 64 and link_bandwidth(config, 16) == 16
    assert busbw("all_reduce", 4096, 4, 100) / link_bandwidth(config, 256) == pytest.approx(0.96)
