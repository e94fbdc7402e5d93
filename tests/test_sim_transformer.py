"""Transformer layers on the chip and a real pretrained model (docs/transformer.md):
the whole forward bit-exact against the golden transformer, and close to the
float32 reference."""

import warnings

import numpy as np
import pytest

from chip_configs import SHAPES, VPU_SHAPES
from mxu.hdl import ChipConfig, hostops
from mxu.sim import Chip
from mxu.sim.models import SentenceEncoder
from mxu.sim.driver.chip import ChipError
from mxu.sim.models.sentence import bucket_length
from mxu.sim.models.encoder import Encoder, EncoderConfig, EncoderWeights
from mxu.verif import golden
from mxu.verif.transformer import golden_forward, reference_forward

SEED = 20261126
TINY_ENCODER = EncoderConfig(hidden=64, heads=4, ffn=128, layers=2, vocab=100, max_positions=64)


def _batch(rng, lengths, L, vocab):
    ids = np.zeros((len(lengths), L), np.int64)
    mask = np.zeros((len(lengths), L), bool)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.integers(1, vocab, n)
        mask[i, :n] = True
    return ids, mask


def _cosine(a, b):
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("shape", ["4x4", "3x5"])
def test_random_encoder_is_bit_exact_against_the_golden_transformer(shape):
    chip = Chip(SHAPES[shape])
    stats = _check_tiny_encoder(chip, "host", min_cosine=0.999)
    assert stats.programs == 5 * TINY_ENCODER.layers


def _check_tiny_encoder(chip, vector_ops, min_cosine):
    """The random tiny encoder on `chip`: bit-exact against the golden
    transformer (its VPU form for ``vector_ops="chip"``), within `min_cosine`
    of float32 per token, and replayed from the compile cache (static shapes).
    Returns the first run's `RunStats`."""
    cfg = chip.config
    weights = EncoderWeights.random(TINY_ENCODER, seed=SEED)
    rng = np.random.default_rng(SEED)
    lengths = [5, 16, 11]
    ids, mask = _batch(rng, lengths, 16, TINY_ENCODER.vocab)
    encoder = Encoder(chip, weights, vector_ops=vector_ops)
    free = chip.free_bytes
    tokens, stats = encoder(ids, mask)
    vpu_form = dict(vector_ops="vpu", lanes=cfg.cols) if vector_ops == "chip" else {}
    want = golden_forward(weights, ids, mask, rows=cfg.rows, **vpu_form)
    golden.assert_bits_equal(tokens, want, f"encoder ({vector_ops} ops) on {cfg.rows}x{cfg.cols}",
                             seed=SEED)
    assert chip.free_bytes == free
    for i, n in enumerate(lengths):
        ref = reference_forward(weights, ids[i, :n])
        for got, exp in zip(tokens[i, :n], ref):
            assert _cosine(got, exp) > min_cosine
    again, again_stats = encoder(ids, mask)
    golden.assert_bits_equal(again, tokens, "replay")
    assert again_stats.cache_hits == again_stats.programs      # static shapes: all cached
    return stats


@pytest.mark.parametrize("shape", sorted(VPU_SHAPES))
def test_random_encoder_on_the_vector_unit_is_bit_exact(shape):
    """``vector_ops="chip"``: every layer op on the vector unit, one program per
    layer, bit-exact against the golden transformer in its VPU form (rows
    reduced in the chip's lane order) and within cosine 0.9999 of float32.
    Fast lanes (held to the RTL lanes by tests/test_sim_vector.py)."""
    chip = Chip(VPU_SHAPES[shape], fast_mac=True)
    stats = _check_tiny_encoder(chip, "chip", min_cosine=0.9999)
    assert stats.programs == TINY_ENCODER.layers          # one program per layer
    assert stats.vector_active_cycles > 0


def test_idle_gating_runs_the_encoder_in_the_same_cycles():
    """The tiny encoder with every layer op on the vector unit, whose clock
    (and the store engine's) is gated while it is idle (the fast builds'
    default, docs/simulation.md), and on the build that evaluates them every
    cycle: the same bits, cycles and vector rows."""
    weights = EncoderWeights.random(TINY_ENCODER, seed=SEED)
    ids, mask = _batch(np.random.default_rng(SEED), [7, 16], 16, TINY_ENCODER.vocab)
    runs = []
    for gating in (True, False):
        chip = Chip(VPU_SHAPES["3x5"], fast_mac=True, idle_gating=gating)
        tokens, stats = Encoder(chip, weights, vector_ops="chip")(ids, mask)
        runs.append((tokens, stats.cycles, stats.vector_active_cycles))
    golden.assert_bits_equal(runs[0][0], runs[1][0], "gated against ungated")
    assert runs[0][1:] == runs[1][1:]


