"""The Gemma 3 family: its sizes, its weights, the reader of its GGUF file
(``general.architecture = gemma3``) and its forward on the chip (docs/llm.md).

Gemma 3 is a Llama-like decoder with these differences, each a layer op of
its own or an argument of a shared one (`mxu.sim.compiler.layerops`):

- the embeddings are multiplied by sqrt(hidden) (the chip's scaled copy);
- Q and K get an RMSNorm over each head (QK-norm), then RoPE of the NEOX
  type, which turns dims i and i + head_dim/2 of a head, not adjacent pairs
  (``head_rms_norm_rope``); head_dim is its own number (4 x 256 = 1024 for
  a hidden of 640);
- the attention's output and the FFN's are normed before their residual
  add (``norm_add_rms_norm``, which also norms the sum for the next block);
- the FFN is GeGLU, ``gelu_tanh(gate) * up`` (``gelu_tanh_mul``);
- the local layers (``il % 6 < 5``) attend to a sliding window of the last
  `window` positions, with RoPE base 10,000; the global ones to every
  position with the file's ``rope.freq_base``. A local layer's KV cache is
  a ring of `window` positions (`Sequence`); a decode step reads at most
  the window's keys;
- the logits come from the tied token embedding, with no soft cap; the norm
  weights are used as stored (the converter stored 1 + w).

The chip model `ChipGemma3` is `causal_lm.ChipLlama` with the family's
weights and its attention; the golden form is `verif/gemma3.py`.
"""

import math
from dataclasses import dataclass, field

import numpy as np

from mxu.hdl import hostops
from mxu.hdl.dtypes import bfloat16

from ..runtime.vector import rms_norm_params
from .blocks import attention, feed_forward
from .causal_lm import ChipLlama, LayerMatrices
from .llama import DecoderSizes, gguf_decoder_tensors, gguf_field, gguf_meta, gguf_sizes

__all__ = ["Gemma3Config", "Gemma3LayerWeights", "Gemma3Weights", "ChipGemma3", "read_gguf",
           "neox_table", "LOCAL_ROPE_BASE", "SLIDING_PATTERN"]

# llama.cpp's RoPE base of Gemma 3's local layers when the file names none
# (``rope.freq_base_swa``), and its layer pattern: layer il is local when
# ``il % SLIDING_PATTERN < SLIDING_PATTERN - 1``.
LOCAL_ROPE_BASE = 10000.0
SLIDING_PATTERN = 6
# The token that ends a turn of Gemma's chat markup (found by its text).
END_OF_TURN = "<end_of_turn>"


@dataclass(frozen=True)
class Gemma3Config(DecoderSizes):
    """Sizes of a Gemma 3 decoder.

    hidden, ffn : model width and GeGLU width; heads, kv_heads, head_dim :
    query and key/value heads (grouped-query attention) and their width;
    layers; eps : RMSNorm epsilon; rope_theta, rope_theta_local : RoPE bases
    of the global and the local layers; window : the local layers' sliding
    window; local : per layer, whether it is local; vocab; context; bos, eos;
    eot : the end-of-turn token (``<end_of_turn>``, which ends a turn of the
    chat markup: a generation stops at it as at eos), or -1.
    """
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    layers: int
    eps: float
    rope_theta: float
    rope_theta_local: float
    window: int
    local: tuple
    vocab: int
    context: int
    bos: int = 2
    eos: int = 1
    eot: int = -1

    def __post_init__(self):
        self._check_heads()
        if self.head_dim % 2:
            raise ValueError(f"NEOX RoPE turns halves: head_dim ({self.head_dim}) must be even")
        if len(self.local) != self.layers:
            raise ValueError(f"local names {len(self.local)} layers, not {self.layers}")
        if self.window < 1:
            raise ValueError(f"the sliding window must be >= 1, not {self.window}")

    @property
    def stop_ids(self):
        """The tokens that end a generation: eos, and eot if the vocabulary has one."""
        return (self.eos,) if self.eot < 0 else (self.eos, self.eot)

    @property
    def layer_windows(self):
        """Per layer, its sliding window (None: a global layer)."""
        return tuple(self.window if loc else None for loc in self.local)

    def rope_base(self, layer):
        return self.rope_theta_local if self.local[layer] else self.rope_theta

    @staticmethod
    def pattern(layers, period=SLIDING_PATTERN):
        """Which layers are local: ``il % period < period - 1``."""
        return tuple(il % period < period - 1 for il in range(layers))

    @classmethod
    def from_gguf(cls, reader):
        """The sizes in a `gguf.GGUFReader`'s ``gemma3.*`` metadata (the
        local layers' pattern and RoPE base from the file when it has them,
        else llama.cpp's)."""
        get = lambda key: gguf_field(reader, "gemma3." + key)
        has = lambda key: "gemma3." + key in reader.fields
        sizes = gguf_sizes(reader, "gemma3")
        if has("attention.sliding_window_pattern"):
            pattern = get("attention.sliding_window_pattern")
            local = (tuple(bool(p) for p in pattern) if isinstance(pattern, list)
                     else cls.pattern(sizes["layers"], int(pattern)))
        else:
            local = cls.pattern(sizes["layers"])
        head_dim = int(get("attention.key_length")) if has("attention.key_length") \
            else sizes["hidden"] // sizes["heads"]
        if has("attention.value_length") and int(get("attention.value_length")) != head_dim:
            raise ValueError(f"keys of {head_dim} and values of {get('attention.value_length')} "
                             f"per head are not supported")
        if has("final_logit_softcapping"):
            raise ValueError("a logit soft cap (gemma3.final_logit_softcapping) is not supported")
        tokens = gguf_field(reader, "tokenizer.ggml.tokens")
        if "tokenizer.ggml.eot_token_id" in reader.fields:
            eot = int(gguf_field(reader, "tokenizer.ggml.eot_token_id"))
        else:
            eot = tokens.index(END_OF_TURN) if END_OF_TURN in tokens else -1
        return cls(head_dim=head_dim, window=int(get("attention.sliding_window")), local=local,
                   rope_theta_local=float(get("rope.freq_base_swa")) if has("rope.freq_base_swa")
                   else LOCAL_ROPE_BASE, vocab=len(tokens), eot=eot, **sizes)


