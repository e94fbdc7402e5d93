"""Transformer layers on the chip (docs/transformer.md).

Every matmul runs on the chip -- the projections, the per-head scores and P.V
alike -- on weights uploaded once and kept resident. With ``vector_ops="host"``
softmax, LayerNorm, GELU, the scaling and the residual adds run on the host
(`hostops`); with ``vector_ops="chip"`` they run on the chip's vector unit
(`Chip.vector`) and a whole layer is one program (`ChipEncoderLayer`).
Activations are rounded to bf16 where a matmul reads them, as on a TPU; what
the chip writes for the host is fp32.

Shapes are static: a batch of B sequences padded to L tokens is one (B*L, H)
activation with a (B, L) mask, so each distinct (B, L) compiles its programs
once and replays them from the compile cache.
"""

import math
from dataclasses import dataclass, field

import numpy as np

from mxu.hdl import hostops
from mxu.hdl.dtypes import bfloat16

from .blocks import Linear, Steps, attention, feed_forward, sequence_heads

__all__ = ["EncoderConfig", "LayerWeights", "EncoderWeights", "Linear", "MultiHeadAttention",
           "FeedForward", "EncoderLayer", "ChipEncoderLayer", "Encoder", "model_macs",
           "VECTOR_BACKENDS"]

VECTOR_BACKENDS = ("host", "chip")


@dataclass(frozen=True)
class EncoderConfig:
    """Sizes of a BERT-style encoder."""
    hidden: int
    heads: int
    ffn: int
    layers: int
    eps: float = 1e-12
    vocab: int = 30522
    max_positions: int = 512

    @property
    def head_dim(self):
        return self.hidden // self.heads

    def __post_init__(self):
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")


@dataclass
class LayerWeights:
    """One encoder layer, float32, matmul weights as (in, out)."""
    wq: np.ndarray
    bq: np.ndarray
    wk: np.ndarray
    bk: np.ndarray
    wv: np.ndarray
    bv: np.ndarray
    wo: np.ndarray
    bo: np.ndarray
    ln1_gamma: np.ndarray
    ln1_beta: np.ndarray
    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray
    ln2_gamma: np.ndarray
    ln2_beta: np.ndarray

    @classmethod
    def random(cls, config, rng):
        """Random weights of the given sizes (for tests)."""
        H, F = config.hidden, config.ffn
        w = lambda i, o: (rng.standard_normal((i, o)) / math.sqrt(i)).astype(np.float32)
        b = lambda n: (0.1 * rng.standard_normal(n)).astype(np.float32)
        g = lambda n: (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)
        return cls(w(H, H), b(H), w(H, H), b(H), w(H, H), b(H), w(H, H), b(H), g(H), b(H),
                   w(H, F), b(F), w(F, H), b(H), g(H), b(H))


@dataclass
class EncoderWeights:
    """A BERT-style encoder: embeddings and layers, float32."""
    config: EncoderConfig
    word: np.ndarray
    position: np.ndarray
    token_type: np.ndarray
    emb_gamma: np.ndarray
    emb_beta: np.ndarray
    layers: list = field(default_factory=list)

    @classmethod
    def random(cls, config, seed=0):
        rng = np.random.default_rng(seed)
        H = config.hidden
        e = lambda n: (0.5 * rng.standard_normal((n, H))).astype(np.float32)
        return cls(config, e(config.vocab), e(config.max_positions), e(2),
                   (1 + 0.1 * rng.standard_normal(H)).astype(np.float32),
                   (0.1 * rng.standard_normal(H)).astype(np.float32),
                   [LayerWeights.random(config, rng) for _ in range(config.layers)])


def model_macs(config, lengths):
    """The model's own multiply-adds for sequences of the given real lengths
    (padding excluded): the projections, scores, P.V and the feed-forward."""
    H, F, layers = config.hidden, config.ffn, config.layers
    per_token = 3 * H * H + H * H + 2 * H * F
    return layers * sum(n * per_token + 2 * n * n * H for n in lengths)


