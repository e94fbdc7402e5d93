"""The blocks every model on the chip is built from (docs/llm.md,
docs/transformer.md): resident linear layers, attention over heads (a
padding or causal mask, grouped-query heads, the scaling), and the
feed-forward with its residual norm. MiniLM (`encoder.py`) and the Llama
decoders (`causal_lm.py`) record their layers with these.

Every block records matmuls with their layer ops fused (``then=``) into the
chip's current recording; the lowering (fused or not, K split, hand-offs in
VMEM) is the compiler's.
"""

from dataclasses import dataclass

import numpy as np

from mxu.hdl.dtypes import bfloat16

from ..runtime.stats import RunStats

__all__ = ["OwnsChip", "Linear", "Steps", "Head", "sequence_heads", "attention", "feed_forward"]


class OwnsChip:
    """Lifetime of a model that makes its own chip when given none
    (`CausalLM`, `SentenceEncoder`): ``close()`` closes that chip (an
    ``llm`` chip's 1 GiB of external memory goes at once); a chip or pod
    passed in stays open, its owner's to close. Idempotent; ``with
    Model(...) as model:`` closes at the end of the block. The model sets
    ``self.chip`` and ``self._owns_chip``."""

    def close(self):
        if self._owns_chip:
            self.chip.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class Linear:
    """``x @ W + b`` on the chip; W (in, out) bf16, or GGUF blocks
    (`from_blocks`), and b fp32 (optional) stay resident."""

    def __init__(self, chip, weight, bias=None):
        self.chip = chip
        self.weight = chip.upload(np.asarray(weight, np.float32), dtype=bfloat16)
        self.bias = chip.upload(np.asarray(bias, np.float32)) if bias is not None else None

    @classmethod
    def from_blocks(cls, chip, blocks, name, bias=None):
        """W kept as a GGUF file's blocks (`GgufBlocks`: N rows of K), expanded
        on the chip (`Chip.upload_quantized`); the same results as W =
        ``bf16(dequantize(blocks)).T``."""
        layer = cls.__new__(cls)
        layer.chip = chip
        layer.weight = chip.upload_quantized(blocks.data, blocks.qtype, blocks.shape, name=name)
        layer.bias = chip.upload(np.asarray(bias, np.float32)) if bias is not None else None
        return layer

    def __call__(self, x, out_dtype=np.float32, out=None, **then):
        """`x`: a bf16 device tensor (rows, in); returns a device tensor (or
        what `out` names). `then`: a fused layer op and its operands."""
        return self.chip.matmul(x, self.weight, bias=self.bias, out_dtype=out_dtype, out=out,
                                keep=True, **then)


class Steps:
    """Collects the `RunStats` of each program of a forward and reports progress."""

    def __init__(self, chip, progress=None):
        self.chip, self.progress, self.stats = chip, progress, None

    def add(self, stats=None):
        stats = stats or self.chip.last_stats
        if self.stats is None:
            self.stats = RunStats(rows=stats.rows, cols=stats.cols)
        self.stats += stats
        if self.progress is not None:
            self.progress()


@dataclass
class Head:
    """One attention problem: queries `q` (rows, d) bf16 -- one head's rows,
    or a KV group's heads stacked as rows -- against keys `kt` (d, L) bf16
    and values `v` (L, d) bf16, into `out` (rows, d) bf16. `bias`: one
    softmax bias row (`softmax_bias`), or None for no mask; `mask`: a bias
    row per query row (a causal mask), which takes its place. `ring`: the
    keys are a ring (a sliding window's cache) whose oldest is at column
    `ring`: P.V sums the keys in position order, columns ring.. first into
    `older` (rows, d) fp32, then columns ..ring seeded with those sums."""
    q: object
    kt: object
    v: object
    out: object
    probs: object
    bias: object = None
    mask: object = None
    ring: int = 0
    older: object = None


def sequence_heads(q, kt, v, context, probs, B, L, d, masks):
    """The `Head`s of B sequences of L tokens, each with ``q.shape[1] // d``
    heads of width d: Q, V and the context (B*L, heads*d), K^T (heads*d,
    B*L), the probabilities (B*heads*L, L); ``masks(b)``: the keywords
    (``bias=`` or ``mask=``) of sequence b's heads."""
    count, heads = q.shape[1] // d, []
    for b in range(B):
        keys = masks(b)
        t = slice(b * L, (b + 1) * L)
        for h in range(count):
            c = slice(h * d, (h + 1) * d)
            rows = slice((b * count + h) * L, (b * count + h + 1) * L)
            heads.append(Head(q[t, c], kt[c, t], v[t, c], context[t, c], probs[rows], **keys))
    return heads


def attention(chip, heads, scale=1.0):
    """The scores of every head with their softmax fused, then every P.V:
    ``out = softmax(q @ kt * scale + mask) @ v``. Two runs of like ops, so
    each is one segment of the program and the next head's loads overlap
    this one's compute; the probabilities (`Head.probs`, transient bf16)
    stay in VMEM when the compiler can keep them there. A ring's P.V is two
    matmuls (`Head.ring`)."""
    for h in heads:
        if h.mask is not None:
            chip.matmul(h.q, h.kt, out=h.probs, then="masked_softmax", other=h.mask, scale=scale)
        else:
            chip.matmul(h.q, h.kt, out=h.probs, then="softmax", other=h.bias, scale=scale)
    for h in heads:
        if not h.ring:
            chip.matmul(h.probs, h.v, out=h.out)
            continue
        chip.matmul(h.probs[:, h.ring:], h.v[h.ring:], out=h.older)
        chip.matmul(h.probs[:, :h.ring], h.v[:h.ring], bias=h.older, out=h.out)


# The feed-forwards: kind -> (the up projection's layer op, the down's).
FEED_FORWARDS = {"gelu": ("gelu", "add_layer_norm"), "swiglu": ("silu_mul", "add_rms_norm"),
                 "geglu": ("gelu_tanh_mul", "norm_add_rms_norm")}


def feed_forward(up, down, x, hidden, out, out_bf16, residual, params, eps, kind="gelu"):
    """The feed-forward and its residual norm: ``h = act(x @ up)``, then
    ``norm(residual + h @ down)``. `kind` "gelu" (``up`` is W1 with its bias;
    a post-norm layer: `out` gets the LayerNorm and `out_bf16` its bf16
    copy), "swiglu" (``up`` is the gate and up projections with their N
    tiles alternating, `silu_mul`; a pre-norm layer: `out` gets the residual
    sum and `out_bf16` its RMSNorm, the next layer's input) or "geglu"
    (Gemma 3: likewise with `gelu_tanh_mul`, and the down projection's
    output normed before the residual add, `norm_add_rms_norm`: `params`
    that post-norm's gamma and the next norm's)."""
    if kind not in FEED_FORWARDS:
        raise ValueError(f"kind must be one of {sorted(FEED_FORWARDS)}, not {kind!r}")
    act, norm = FEED_FORWARDS[kind]
    up(x, out=hidden, then=act)
    down(hidden, out=out, out_bf16=out_bf16, then=norm, other=residual, params=params, eps=eps)