@dataclass
class Gemma3LayerWeights:
    """One decoder layer, float32, matrices as (in, out)."""
    attn_norm: np.ndarray       # (hidden,)
    wq: np.ndarray              # (hidden, q_dim)
    wk: np.ndarray              # (hidden, kv_dim)
    wv: np.ndarray              # (hidden, kv_dim)
    q_norm: np.ndarray          # (head_dim,)
    k_norm: np.ndarray          # (head_dim,)
    wo: np.ndarray              # (q_dim, hidden)
    post_attn_norm: np.ndarray  # (hidden,)
    ffn_norm: np.ndarray        # (hidden,)
    w_gate: np.ndarray          # (hidden, ffn)
    w_up: np.ndarray            # (hidden, ffn)
    w_down: np.ndarray          # (ffn, hidden)
    post_ffw_norm: np.ndarray   # (hidden,)
    blocks: dict = field(default_factory=dict)   # matrix name ("wq", ...) -> GgufBlocks


@dataclass
class Gemma3Weights:
    """A Gemma 3 decoder, float32: the token embedding (vocab, hidden), also
    the output projection (tied) unless the file has its own, the layers and
    the final norm."""
    config: Gemma3Config
    embed: np.ndarray
    layers: list = field(default_factory=list)
    final_norm: np.ndarray = None
    output: np.ndarray = None
    blocks: dict = field(default_factory=dict)   # "embed" / "output" -> GgufBlocks

    @property
    def unembed(self):
        return self.embed if self.output is None else self.output

    @property
    def unembed_blocks(self):
        """The file's blocks of `unembed`, or None."""
        return self.blocks.get("embed" if self.output is None else "output")

    @classmethod
    def random(cls, config, seed=0):
        """Random weights of the given sizes (for tests), scaled so that
        activations stay of order one."""
        rng = np.random.default_rng(seed)
        c = config
        w = lambda i, o: (rng.standard_normal((i, o)) / math.sqrt(i)).astype(np.float32)
        g = lambda n: (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)
        H, D = c.hidden, c.head_dim
        layers = [Gemma3LayerWeights(g(H), w(H, c.q_dim), w(H, c.kv_dim), w(H, c.kv_dim), g(D),
                                     g(D), w(c.q_dim, H), g(H), g(H), w(H, c.ffn), w(H, c.ffn),
                                     w(c.ffn, H), g(H)) for _ in range(c.layers)]
        embed = (rng.standard_normal((c.vocab, H)) / math.sqrt(H)).astype(np.float32)
        return cls(c, embed, layers, g(H))