class MultiHeadAttention:
    """Self-attention with a padding mask. Q, K and V come from one fused
    projection (bf16 out); the scores of every (sequence, head) are one program;
    P.V of every (sequence, head) and the output projection are another. K^T is
    made on the host (docs/transformer.md)."""

    def __init__(self, chip, config, w):
        self.chip, self.config = chip, config
        self.qkv = Linear(chip, np.concatenate([w.wq, w.wk, w.wv], axis=1),
                          np.concatenate([w.bq, w.bk, w.bv]))
        self.out = Linear(chip, w.wo, w.bo)

    def __call__(self, x, mask, steps):
        chip, cfg = self.chip, self.config
        B, L = mask.shape[:2]
        H, heads, d = cfg.hidden, cfg.heads, cfg.head_dim
        qkv = self.qkv(chip.upload(x, dtype=bfloat16), out_dtype=bfloat16)
        steps.add()
        # K^T of the whole batch, from the host: head h of sequence b is the
        # block [h*d:(h+1)*d, b*L:(b+1)*L].
        kt = chip.upload(np.ascontiguousarray(qkv[:, H:2 * H].numpy().T))
        scores = chip.empty((B * heads * L, L), np.float32)
        with chip.record() as rec:
            for b in range(B):
                for h in range(heads):
                    chip.matmul(qkv[b * L:(b + 1) * L, h * d:(h + 1) * d],
                                kt[h * d:(h + 1) * d, b * L:(b + 1) * L],
                                out=scores[(b * heads + h) * L:(b * heads + h + 1) * L])
        steps.add(rec.stats)
        s = hostops.scale(scores.numpy().reshape(B, heads, L, L), 1 / math.sqrt(d))
        p = hostops.softmax(s, hostops.attention_mask(mask))
        probs = chip.upload(p.reshape(B * heads * L, L), dtype=bfloat16)
        context = chip.empty((B * L, H), bfloat16)
        with chip.record() as rec:
            for b in range(B):
                for h in range(heads):
                    chip.matmul(probs[(b * heads + h) * L:(b * heads + h + 1) * L],
                                qkv[b * L:(b + 1) * L, 2 * H + h * d:2 * H + (h + 1) * d],
                                out_dtype=bfloat16,
                                out=context[b * L:(b + 1) * L, h * d:(h + 1) * d])
            attended = self.out(context)
        steps.add(rec.stats)
        return attended.numpy()


class FeedForward:
    """``gelu(x @ W1 + b1) @ W2 + b2``: both matmuls on the chip, GELU on the host."""

    def __init__(self, chip, w):
        self.chip = chip
        self.up = Linear(chip, w.w1, w.b1)
        self.down = Linear(chip, w.w2, w.b2)

    def __call__(self, x, steps):
        hidden = self.up(self.chip.upload(x, dtype=bfloat16))
        steps.add()
        activated = hostops.gelu(hidden.numpy())
        out = self.down(self.chip.upload(activated, dtype=bfloat16))
        steps.add()
        return out.numpy()


class EncoderLayer:
    """Post-LayerNorm BERT layer: ``x1 = LN(x + attention(x))``,
    ``x2 = LN(x1 + ffn(x1))``."""

    PROGRAMS = 5     # QKV, scores, P.V with the output projection, FFN up, FFN down

    def __init__(self, chip, config, w):
        self.config, self.w = config, w
        self.attention = MultiHeadAttention(chip, config, w)
        self.ffn = FeedForward(chip, w)

    def __call__(self, x, mask, steps):
        eps, w = self.config.eps, self.w
        x1 = hostops.layer_norm(hostops.add(x, self.attention(x, mask, steps)),
                                w.ln1_gamma, w.ln1_beta, eps)
        return hostops.layer_norm(hostops.add(x1, self.ffn(x1, steps)),
                                  w.ln2_gamma, w.ln2_beta, eps)


