"""What the decoder tests (tests/test_sim_llm.py, tests/test_sim_llm_weights.py,
tests/test_sim_gemma3.py) share: logits compared bit for bit, prefill against
token-by-token decode, and GGUF blocks of random matrices."""

import gguf
import numpy as np
from gguf import quants

from mxu.hdl.quant import QUANT_INFO, QuantFormat
from mxu.sim.models.llama import GgufBlocks
from mxu.verif import golden


def same_bits(got, want, what):
    """Logits `got` and `want` equal bit for bit (AssertionError naming `what`)."""
    golden.assert_bits_equal(np.asarray(got, np.float32), np.asarray(want, np.float32), what)


def assert_prefill_equals_decode(lm, ids):
    """The logits of one prefill of `ids` on `lm` (a `CausalLM`) equal, row
    for row and bit for bit, those of one decode step per token."""
    prefill = lm.logits_ids(ids)
    seq = lm.model.new_sequence(len(ids))
    try:
        for t, token in enumerate(ids):
            got, _ = lm.model.step([seq], [[token]])
            same_bits(got[0], prefill[t], f"decode step {t} against prefill row {t}")
    finally:
        seq.free()


def _k_quant(fmt, blocks, rng):
    """Random valid K-quant blocks (gguf cannot quantize to them): random
    codes and sub-block scales, small fp16 super-block scales."""
    raw = rng.integers(0, 256, (blocks, QUANT_INFO[fmt].file_bytes), dtype=np.uint8)
    f16 = lambda v: np.full(blocks, v, np.float16).view(np.uint8).reshape(-1, 2)
    if fmt is QuantFormat.Q4_K:
        raw[:, 0:2], raw[:, 2:4] = f16(2e-4), f16(1e-4)        # d, dmin
    else:
        raw[:, 208:210] = f16(2e-5)                             # Q6_K's d
    return raw


def quantized(w, qtype, rng):
    """(GgufBlocks of W (in, out) as the file stores it, N rows of K; the
    float32 (in, out) matrix gguf dequantizes them to)."""
    n, k = w.shape[1], w.shape[0]
    fmt = QuantFormat[qtype]
    raw = (_k_quant(fmt, n * k // 256, rng) if qtype in ("Q4_K", "Q6_K")
           else quants.quantize(np.ascontiguousarray(w.T), gguf.GGMLQuantizationType[qtype]))
    raw = np.ascontiguousarray(raw).reshape(-1)
    deq = quants.dequantize(raw.reshape(n, -1), gguf.GGMLQuantizationType[qtype])
    return GgufBlocks(raw, qtype, (n, k)), np.ascontiguousarray(deq.astype(np.float32).T)


def quantize_weights(weights, types, seed):
    """`weights` (random `LlamaWeights` or `Gemma3Weights`) with each layer's
    matrices replaced by their blocks (`types`: one {matrix: GGUF type} for
    every layer, or a list of them, one a layer) and the embedding by Q8_0
    blocks, the float32 matrices what gguf dequantizes them to."""
    rng = np.random.default_rng(seed)
    per_layer = types if isinstance(types, list) else [types] * len(weights.layers)
    for layer, kinds in zip(weights.layers, per_layer):
        for key, qtype in kinds.items():
            layer.blocks[key], deq = quantized(getattr(layer, key), qtype, rng)
            setattr(layer, key, deq)
    weights.blocks["embed"], deq = quantized(np.ascontiguousarray(weights.embed.T), "Q8_0", rng)
    weights.embed = np.ascontiguousarray(deq.T)
    return weights
