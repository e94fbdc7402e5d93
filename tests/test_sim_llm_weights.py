"""The decoder's two weight modes (docs/llm.md, "Weights on the chip"): a
small random Llama whose matrices are GGUF blocks of every type the chip
expands gives the same logits and tokens, bit for bit, with the blocks on
the chip (``weights="gguf"``) and with bf16 weights (``weights="bf16"``);
the stats count the bytes each mode moves; a bad mode is a clear error."""

import numpy as np
import pytest

from mxu.hdl import ChipConfig
from mxu.hdl.quant import QUANT_INFO, QuantFormat
from mxu.sim import Chip
from mxu.sim.compiler.plan import MAX_GROUP
from mxu.sim.models import CausalLM
from mxu.sim.models.llama import LlamaConfig, LlamaWeights
from mxu.verif import golden
from mxu.verif.hazards import races
from decoders import quantize_weights

# K-quants take rows of whole super-blocks of 256: hidden and ffn are
# multiples of 256. A hidden of 512 is 32 N tiles on the llm chip, so the
# output and down projections' row-wise epilogues take a quantized group
# wider than MAX_GROUP (their chunks of `WIDE_ROUND` tiles, docs/compiler.md).
CONFIG = LlamaConfig(hidden=512, heads=4, kv_heads=2, ffn=256, layers=1, eps=1e-5,
                     rope_theta=10000.0, vocab=256, context=32)
# Every format, each on a matrix of its own (gate and up share one: the
# chip interleaves them into one matrix); the output projection is the
# tied embedding, Q8_0 as in SmolLM2's file.
TYPES = dict(wq="Q8_0", wk="Q4_0", wv="Q4_1", wo="Q5_0", w_gate="Q4_K", w_up="Q4_K",
             w_down="Q6_K")


def quantized_llama(seed=3):
    """`LlamaWeights.random` with every matrix replaced by its blocks of
    `TYPES` (the float32 matrices are what gguf dequantizes them to)."""
    return quantize_weights(LlamaWeights.random(CONFIG, seed=seed), TYPES, seed)


@pytest.fixture(scope="module")
def models():
    """The same weights on one llm preset chip (the build the suite's
    SmolLM2 tests use), once with their blocks, once as bf16."""
    weights = quantized_llama()
    chip = Chip(ChipConfig.preset("llm"), fast_mac=True)
    return {keep: CausalLM.from_weights(weights, chip=chip, keep=keep)
            for keep in ("gguf", "bf16")}


def _steps(lm):
    """A prefill's logits at every position (and a second sequence's), then
    a decode step of the batch of both, then one of the first alone (blocks
    of one row: docs/compiler.md, "Quantized weights"): every logit."""
    model, out = lm.model, []
    seqs = [model.new_sequence(16) for _ in range(2)]
    try:
        for s, prompt in zip(seqs, ([5, 17, 33, 3, 99, 200, 7], [1, 2, 3])):
            logits, _ = model.step([s], [prompt], logits="all")
            out.append(logits[0])
        token = [[int(np.argmax(out[0][-1]))], [int(np.argmax(out[1][-1]))]]
        logits, _ = model.step(seqs, token)
        out += list(logits)
        logits, _ = model.step(seqs[:1], [[int(np.argmax(logits[0]))]])
        out += list(logits)
    finally:
        for s in seqs:
            s.free()
    return out


