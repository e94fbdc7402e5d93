"""Gemma 3 on the chip (docs/llm.md): a tiny random Gemma 3 (the real
graph: sqrt(hidden) embedding scale, QK-norm + NEOX RoPE, post-norms,
GeGLU, two local layers with a window of 8 and one global layer) on the 4x4
chip, bit-exact against the golden Gemma form through prompts longer than
the window, decode steps that wrap the local layers' rings, a batch of
sequences of different lengths, and prefill against token-by-token decode;
the golden form against the float32 reference; its GGUF reader; bad input."""

from dataclasses import replace

import numpy as np
import pytest

from chip_configs import VPU_SHAPES
from decoders import assert_prefill_equals_decode
from decoders import same_bits as _same
from mxu.sim import Chip
from mxu.sim.models import CausalLM
from mxu.sim.models.gemma3 import ChipGemma3, Gemma3Config, Gemma3Weights, _ring_pieces
from mxu.sim.models.llama import kv_bytes, model_macs
from mxu.verif import golden
from mxu.verif.gemma3 import GoldenGemma3, reference_logits
from mxu.verif.hazards import races

WINDOW = 8
TINY = Gemma3Config(hidden=32, heads=2, kv_heads=1, head_dim=16, ffn=64, layers=3,
                    eps=float(np.float32(1e-6)), rope_theta=1e6, rope_theta_local=1e4,
                    window=WINDOW, local=(True, True, False), vocab=128, context=64)


@pytest.fixture(scope="module")
def tiny():
    cfg = VPU_SHAPES["4x4"]
    weights = Gemma3Weights.random(TINY, seed=3)
    lm = CausalLM.from_weights(weights, chip=Chip(cfg, fast_mac=True))
    return lm, GoldenGemma3(weights, rows=cfg.rows, lanes=cfg.cols)


def test_prompts_longer_than_the_window_and_batched_decode_are_bit_exact(tiny):
    """Three prompts (13 tokens: longer than the window; 3; 9) prefilled
    packed in one step, then decode steps of the live batch that take every
    sequence past the window (its local rings wrap), one sequence leaving:
    every step's logits equal the golden Gemma form's."""
    lm, gold = tiny
    gold.caches.clear(), gold.lengths.clear()
    model = lm.model
    assert isinstance(model, ChipGemma3)
    prompts = [[5, 17, 33, 3, 99, 100, 7, 8, 9, 10, 11, 12, 13], [1, 2, 3], [9, 8, 7, 6] * 2 + [5]]
    seqs = [model.new_sequence(32) for _ in prompts]
    # The local layers hold a ring of the window's positions, the global one all.
    assert [s.shape[0] for s in seqs[0].v] == [WINDOW, WINDOW, 32]
    try:
        got, _ = model.step(seqs, prompts)
        want = gold.forward(list(enumerate(prompts)))
        for k in range(3):
            _same(got[k], want[k], f"packed prefill of prompt {k}")
        nxt = [int(np.argmax(g)) for g in got]
        for step in range(9):
            live = [0, 1, 2] if step < 4 else [0, 1]            # sequence 2 leaves
            got, stats = model.step([seqs[k] for k in live], [[nxt[k]] for k in live])
            want = gold.forward([(k, [nxt[k]]) for k in live])
            for k, g, w in zip(live, got, want):
                _same(g, w, f"decode step {step} of sequence {k}")
                nxt[k] = int(np.argmax(g))
    finally:
        for s in seqs:
            s.free()
    programs = list(lm.chip._programs.values())
    assert programs and all(races(lm.chip.config, c.program) == [] for c in programs)


def test_prefill_logits_equal_token_by_token_decode(tiny):
    """The logits of one prefill of 20 tokens (2.5 windows) are, row for row,
    bit for bit those of 20 decode steps, whose local layers read their
    rings: the softmax's tree folds the masked row onto the ring's order,
    and P.V sums in position order in two seeded matmuls."""
    ids = [11, 22, 33, 44, 55, 66, 77, 88, 99, 111, 122, 3, 14, 15, 92, 65, 35, 89, 79, 32]
    assert_prefill_equals_decode(tiny[0], ids)


def test_batched_generation_equals_one_sequence_at_a_time(tiny):
    lm, _ = tiny
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3], [2, 7, 1]]
    together = lm.generate_ids(prompts, max_new_tokens=6)
    alone = [lm.generate_ids([p], max_new_tokens=6)[0] for p in prompts]
    assert together == alone