class ChipEncoderLayer:
    """One encoder layer as one chip program: every matmul on the array, every
    layer op on the vector unit, the intermediates in transient device
    tensors, those an epilogue hands to the next matmul kept in VMEM (docs/vpu.md,
    "The encoder layer on the chip"). Bit-exact to
    the golden transformer in its VPU form with the chip's lane order
    (docs/vpu.md, docs/transformer.md)."""

    PROGRAMS = 1

    def __init__(self, chip, config, w):
        self.chip, self.config = chip, config
        self.attention = MultiHeadAttention(chip, config, w)
        self.ffn = FeedForward(chip, w)
        from ..runtime.vector import layer_norm_params
        self.ln1 = layer_norm_params(chip, w.ln1_gamma, w.ln1_beta)
        self.ln2 = layer_norm_params(chip, w.ln2_gamma, w.ln2_beta)

    def __call__(self, x, xb, bias, B, L, before=None, unmasked=(), per_query=False):
        """`x`, `xb`: the (B*L, hidden) fp32 and bf16 device tensors of the
        layer's input; `bias`: the softmax bias rows (`softmax_bias`) of the
        (B, L) mask, or with `per_query` of the (B, L, L) mask (a row per
        query: rows of packed texts); `before`: a function that records ops ahead of the layer's
        own (the embedding LayerNorm that writes x and xb); `unmasked`: the
        sequences with no padding, whose softmax needs no bias when L is a
        multiple of the chip's columns (the same bits, docs/vpu.md). Returns
        the output (fp32 and bf16 tensors) and the program's `RunStats`."""
        chip, cfg = self.chip, self.config
        H, heads_n, d, R = cfg.hidden, cfg.heads, cfg.head_dim, B * L
        bf = bfloat16
        qkv = self.attention.qkv
        # The layer's intermediates are transient: the compiler keeps those it
        # can in VMEM, from the epilogue that makes them to the matmul that
        # reads them (docs/compiler.md, "Hand-offs in VMEM").
        def temp(shape, dtype=np.float32):
            return chip.empty(shape, dtype, transient=True)

        q, v, kt = temp((R, H), bf), temp((R, H), bf), temp((H, R), bf)
        probs = temp((B * heads_n * L, L), bf)
        context, x1, x1b = temp((R, H), bf), temp((R, H)), temp((R, H), bf)
        hb = temp((R, cfg.ffn), bf)
        out, outb = chip.empty((R, H)), chip.empty((R, H), bf)
        temps = [q, v, kt, probs, context, x1, x1b, hb]
        try:
            with chip.record() as rec:
                if before is not None:
                    before()
                # K^T scaled by 1/sqrt(d) before its bf16 rounding: the scores
                # need no scaling pass (docs/vpu.md, "The encoder layer on the chip").
                chip.matmul(xb, qkv.weight[:, :H], bias=qkv.bias[:H], out=q)
                chip.matmul(xb, qkv.weight[:, H:2 * H], bias=qkv.bias[H:2 * H], out=kt,
                            then="transpose", scale=1 / math.sqrt(d))
                chip.matmul(xb, qkv.weight[:, 2 * H:], bias=qkv.bias[2 * H:], out=v)
                def masks(b):
                    if b in unmasked and L % chip.config.cols == 0:
                        return dict(bias=None)
                    return dict(mask=bias[b * L:(b + 1) * L]) if per_query else \
                        dict(bias=bias[b:b + 1])
                attention(chip, sequence_heads(q, kt, v, context, probs, B, L, d, masks))
                self.attention.out(context, out=x1, out_bf16=x1b, then="add_layer_norm", other=x,
                                   params=self.ln1, eps=cfg.eps)
                feed_forward(self.ffn.up, self.ffn.down, x1b, hb, out, outb, x1, self.ln2,
                             cfg.eps, kind="gelu")
        finally:
            for t in temps:
                t.free()
        return out, outb, rec.stats