def read_gguf(reader):
    """(Gemma3Weights float32, metadata dict) of an open gemma3 GGUF file;
    each quantized matrix also keeps the file's blocks (`GgufBlocks`)."""
    config = Gemma3Config.from_gguf(reader)
    get, matrices, common = gguf_decoder_tensors(reader, config)
    H, D = config.hidden, config.head_dim
    layers = []
    for i, w in enumerate(matrices):
        norm = lambda name, n: get(f"blk.{i}.{name}.weight", (n,))
        layers.append(Gemma3LayerWeights(
            attn_norm=norm("attn_norm", H), q_norm=norm("attn_q_norm", D),
            k_norm=norm("attn_k_norm", D), post_attn_norm=norm("post_attention_norm", H),
            ffn_norm=norm("ffn_norm", H), post_ffw_norm=norm("post_ffw_norm", H), **w))
    return Gemma3Weights(config, layers=layers, **common), gguf_meta(reader)


def neox_table(cos, sin):
    """The rows a NEOX RoPE epilogue reads (`rope_neox`, `head_rms_norm_rope`):
    cos, then sin with each head's first half negated."""
    half = cos.shape[1] // 2
    return np.concatenate([cos, -sin[:, :half], sin[:, half:]], axis=1)


@dataclass
class _LayerWeights(LayerMatrices):
    attn_norm: object
    q_norm: object
    k_norm: object
    post_attn: object     # post_attention_norm and ffn_norm (norm_add_rms_norm)
    post_ffw: object      # post_ffw_norm and the next layer's attn_norm (or the final norm)


def _ring_pieces(row, start, n, cap):
    """Rows row.. of n new positions from `start` as (result row, first slot,
    count) pieces of a cache of `cap` slots holding position p at p % cap."""
    pieces, done = [], 0
    while done < n:
        slot = (start + done) % cap
        count = min(n - done, cap - slot)
        pieces.append((row + done, slot, count))
        done += count
    return pieces