@pytest.mark.parametrize("vector_ops", ["host", "chip"])
def test_packed_texts_are_bit_exact_and_kept_apart(vector_ops):
    """Four texts packed end to end into one row (`pack`): bit-exact against
    the golden transformer with the block-diagonal mask and per-text
    positions, and each text's tokens within cosine of that text encoded
    alone in float32 -- the texts do not see each other."""
    from mxu.sim.models.sentence import pack
    chip = Chip(VPU_SHAPES["4x4"], fast_mac=True)
    weights = EncoderWeights.random(TINY_ENCODER, seed=SEED)
    rng = np.random.default_rng(SEED)
    texts = [list(rng.integers(1, TINY_ENCODER.vocab, n)) for n in (5, 9, 11, 6)]
    batch = pack(texts, 0, TINY_ENCODER.max_positions)
    assert batch.ids.shape == (1, 32) and batch.placed == [(0, 1), (0, 2), (0, 3), (0, 4)]
    assert batch.positions[0, 14:25].tolist() == list(range(11))
    tokens, _ = Encoder(chip, weights, vector_ops=vector_ops)(batch.ids, batch.mask,
                                                               positions=batch.positions)
    form = dict(vector_ops="vpu", lanes=chip.config.cols) if vector_ops == "chip" else {}
    want = golden_forward(weights, batch.ids, batch.mask, rows=chip.config.rows,
                          positions=batch.positions, **form)
    golden.assert_bits_equal(tokens, want, f"packed texts ({vector_ops} ops)", seed=SEED)
    at = 0
    for t in texts:
        for got, exp in zip(tokens[0, at:at + len(t)], reference_forward(weights, np.array(t))):
            assert _cosine(got, exp) > 0.999
        at += len(t)


def test_packing_picks_the_rows_with_the_fewest_slots():
    from mxu.sim.models.sentence import pack
    # Eight texts of 9 tokens: rows of 16 hold one (8 x 16 slots), of 32 three
    # (3 x 32 = 96), of 64 seven (2 x 64), of 128 all (1 x 128): rows of 32.
    batch = pack([[1] * 9] * 8, 7, 256)
    assert batch.where == range(7, 15) and batch.ids.shape == (3, 32)
    assert batch.placed == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3), (2, 1), (2, 2)]
    assert (batch.segments[2, :18] > 0).all() and (batch.segments[2, 18:] == 0).all()
    assert batch.mask[0, 0, 8] and not batch.mask[0, 0, 9] and batch.mask[2, 20, 31]
    # A long text: everything fits one row of its bucket, 512.
    batch = pack([[1] * 100, [2] * 20, [3] * 30, [4] * 8, [5] * 300], 0, 512)
    assert batch.ids.shape == (1, 512) and batch.placed[-1] == (0, 5)


@pytest.mark.parametrize("vector_ops", ["host", "vpu"])
def test_rows_of_one_text_take_the_key_mask_with_the_same_bits(vector_ops):
    """A batch whose rows hold one text each: `Batch.mask` is the (B, L) mask
    of real keys (one softmax bias row per sequence on the chip), and every
    real token's vector is bit-identical (golden form) to the block-diagonal
    (B, L, L) mask's; a row of two texts keeps the block-diagonal mask."""
    from mxu.sim.models.sentence import pack
    weights = EncoderWeights.random(TINY_ENCODER, seed=SEED)
    rng = np.random.default_rng(SEED)
    batch = pack([list(rng.integers(1, TINY_ENCODER.vocab, n)) for n in (13, 30)], 0, 32)
    assert batch.ids.shape == (2, 32) and batch.mask.shape == (2, 32)
    block = batch.segments[:, :, None] == batch.segments[:, None, :]
    form = dict(vector_ops="vpu", lanes=4) if vector_ops == "vpu" else {}
    got, want = (golden_forward(weights, batch.ids, m, rows=4, positions=batch.positions, **form)
                 for m in (batch.mask, block))
    real = batch.segments > 0
    golden.assert_bits_equal(got[real], want[real], "key mask vs block-diagonal mask", seed=SEED)
    assert pack([[1] * 5, [2] * 6], 0, 32).mask.shape == (1, 16, 16)


def test_chip_vector_ops_need_the_vector_unit():
    with pytest.raises(ValueError, match="vector unit"):
        Encoder(Chip(SHAPES["4x4"]), EncoderWeights.random(TINY_ENCODER, seed=SEED),
                vector_ops="chip")
    with pytest.raises(ValueError, match="vector_ops must be one of"):
        Encoder(Chip(SHAPES["4x4"]), EncoderWeights.random(TINY_ENCODER, seed=SEED),
                vector_ops="gpu")


def test_host_operations_follow_their_documented_order():
    x = np.array([[1.0, 2.0, 3.0, 4.0, 5.0]], np.float32)
    assert hostops.tree_sum(x)[0, 0] == np.float32((1 + 5) + 3) + np.float32(2 + 4)
    p = hostops.softmax(np.array([[0.0, 1.0, 50.0]], np.float32), np.array([True, True, False]))
    assert p[0, 2] == 0 and abs(p.sum() - 1) < 1e-6
    erf = hostops.erf(np.linspace(-4, 4, 1001).astype(np.float32))
    import math
    want = np.array([math.erf(v) for v in np.linspace(-4, 4, 1001).astype(np.float32)])
    assert np.abs(erf - want).max() < 2e-7