def test_gguf_and_bf16_weights_give_the_same_bits(models):
    gguf_lm, bf16_lm = models["gguf"], models["bf16"]
    lw = gguf_lm.model.layers[0]
    kept = {m.weight.format.name for m in (lw.q, lw.k, lw.v, lw.o, lw.gu, lw.down)}
    assert kept | {gguf_lm.model.unembed.format.name} == set(ChipConfig.preset("llm").quant_formats)
    for k, (a, b) in enumerate(zip(_steps(gguf_lm), _steps(bf16_lm))):
        golden.assert_bits_equal(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                 what=f"logits {k}, gguf vs bf16 weights")
    prompts = [[5, 17, 33], [9, 8, 7, 6, 5]]
    tokens = gguf_lm.generate_ids(prompts, max_new_tokens=3)
    assert tokens == bf16_lm.generate_ids(prompts, max_new_tokens=3)
    assert gguf_lm.last_stats.decode.cycles < bf16_lm.last_stats.decode.cycles
    # Every program with quantized weight units (their ring, LOOPs and
    # loads) is race-free.
    chip = gguf_lm.chip
    compiled = [c for c in chip._programs.values()
                if any("'quant'" in str(t) for t in c.program.text)]
    assert compiled and all(races(chip.config, c.program) == [] for c in compiled)
    # Among them, groups wider than MAX_GROUP (the row-wise epilogues').
    assert any(plan is not None and plan.G > MAX_GROUP
               for c in compiled for seg in c.segments for _, plan in seg)


def test_a_batch_16_decode_step_preloads_its_cached_tiles(models):
    """At batch 16 the K, V and Q projections' steps (16 rows) outlast their
    quantized tiles' beats: the heads' cached K^T and V tiles load in that
    room, for later segments (docs/compiler.md, "Preloaded weights"). The
    same bits as with bf16 weights (whose projections leave no room: no
    preloads), and the program race-free."""
    out = {}
    for keep, lm in models.items():
        model = lm.model
        seqs = [model.new_sequence(32) for _ in range(16)]
        try:
            model.step(seqs, [[(7 * i + k) % CONFIG.vocab for k in range(17)] for i in range(16)])
            out[keep], _ = model.step(seqs, [[3 * i] for i in range(16)])
        finally:
            for s in seqs:
                s.free()
    for k, (a, b) in enumerate(zip(out["gguf"], out["bf16"])):
        golden.assert_bits_equal(a, b, what=f"sequence {k}'s logits, gguf vs bf16 weights")
    chip = models["gguf"].chip
    preloaded = [c for c in chip._programs.values() if c.preloads]
    assert preloaded and all(races(chip.config, c.program) == [] for c in preloaded)


def test_stats_count_the_bytes_each_mode_moves(models):
    """GenerationStats: the weight bytes per step by format (the file's bytes
    per block, Q8_0 8.5 bits a weight ...), and the decode roofline of those."""
    gguf_lm, bf16_lm = models["gguf"], models["bf16"]
    H, F, KV, V = CONFIG.hidden, CONFIG.ffn, CONFIG.kv_dim, CONFIG.vocab
    size = lambda qtype, n, k: n * k // QUANT_INFO[QuantFormat[qtype]].block * \
        QUANT_INFO[QuantFormat[qtype]].file_bytes
    want = {"Q8_0": size("Q8_0", H, H) + size("Q8_0", V, H), "Q4_0": size("Q4_0", KV, H),
            "Q4_1": size("Q4_1", KV, H), "Q5_0": size("Q5_0", H, H),
            "Q4_K": size("Q4_K", 2 * F, H), "Q6_K": size("Q6_K", H, F)}
    bf16 = 2 * (H * (2 * H + 2 * KV) + 3 * H * F + H * V)
    for lm, formats in ((gguf_lm, want), (bf16_lm, {"bf16": bf16})):
        lm.generate_ids([[1, 2, 3]], max_new_tokens=2)
        stats = lm.last_stats
        assert stats.weight_formats == formats
        d = stats.decode
        assert d.steps == 1 and d.weight_bytes == sum(formats.values())
        cfg = lm.chip.config
        assert d.roofline_cycles == max((d.weight_bytes + d.kv_bytes) / cfg.axi_data_bytes,
                                        d.model_macs / (cfg.rows * cfg.cols))


def test_a_bad_weights_mode_is_a_clear_error():
    with pytest.raises(ValueError, match=r"weights must be one of \('gguf', 'bf16'\).*not 'int4'"):
        CausalLM("SmolLM2-135M-Instruct", weights="int4")
    with pytest.raises(ValueError, match=r"weights must be one of .* not 'Q4_1'"):
        CausalLM.from_weights(LlamaWeights.random(CONFIG), keep="Q4_1")