def test_the_end_of_turn_token_ends_a_generation_as_eos_does(tiny):
    """The same weights with the second token they generate made the end
    of turn (`Gemma3Config.eot`): greedy generation stops right after it,
    as at eos; without one it goes on."""
    lm, _ = tiny
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    free = lm.generate_ids([prompt], max_new_tokens=6)[0]
    assert len(free) == 6 and free[0] != free[1] and TINY.eos not in free[:2]
    eot = replace(lm.weights, config=replace(TINY, eot=free[1]))
    assert eot.config.stop_ids == (TINY.eos, free[1])
    stopped = CausalLM.from_weights(eot, chip=lm.chip)
    assert stopped.generate_ids([prompt], max_new_tokens=6) == [free[:2]]
    assert stopped.last_stats.decode.steps == 1


def test_golden_form_is_close_to_the_float32_reference(tiny):
    """The golden form (bf16 operands, the VPU's functions) against the same
    graph in float32 throughout, over a prompt of three windows."""
    _, gold = tiny
    gold.caches.clear(), gold.lengths.clear()
    ids = list(range(3, 3 + 3 * WINDOW))
    got = gold.forward([(0, ids)], logits="all")[0]
    want = reference_logits(gold.weights, ids)
    assert np.max(np.abs(got - want)) < 0.05 * np.max(np.abs(want))
    assert np.mean(np.argmax(got, 1) == np.argmax(want, 1)) >= 0.9


# A tiny Gemma 3 whose matrices are GGUF blocks of the types the real file
# uses, on the smallest test chip whose expander takes them all (the llm
# preset, the build the SmolLM2 tests share; the 4x4 chip expands none):
# K-quants need K of whole super-blocks of 256 (wo's q_dim, down's ffn); a
# quantized matmul with a row operand (QK-norm's RoPE table) needs more
# steps (K tiles x N tiles) than its load lead (`quant_lead`, 48 on this
# chip; docs/compiler.md): hidden 256, 16 x 4 steps for wk.
QUANT = Gemma3Config(hidden=256, heads=4, kv_heads=1, head_dim=64, ffn=256, layers=2,
                     eps=float(np.float32(1e-6)), rope_theta=1e6, rope_theta_local=1e4,
                     window=16, local=(True, False), vocab=256, context=48)
# The file's types, layer by layer (its V and down projections alternate).
QUANT_TYPES = [dict(wq="Q5_0", wk="Q5_0", wv=wv, wo="Q4_K", w_gate="Q5_0", w_up="Q5_0",
                    w_down=down) for wv, down in (("Q8_0", "Q6_K"), ("Q5_0", "Q4_K"))]


def _run_quantized(lm, gold):
    """A packed prefill of a prompt longer than the window and a short one,
    then decode steps of both (the local layer's ring wraps): every step's
    logits, each checked against the golden form."""
    model, out = lm.model, []
    gold.caches.clear(), gold.lengths.clear()
    prompts = [[(7 * t + 3) % QUANT.vocab for t in range(21)], [5, 17, 33]]
    seqs = [model.new_sequence(32) for _ in prompts]
    try:
        got, _ = model.step(seqs, prompts)
        for step in range(3):
            want = gold.forward(list(enumerate(prompts)) if step == 0 else
                                [(k, [t]) for k, t in enumerate(nxt)])
            for k in range(2):
                _same(got[k], want[k], f"{lm.name}: step {step}, sequence {k}")
            out += got
            nxt = [int(np.argmax(g)) for g in got]
            if step < 2:
                got, _ = model.step(seqs, [[t] for t in nxt])
    finally:
        for s in seqs:
            s.free()
    return out


def test_gguf_blocks_on_the_chip_give_the_bf16_bits():
    """The file's blocks on the chip (Q8_0 embedding, Q5_0, Q4_K, Q6_K) and
    the same matrices as bf16: the same logits bit for bit, both equal to
    the golden Gemma form of the dequantized weights, and the same tokens."""
    from decoders import quantize_weights

    from mxu.hdl import ChipConfig
    weights = quantize_weights(Gemma3Weights.random(QUANT, seed=5), QUANT_TYPES, seed=5)
    chip = Chip(ChipConfig.preset("llm"), fast_mac=True)
    gold = GoldenGemma3(weights, rows=16, lanes=16)
    lms = {keep: CausalLM.from_weights(weights, chip=chip, keep=keep, name=keep)
           for keep in ("gguf", "bf16")}
    assert set(lms["gguf"].model.weight_formats) == {"Q8_0", "Q5_0", "Q4_K", "Q6_K"}
    assert set(lms["bf16"].model.weight_formats) == {"bf16"}
    runs = {keep: _run_quantized(lm, gold) for keep, lm in lms.items()}
    for k, (a, b) in enumerate(zip(runs["gguf"], runs["bf16"])):
        _same(a, b, f"logits {k}, gguf vs bf16 weights")
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6] * 3, [2, 7, 1]]
    tokens = lms["gguf"].generate_ids(prompts, max_new_tokens=4)
    assert tokens == lms["bf16"].generate_ids(prompts, max_new_tokens=4)
    assert lms["gguf"].last_stats.decode.cycles < lms["bf16"].last_stats.decode.cycles
    chip.close()