class Encoder:
    """A BERT-style encoder on `chip`: weights uploaded once, at construction.
    `vector_ops`: "host" (layer ops on the host, `hostops`) or "chip" (on the
    chip's vector unit, one program per layer; the chip needs ``vpu=True``)."""

    def __init__(self, chip, weights, vector_ops="host"):
        if vector_ops not in VECTOR_BACKENDS:
            raise ValueError(f"vector_ops must be one of {VECTOR_BACKENDS}, not {vector_ops!r}")
        if vector_ops == "chip" and not chip.config.vpu:
            raise ValueError("vector_ops='chip' needs a chip with the vector unit: "
                             "Chip(ChipConfig(..., vpu=True))")
        self.chip, self.weights, self.config = chip, weights, weights.config
        self.vector_ops = vector_ops
        layer = ChipEncoderLayer if vector_ops == "chip" else EncoderLayer
        self.layers = [layer(chip, self.config, w) for w in weights.layers]
        if vector_ops == "chip":
            w = weights
            from ..runtime.vector import layer_norm_params
            self.emb_ln = layer_norm_params(chip, w.emb_gamma, w.emb_beta)

    @property
    def programs_per_layer(self):
        return self.layers[0].PROGRAMS

    def embeddings(self, ids, positions=None):
        """The (B*L, hidden) input activations of padded token ids (B, L) (host)."""
        w, cfg = self.weights, self.config
        return hostops.layer_norm(hostops.embed(ids, w.word, w.position, w.token_type, positions),
                                  w.emb_gamma, w.emb_beta, cfg.eps).reshape(-1, cfg.hidden)

    def run_layer(self, i, x, mask, progress=None):
        """Layer i on (B*L, hidden) activations: (its output, its `RunStats`)."""
        if self.vector_ops == "chip":
            raise ValueError("run_layer runs the host-ops layer; with vector_ops='chip' a layer "
                             "is one program inside the forward (call the encoder)")
        steps = Steps(self.chip, progress)
        return self.layers[i](x, mask, steps), steps.stats

    def __call__(self, ids, mask, progress=None, positions=None):
        """Token vectors (B, L, hidden) float32 of padded token ids (B, L) and
        their mask -- (B, L) over keys, or (B, L, L) per query for rows of
        packed texts, whose `positions` (B, L) then count from 0 in each
        text -- and the `RunStats` of every program run."""
        B, L = ids.shape
        if self.vector_ops == "chip":
            return self._on_chip(ids, mask, progress, positions)
        x = self.embeddings(ids, positions)
        steps = Steps(self.chip, progress)
        for layer in self.layers:
            x = layer(x, mask, steps)
        return x.reshape(B, L, self.config.hidden), steps.stats

    def _on_chip(self, ids, mask, progress, positions):
        """The embedding lookup on the host, its LayerNorm in the first layer's
        program, every layer one program."""
        from ..runtime.vector import softmax_bias
        chip, cfg, w = self.chip, self.config, self.weights
        B, L = ids.shape
        mask = np.asarray(mask, bool)
        emb = chip.upload(hostops.embed(ids, w.word, w.position, w.token_type, positions)
                          .reshape(B * L, cfg.hidden).astype(np.float32))
        # A (B, L, L) mask is a bias row per query row (`masked_softmax`).
        bias = softmax_bias(chip, mask.reshape(-1, L))
        unmasked = {b for b in range(B) if mask[b].all()}
        x, xb = chip.empty((B * L, cfg.hidden)), chip.empty((B * L, cfg.hidden), bfloat16)
        steps = Steps(chip, progress)

        def embedding_norm():
            chip.vector("layer_norm", emb, out=x, out_bf16=xb, other=self.emb_ln, eps=cfg.eps)

        try:
            for i, layer in enumerate(self.layers):
                out, outb, stats = layer(x, xb, bias, B, L,
                                         before=embedding_norm if i == 0 else None,
                                         unmasked=unmasked, per_query=mask.ndim == 3)
                x.free()
                xb.free()
                x, xb = out, outb
                steps.add(stats)
            return x.numpy().reshape(B, L, cfg.hidden), steps.stats
        finally:
            for t in (emb, bias, x, xb):
                if not t.freed:
                    t.free()