class ChipGemma3(ChipLlama):
    """A Gemma 3 decoder resident on a chip with the vector unit (see the
    module docstring): `ChipLlama`'s steps with Gemma's weights, embedding
    scale, attention and post-norms. Bit-exact to the golden Gemma form
    (`verif/gemma3.py`) with ``rows, lanes = chip.config.rows, cols``. Q and K's
    NEOX rotation moves whole tiles: head_dim must be a multiple of 2 cols;
    a window must be whole tiles."""

    def _prepare(self):
        """Check that Q and K's heads and the window are whole tiles; the RoPE
        bases whose tables a step uploads."""
        c, cols = self.config, self.chip.config.cols
        if c.head_dim % (2 * cols):
            raise ValueError(f"Gemma 3's NEOX RoPE turns whole tiles: head_dim ({c.head_dim}) "
                             f"must be a multiple of 2 * cols ({2 * cols})")
        if any(c.local) and c.window % cols:
            raise ValueError(f"the sliding window ({c.window}) must be a multiple of cols ({cols})")
        self.rope = "neox"
        # The rope tables a step uploads, in this order: one per RoPE base.
        self._bases = sorted({c.rope_base(i) for i in range(c.layers)})

    def _upload_layer(self, w, i, keep):
        """Layer `i`'s weights on the chip: its matrices (`ChipLlama._matrices`)
        and norms, post_ffw_norm paired with the next layer's attn_norm (or
        the final norm)."""
        chip, layers = self.chip, self.weights.layers
        next_norm = layers[i + 1].attn_norm if i + 1 < len(layers) else self.weights.final_norm
        return _LayerWeights(
            *self._matrices(w, i, keep),
            rms_norm_params(chip, w.attn_norm), rms_norm_params(chip, w.q_norm),
            rms_norm_params(chip, w.k_norm), chip.upload(np.stack([w.post_attn_norm, w.ffn_norm])),
            chip.upload(np.stack([w.post_ffw_norm, next_norm])))

    def step(self, seqs, tokens, logits="last", tick=None):
        """`ChipLlama.step`; a step of several tokens that continues a
        sequence past a local layer's window is not supported (its ring
        would have to hold keys the new tokens still need)."""
        c = self.config
        if any(c.local):
            for s, t in zip(seqs, tokens):
                if len(t) > 1 and s.length and s.length + len(t) > c.window:
                    raise ValueError(f"a step of {len(t)} tokens after {s.length} would cross "
                                     f"the sliding window of {c.window}: prefill a sequence "
                                     f"from its start, then decode one token at a time")
        return super().step(seqs, tokens, logits, tick)

    def _embedding_ops(self, x, xn):
        """The embeddings times sqrt(hidden) (in place: the residual stream),
        then the first layer's RMSNorm."""
        self.chip.vector("copy", x, out=x, scale=float(np.float32(math.sqrt(self.config.hidden))))
        super()._embedding_ops(x, xn)

    def _rope_rows(self, positions):
        """One NEOX table (`neox_table`) per RoPE base, head_dim its period."""
        d = self.config.head_dim
        return [neox_table(*hostops.rope_tables(d, base, positions, neox=True))
                for base in self._bases]

    def _masks(self, seqs, counts, upload):
        """Per sequence, {window or None: its mask} for each kind of layer: a
        prefill's causal mask (keys more than a window back masked too), a
        decode step's bias row over the keys it reads (None when they are
        whole tiles)."""
        cols = self.chip.config.cols
        out = []
        for s, n in zip(seqs, counts):
            masks = {}
            for window in set(self.config.layer_windows):
                L = s.length + n
                if n == 1:
                    seen = min(L, window or L)
                    width = -(-seen // cols) * cols
                    masks[window] = None if seen % cols == 0 else upload(
                        np.where(np.arange(width) < seen, 0, -np.inf)[None, :])
                    continue
                width = -(-L // cols) * cols
                keys, query = np.arange(width)[None, :], s.length + np.arange(n)[:, None]
                visible = (keys <= query) & (query - keys < (window or L))
                masks[window] = upload(np.where(visible, 0, -np.inf))
            out.append(masks)
        return out

    def _attention_ops(self, i, lw, xn, q, ctx, seqs, counts, starts, ropes, masks, temp, temps):
        """Layer i's attention program: Q and K through QK-norm and NEOX RoPE
        (the layer's base), K and V into each sequence's cache (a ring on a
        local layer, or for a prompt longer than the ring temporaries, then
        its last window into the ring), the heads' scores and P.V."""
        c, bf = self.config, bfloat16
        window = c.layer_windows[i]
        table = ropes[self._bases.index(c.rope_base(i))]
        qk = dict(then="head_rms_norm_rope", other=table, eps=c.eps)
        lw.q(xn, out=q, params=lw.q_norm, **qk)
        kpieces, vpieces, keys, rings = [], [], [], []
        for r, s, n in zip(starts, seqs, counts):
            cap = s.v[i].shape[0]
            if n > cap:
                kt, v = temp((c.kv_dim, n), bf), temp((n, c.kv_dim), bf)
                temps += [kt, v]
                kpieces.append((r, kt))
                vpieces.append((r, v))
                keys.append((kt, v, n, 0))
                rings.append((r + n - cap, s, s.length + n - cap, cap))
                continue
            for row, slot, count in _ring_pieces(r, s.length, n, cap):
                kpieces.append((row, s.kt[i][:, slot:slot + count]))
                vpieces.append((row, s.v[i][slot:slot + count]))
            L = s.length + n
            keys.append((s.kt[i], s.v[i], min(L, cap), L % cap if n == 1 and L > cap else 0))
        lw.k(xn, out=kpieces, out_dtype=bf, transpose=True, params=lw.k_norm, **qk)
        lw.v(xn, out=vpieces, out_dtype=bf)
        heads = []
        for r, s, n, mask, key in zip(starts, seqs, counts, masks, keys):
            heads += self._heads(i, q, ctx, r, s, n, mask[window], temp, temps, key)
        attention(self.chip, heads, scale=1 / math.sqrt(c.head_dim))
        for r, s, start, cap in rings:
            self._fill_ring(i, lw, xn, table, qk, r, s, start, cap)

    def _block_end_ops(self, i, lw, x, ctx, x2, xn2, h, x_next, xn_next):
        """The output projection, post_attention_norm, the residual and
        ffn_norm (`norm_add_rms_norm`); GeGLU; post_ffw_norm, the residual
        and the next norm."""
        c = self.config
        lw.o(ctx, out=x2, out_bf16=xn2, then="norm_add_rms_norm", other=x,
             params=lw.post_attn, eps=c.eps)
        feed_forward(lw.gu, lw.down, xn2, h, x_next, xn_next, x2, lw.post_ffw, c.eps,
                     kind="geglu")

    def _fill_ring(self, i, lw, xn, table, qk, r, s, start, cap):
        """The K and V of a long prompt's last `cap` positions (rows r.. of
        the step, positions start..) into layer i's ring: the projections
        again on those rows, the same bits as the whole prompt's."""
        bf = bfloat16
        rows = slice(r, r + cap)
        pieces = _ring_pieces(0, start, cap, cap)
        lw.k(xn[rows], out=[(row, s.kt[i][:, slot:slot + n]) for row, slot, n in pieces],
             out_dtype=bf, transpose=True, params=lw.k_norm, **dict(qk, other=table[rows]))
        lw.v(xn[rows], out=[(row, s.v[i][slot:slot + n]) for row, slot, n in pieces],
             out_dtype=bf)


# `CausalLM` runs a family's weights on the chip model they name.
Gemma3Weights.chip_model = ChipGemma3