def test_ring_pieces_and_the_window_in_the_statistics():
    assert _ring_pieces(3, 6, 5, 8) == [(3, 6, 2), (5, 0, 3)]
    assert _ring_pieces(0, 8, 1, 8) == [(0, 0, 1)]
    # A decode step at 20 positions: the local layers see 8 keys, the global 20.
    per_key = 2 * TINY.heads * TINY.head_dim
    assert model_macs(TINY, [1], [20], 0) - model_macs(TINY, [1], [1], 0) == \
        per_key * ((WINDOW - 1) * 2 + 19)
    assert kv_bytes(TINY, [20]) == 2 * 2 * TINY.kv_dim * (WINDOW * 2 + 20)


def test_bad_input_is_a_clear_error(tiny):
    lm, _ = tiny
    seq = lm.model.new_sequence(32)
    try:
        lm.model.step([seq], [[1, 2, 3]])
        with pytest.raises(ValueError, match="would cross the sliding window of 8"):
            lm.model.step([seq], [[4] * 6])
    finally:
        seq.free()
    bad = Gemma3Config(**dict(TINY.__dict__, head_dim=12))
    with pytest.raises(ValueError, match=r"head_dim \(12\) must be a multiple of 2 \* cols \(8\)"):
        ChipGemma3(lm.chip, Gemma3Weights.random(bad))
    with pytest.raises(ValueError, match="local names 2 layers, not 3"):
        Gemma3Config(**dict(TINY.__dict__, local=(True, False)))


def test_a_rings_p_v_sums_the_keys_in_position_order(tiny):
    """P.V over a ring whose oldest key is at column 3: the chip's two
    seeded matmuls give the sums in position order (columns 3.. then ..3),
    bit for bit, into fp32 -- which differ from one matmul in the ring's
    order (so the order is observable)."""
    from mxu.hdl.dtypes import bfloat16
    from mxu.sim.models.blocks import Head, attention
    lm, _ = tiny
    chip, rows = lm.chip, lm.chip.config.rows
    rng = np.random.default_rng(5)
    g, d, ring = 2, 8, 3
    q = golden.as_bf16(rng.standard_normal((g, d)).astype(np.float32))
    kt = golden.as_bf16(rng.standard_normal((d, WINDOW)).astype(np.float32))
    v = golden.as_bf16((1e3 * rng.standard_normal((WINDOW, d))).astype(np.float32))
    probs, out = chip.empty((g, WINDOW), bfloat16), chip.empty((g, d))
    older = chip.empty((g, d), transient=True)
    with chip.record():
        attention(chip, [Head(chip.upload(q, bfloat16), chip.upload(kt, bfloat16),
                              chip.upload(v, bfloat16), out, probs, ring=ring, older=older)])
    p = golden.as_bf16(golden.f32_from_bits(golden.f32_bits(probs.numpy().astype(np.float32))))
    want = golden.matmul(p[:, :ring], v[:ring], rows=rows,
                         seed=golden.matmul(p[:, ring:], v[ring:], rows=rows))
    _same(out.numpy(), want, "ring P.V")
    assert not np.array_equal(want, golden.matmul(p, v, rows=rows))
    for t in (probs, out, older):
        t.free()