def test_bucket_lengths():
    assert [bucket_length(n, 256) for n in (1, 16, 17, 100, 129, 300)] == [16, 16, 32, 128, 256, 256]


BATCH_TEXTS = ["Hello!", "The quick brown fox jumps over the lazy dog.",
               "Systolic arrays multiply matrices with a grid of processing elements, "
               "each doing one multiply-add per cycle.", "bf16 in, fp32 out."]


@pytest.fixture(scope="module")
def minilm():
    return SentenceEncoder("all-MiniLM-L6-v2", chip=Chip(fast_mac=True))


def test_bad_input_is_a_clear_error(minilm):
    with pytest.raises(ValueError, match="unknown model 'bert-huge'"):
        SentenceEncoder("bert-huge")
    with pytest.raises(ValueError, match="texts is empty"):
        minilm.encode([])
    with pytest.raises(TypeError, match=r"texts\[1\] must be a string, not int"):
        minilm.encode(["fine", 3])
    with pytest.raises(TypeError, match="texts must be a string or a list"):
        minilm.encode(42)


def _check_minilm(minilm, texts):
    emb = minilm.encode(texts, show_progress_bar=False)
    token_ids = minilm.tokenize(texts)
    cfg = minilm.chip.config
    vpu_form = dict(vector_ops="vpu", lanes=cfg.cols) if minilm.vector_ops == "chip" else {}
    for batch in minilm.batches(token_ids):
        want_tokens = golden_forward(minilm.weights, batch.ids, batch.mask, rows=cfg.rows,
                                     positions=batch.positions, **vpu_form)
        golden.assert_bits_equal(emb[batch.where.start:batch.where.stop], batch.pool(want_tokens),
                                 "MiniLM vs golden", seed=SEED)
    cosines = []
    for e, ids in zip(emb, token_ids):
        ref = reference_forward(minilm.weights, ids)
        ref = hostops.l2_normalize(hostops.mean_pool(ref[None], np.ones((1, len(ids)), bool)))[0]
        cosines.append(_cosine(e, ref))
    assert min(cosines) >= 0.9999, cosines
    assert np.allclose(np.linalg.norm(emb, axis=1), 1, atol=1e-5)
    return emb, cosines


def test_minilm_one_sentence(minilm):
    emb, _ = _check_minilm(minilm, ["A TPU-style matrix unit runs a sentence encoder."])
    s = minilm.last_stats
    assert emb.shape == (1, 384) and s.programs == 30 and 0 < s.mfu <= s.utilization <= 1


@pytest.fixture(scope="module")
def minilm_vpu():
    # The llm preset is the vpu chip with a larger external memory: one build
    # serves this test and the decoder's (tests/test_sim_llm.py).
    return SentenceEncoder("all-MiniLM-L6-v2", vector_ops="chip",
                           chip=Chip(ChipConfig.preset("llm"), fast_mac=True))


def test_minilm_one_sentence_on_the_vector_unit(minilm_vpu):
    """``vector_ops="chip"`` (the 16x16 chip with the vector unit, fast
    lanes): bit-exact against the golden transformer in its VPU form, cosine
    >= 0.9999 to float32, one program per layer."""
    emb, _ = _check_minilm(minilm_vpu, ["A TPU-style matrix unit runs a sentence encoder."])
    s = minilm_vpu.last_stats
    assert emb.shape == (1, 384) and s.programs == 6 and 0 < s.mfu <= s.utilization <= 1
    assert s.vector_active_cycles > 0


@pytest.mark.slow
def test_minilm_batched_on_the_vector_unit(minilm_vpu):
    emb, _ = _check_minilm(minilm_vpu, BATCH_TEXTS)
    assert emb.shape == (4, 384)


@pytest.mark.slow
def test_minilm_batched_sentences_of_different_lengths(minilm):
    emb, cosines = _check_minilm(minilm, BATCH_TEXTS)
    assert emb.shape == (4, 384)
    sims = emb @ emb.T
    assert sims[1, 2] < 0.9


def test_long_texts_are_truncated_with_a_warning(minilm):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ids = minilm.tokenize(["word " * 400])
    assert len(ids[0]) == 256 and ids[0][-1] == minilm.tokenizer.token_to_id("[SEP]")
    assert any("truncated to the model's maximum of 256" in str(w.message) for w in caught)


def test_close_closes_the_chip_the_encoder_made_only(minilm):
    """A chip passed in stays open (its owner closes it); one the encoder
    made is closed by close() and by the end of a `with` block."""
    minilm.close()
    assert not minilm.chip.closed
    with SentenceEncoder("all-MiniLM-L6-v2") as own:
        assert own.encode("still open", show_progress_bar=False).shape == (384,)
    assert own.chip.closed
    own.close()
    with pytest.raises(ChipError, match="this chip has been closed"):
        own.encode("closed", show_progress_bar=False)