def test_the_gemma3_reader_takes_every_number_from_the_file(tmp_path):
    """A tiny gemma3 GGUF written with `gguf.GGUFWriter`: `read_decoder` picks
    the family by general.architecture and reads the sizes (head_dim from
    key_length, the local layers' pattern and RoPE base from the file) and
    every weight as written; the end-of-turn token by its text."""
    import gguf

    from mxu.sim.models.registry import read_decoder
    weights = Gemma3Weights.random(TINY, seed=4)
    c, path = TINY, tmp_path / "tiny-gemma.gguf"
    w = gguf.GGUFWriter(str(path), "gemma3")
    for key, value in (("context_length", c.context), ("embedding_length", c.hidden),
                       ("block_count", c.layers), ("feed_forward_length", c.ffn),
                       ("attention.head_count", c.heads), ("attention.head_count_kv", c.kv_heads),
                       ("attention.key_length", c.head_dim),
                       ("attention.value_length", c.head_dim),
                       ("attention.sliding_window", c.window),
                       ("attention.sliding_window_pattern", 3)):
        w.add_uint32(f"gemma3.{key}", value)
    for key, value in (("attention.layer_norm_rms_epsilon", c.eps), ("rope.freq_base", 1e6),
                       ("rope.freq_base_swa", 1e4)):
        w.add_float32(f"gemma3.{key}", value)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{k}" if k != 7 else "<end_of_turn>" for k in range(c.vocab)])
    w.add_bos_token_id(c.bos)
    w.add_eos_token_id(c.eos)
    f32 = lambda x: np.ascontiguousarray(x, np.float32)
    w.add_tensor("token_embd.weight", f32(weights.embed))
    w.add_tensor("output_norm.weight", f32(weights.final_norm))
    names = {"attn_norm": "attn_norm", "attn_q_norm": "q_norm", "attn_k_norm": "k_norm",
             "post_attention_norm": "post_attn_norm", "ffn_norm": "ffn_norm",
             "post_ffw_norm": "post_ffw_norm", "attn_q": "wq", "attn_k": "wk", "attn_v": "wv",
             "attn_output": "wo", "ffn_gate": "w_gate", "ffn_up": "w_up", "ffn_down": "w_down"}
    for i, lw in enumerate(weights.layers):
        for name, field in names.items():
            x = getattr(lw, field)
            w.add_tensor(f"blk.{i}.{name}.weight", f32(x.T if x.ndim == 2 else x))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    got, meta = read_decoder(path)
    assert got.config == replace(TINY, eot=7) and meta["tokens"][5] == "t5"
    assert got.config.stop_ids == (TINY.eos, 7)
    for i, lw in enumerate(weights.layers):
        for field in names.values():
            assert np.array_equal(getattr(got.layers[i], field), getattr(lw, field)), field
    assert np.array_equal(got.unembed, weights.embed)


@pytest.mark.slow
def test_gemma_3_270m_generates_bit_exact_to_the_golden_form_on_the_llm_chip():
    """The real model with its default weights (the file's blocks on the
    chip) on the llm preset, fast MAC: a prefill's logits at every position
    equal the golden Gemma form's bit for bit; `generate` of two prompts (12
    new tokens) runs every layer as its two programs and the logits as a
    third on the chip, and its tokens are the golden form's greedy ones."""
    from mxu.hdl import ChipConfig
    lm = CausalLM("gemma-3-270m", chip=Chip(ChipConfig.preset("llm"), fast_mac=True))
    assert set(lm.model.weight_formats) == {"Q8_0", "Q5_0", "Q4_K", "Q6_K"}
    gold = GoldenGemma3(lm.weights, rows=16, lanes=16)
    texts = ["The capital of France is", "def fibonacci(n):"]
    ids = lm.tokenizer.encode(texts[0])
    _same(lm.logits_ids(ids), gold.forward([(0, ids)], logits="all")[0], "gemma-3-270m prefill")
    gold.caches.clear(), gold.lengths.clear()
    prompts = [lm.tokenizer.encode(t) for t in texts]
    got = lm.generate_ids(prompts, max_new_tokens=12)
    want, nxt = [[] for _ in prompts], gold.forward(list(enumerate(prompts)))
    live = [0, 1]
    while live:
        for k, logits in zip(list(live), nxt):
            want[k].append(int(np.argmax(logits)))
            if want[k][-1] in lm.config.stop_ids or len(want[k]) == 12:
                live.remove(k)
        nxt = gold.forward([(k, [want[k][-1]]) for k in live]) if live else []
    assert got == want
    stats, layers = lm.last_stats, lm.config.layers
    programs = (layers + 2) * (stats.prefill.steps + stats.decode.steps)    # `programs`
    assert stats.programs == programs and stats.new_tokens == sum(map(len, got))
    print(f"\n{[lm.tokenizer.decode(o) for o in got]!r}: prefill {stats.prefill.cycles:,} cycles "
          f"(MFU {100 * stats.prefill.mfu:.1f} %), decode {stats.decode.cycles:,} cycles in "
          f"{stats.decode.steps} steps ({100 * stats.decode.roofline_share:.1f} % of its roofline), "
          f"weights {stats.weight_formats}")
    lm.close()
