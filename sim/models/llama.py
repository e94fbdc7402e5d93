"""The Llama architecture: its sizes, its weights, its rotary tables, and the
reader of a GGUF file (docs/llm.md).

Every architecture number comes from the file: `LlamaConfig.from_gguf` reads
the ``llama.*`` metadata. The weights are dequantized once to float32 (the
accuracy reference) with `gguf`'s own dequantizer; the chip gets them rounded
to bf16 when they are uploaded. Matrices are kept as (in, out), the orientation
of ``x @ W``.

The Q and K rows of a llama.cpp GGUF are permuted for llama.cpp's "normal"
rope, which rotates adjacent pairs (2i, 2i+1) of each head: `rope_tables`
builds the tables of that form, and no permutation is undone here.
"""

import math
from dataclasses import dataclass, field

import numpy as np

from mxu.hdl import hostops

__all__ = ["LlamaConfig", "GgufBlocks", "LlamaLayerWeights", "LlamaWeights", "rope_tables",
           "model_macs", "read_gguf", "kv_bytes", "roofline_cycles", "gguf_tensors", "gguf_blocks",
           "gguf_meta", "gguf_field", "gguf_sizes", "gguf_decoder_tensors", "DecoderSizes"]


class DecoderSizes:
    """What every family's config derives from its sizes alike (a mixin of
    the frozen configs: `LlamaConfig`, `gemma3.Gemma3Config`)."""

    def _check_heads(self):
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")

    @property
    def group(self):
        """Query heads per KV head."""
        return self.heads // self.kv_heads

    @property
    def kv_dim(self):
        return self.kv_heads * self.head_dim

    @property
    def q_dim(self):
        """Width of Q (and of the attention's output): every head's."""
        return self.heads * self.head_dim

    @property
    def stop_ids(self):
        """The tokens that end a generation: eos."""
        return (self.eos,)


def gguf_sizes(reader, arch):
    """The sizes every family's ``<arch>.*`` metadata names alike (hidden,
    heads, kv_heads, ffn, layers, eps, rope_theta, context) and the BOS and
    EOS ids, as a config's keyword arguments."""
    get = lambda key: gguf_field(reader, f"{arch}.{key}")
    return dict(hidden=int(get("embedding_length")), heads=int(get("attention.head_count")),
                kv_heads=int(get("attention.head_count_kv")), ffn=int(get("feed_forward_length")),
                layers=int(get("block_count")), eps=float(get("attention.layer_norm_rms_epsilon")),
                rope_theta=float(get("rope.freq_base")), context=int(get("context_length")),
                bos=int(gguf_field(reader, "tokenizer.ggml.bos_token_id")),
                eos=int(gguf_field(reader, "tokenizer.ggml.eos_token_id")))


@dataclass(frozen=True)
class LlamaConfig(DecoderSizes):
    """Sizes of a Llama decoder.

    hidden, ffn : model width and SwiGLU width; heads, kv_heads : query and
    key/value heads (grouped-query attention: each KV head serves
    ``heads // kv_heads`` query heads); head_dim : per head; layers; eps :
    RMSNorm epsilon; rope_theta : RoPE frequency base; vocab; context : the
    longest sequence the model was trained for; bos, eos : token ids.
    """
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    layers: int
    eps: float
    rope_theta: float
    vocab: int
    context: int
    bos: int = 1
    eos: int = 2

    def __post_init__(self):
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        self._check_heads()
        if self.head_dim % 2:
            raise ValueError(f"RoPE rotates pairs: head_dim ({self.head_dim}) must be even")

    @property
    def head_dim(self):
        return self.hidden // self.heads

    @property
    def layer_windows(self):
        """Per layer, the sliding window of its attention (None: it sees every
        position; a Llama has no window)."""
        return (None,) * self.layers

    @classmethod
    def from_gguf(cls, reader):
        """The sizes in a `gguf.GGUFReader`'s ``llama.*`` metadata."""
        get = lambda key: gguf_field(reader, key)
        arch = get("general.architecture")
        if arch != "llama":
            raise ValueError(f"the GGUF file holds a {arch!r} model, not 'llama'")
        sizes = gguf_sizes(reader, "llama")
        head_dim = sizes["hidden"] // sizes["heads"]
        rope_dims = int(get("llama.rope.dimension_count"))
        if rope_dims != head_dim:
            raise ValueError(f"RoPE over {rope_dims} of {head_dim} head dimensions is not supported")
        return cls(vocab=int(get("llama.vocab_size")), **sizes)


@dataclass(frozen=True)
class GgufBlocks:
    """A matrix as the GGUF file holds it: its raw blocks (`data`, uint8),
    their type (`qtype`, a ``gguf.GGMLQuantizationType`` name such as
    "Q4_1") and its `shape` (N rows of K, the file's order: (out, in)). The
    float32 matrix beside it is ``gguf.quants.dequantize`` of these bytes;
    a chip may keep the blocks themselves (`Chip.upload_quantized`)."""
    data: np.ndarray
    qtype: str
    shape: tuple


@dataclass
class LlamaLayerWeights:
    """One decoder layer, float32, matrices as (in, out)."""
    attn_norm: np.ndarray     # (hidden,)
    wq: np.ndarray            # (hidden, hidden)
    wk: np.ndarray            # (hidden, kv_dim)
    wv: np.ndarray            # (hidden, kv_dim)
    wo: np.ndarray            # (hidden, hidden)
    ffn_norm: np.ndarray      # (hidden,)
    w_gate: np.ndarray        # (hidden, ffn)
    w_up: np.ndarray          # (hidden, ffn)
    w_down: np.ndarray        # (ffn, hidden)
    blocks: dict = field(default_factory=dict)   # matrix name ("wq", ...) -> GgufBlocks


@dataclass
class LlamaWeights:
    """A Llama decoder, float32: the token embedding (vocab, hidden), also the
    output projection when the model ties them (``output`` None), the layers
    and the final norm."""
    config: LlamaConfig
    embed: np.ndarray
    layers: list = field(default_factory=list)
    final_norm: np.ndarray = None
    output: np.ndarray = None      # (vocab, hidden) when not tied
    blocks: dict = field(default_factory=dict)   # "embed" / "output" -> GgufBlocks

    @property
    def unembed(self):
        """(vocab, hidden): the rows whose dot products with the final hidden
        state are the logits."""
        return self.embed if self.output is None else self.output

    @property
    def unembed_blocks(self):
        """The file's blocks of `unembed`, or None."""
        return self.blocks.get("embed" if self.output is None else "output")

    @classmethod
    def random(cls, config, seed=0):
        """Random weights of the given sizes (for tests): scaled so that
        activations stay of order one through the layers."""
        rng = np.random.default_rng(seed)
        H, F, KV = config.hidden, config.ffn, config.kv_dim
        w = lambda i, o: (rng.standard_normal((i, o)) / math.sqrt(i)).astype(np.float32)
        g = lambda n: (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)
        layers = [LlamaLayerWeights(g(H), w(H, H), w(H, KV), w(H, KV), w(H, H), g(H),
                                    w(H, F), w(H, F), w(F, H)) for _ in range(config.layers)]
        embed = rng.standard_normal((config.vocab, H)).astype(np.float32)
        return cls(config, embed, layers, g(H))


def rope_tables(config, positions):
    """(cos, sin) of `config`'s rotary embedding at `positions`
    (`mxu.hdl.hostops.rope_tables`)."""
    return hostops.rope_tables(config.head_dim, config.rope_theta, positions)


def model_macs(config, new_tokens, contexts, logits_rows=None):
    """The model's own multiply-adds for a step in which sequence s adds
    ``new_tokens[s]`` tokens to a context that then holds ``contexts[s]``
    positions: the projections and the FFN of every new token, the scores and
    P.V of every (new token, head) over the positions it may see (causal),
    and the logits of `logits_rows` rows (default: one per sequence)."""
    c = config
    per_token = c.hidden * (2 * c.q_dim + 2 * c.kv_dim) + 3 * c.hidden * c.ffn
    attention = 0
    for window in c.layer_windows:
        for n, L in zip(new_tokens, contexts):
            # keys visible to each new token (at most the layer's window)
            seen = sum(min(L - n + 1 + t, window or L) for t in range(n))
            attention += 2 * c.heads * c.head_dim * seen
    rows = len(new_tokens) if logits_rows is None else logits_rows
    return c.layers * sum(new_tokens) * per_token + attention + rows * c.hidden * c.vocab


def kv_bytes(config, contexts):
    """Bytes of the KV caches a step reads: for a sequence of ``contexts[s]``
    positions, each layer's K and V rows of ``kv_dim`` bf16 values (at most
    its window's)."""
    bf16 = 2
    return sum(2 * min(L, w or L) * config.kv_dim * bf16
               for L in contexts for w in config.layer_windows)


def roofline_cycles(macs, nbytes, chip):
    """The fewest cycles a step can take on the chip configuration `chip`:
    max(bytes moved / bus bytes per cycle, MACs / PEs) (docs/llm.md)."""
    return max(nbytes / chip.axi_data_bytes, macs / (chip.rows * chip.cols))


def gguf_field(reader, key):
    """The value of metadata `key` (ValueError naming it when the file has none)."""
    field = reader.fields.get(key)
    if field is None:
        raise ValueError(f"the GGUF file has no {key!r}")
    return field.contents()


def read_gguf(path):
    """(LlamaWeights float32, metadata dict) of a llama GGUF file (a path or
    an open `gguf.GGUFReader`). Quantized tensors are dequantized with
    `gguf.quants.dequantize` (Q4_1, Q8_0, ...)."""
    import gguf

    reader = path if isinstance(path, gguf.GGUFReader) else gguf.GGUFReader(str(path))
    config = LlamaConfig.from_gguf(reader)
    get, matrices, common = gguf_decoder_tensors(reader, config)
    H = config.hidden
    layers = [LlamaLayerWeights(get(f"blk.{i}.attn_norm.weight", (H,)),
                                ffn_norm=get(f"blk.{i}.ffn_norm.weight", (H,)), **w)
              for i, w in enumerate(matrices)]
    return LlamaWeights(config, layers=layers, **common), gguf_meta(reader)


def gguf_decoder_tensors(reader, config):
    """What every family reads alike from an open GGUF file of `config`'s
    sizes: (`get` of `gguf_tensors`, per layer the keyword arguments of its
    seven matrices -- "wq" ... "w_down" float32 (in, out), and "blocks", the
    `GgufBlocks` of the quantized ones --, the keyword arguments of the
    weights' embedding, final norm, untied output (or None) and their
    blocks)."""
    get, linear, tensors = gguf_tensors(reader)
    blocks = gguf_blocks(tensors)
    H, F, Q, KV, V = config.hidden, config.ffn, config.q_dim, config.kv_dim, config.vocab
    shapes = {"wq": ("attn_q", H, Q), "wk": ("attn_k", H, KV), "wv": ("attn_v", H, KV),
              "wo": ("attn_output", Q, H), "w_gate": ("ffn_gate", H, F),
              "w_up": ("ffn_up", H, F), "w_down": ("ffn_down", F, H)}
    layers = []
    for i in range(config.layers):
        p = f"blk.{i}."
        w = {key: linear(f"{p}{name}.weight", n_in, n_out)
             for key, (name, n_in, n_out) in shapes.items()}
        found = {key: blocks(f"{p}{name}.weight", (n_out, n_in))
                 for key, (name, n_in, n_out) in shapes.items()}
        layers.append(dict(w, blocks={k: b for k, b in found.items() if b}))
    embed = get("token_embd.weight", (V, H))
    output = get("output.weight", (V, H)) if "output.weight" in tensors else None
    found = {"embed": blocks("token_embd.weight", (V, H)),
             "output": output is not None and blocks("output.weight", (V, H))}
    return get, layers, dict(embed=embed, final_norm=get("output_norm.weight", (H,)),
                             output=output, blocks={k: b for k, b in found.items() if b})


def gguf_blocks(tensors):
    """``blocks(name, shape)``: the file's blocks of quantized matrix `name`
    of `tensors` ({name: gguf tensor}) as `GgufBlocks`, or None for a float
    (F32, F16, BF16) one."""
    import gguf

    plain = {gguf.GGMLQuantizationType[n] for n in ("F32", "F16", "BF16")}

    def blocks(name, shape):
        t = tensors[name]
        if t.tensor_type in plain:
            return None
        return GgufBlocks(np.asarray(t.data).view(np.uint8).reshape(-1), t.tensor_type.name,
                          shape)
    return blocks


def gguf_tensors(reader):
    """(get, linear, tensors) of a `gguf.GGUFReader`: ``get(name, shape)`` a
    tensor dequantized to float32 (with `gguf.quants.dequantize`: Q4_1, Q8_0,
    Q4_K, ...) and checked against `shape`; ``linear(name, in, out)`` a
    linear layer's matrix as (in, out) (gguf stores (out, in)); tensors
    {name: tensor}."""
    from gguf.quants import dequantize

    tensors = {t.name: t for t in reader.tensors}

    def get(name, shape):
        t = tensors.get(name)
        if t is None:
            raise ValueError(f"the GGUF file has no tensor {name!r}")
        x = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        if x.shape != shape:
            raise ValueError(f"{name} has shape {x.shape}, expected {shape}")
        return x

    linear = lambda name, i, o: np.ascontiguousarray(get(name, (o, i)).T)
    return get, linear, tensors


def gguf_meta(reader):
    """The ``general.*`` and ``tokenizer.*`` metadata of a GGUF file, with
    the vocabulary as "tokens" and, where the file has them, "merges",
    "token_type" and "scores"."""
    meta = {key: gguf_field(reader, key) for key in reader.fields
            if key.startswith(("general.", "tokenizer.")) and not key.startswith(
                ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                 "tokenizer.ggml.scores"))}
    meta["tokens"] = gguf_field(reader, "tokenizer.ggml.tokens")
    for name in ("merges", "token_type", "scores"):
        if f"tokenizer.ggml.{name}" in reader.fields:
            meta[name] = gguf_field(reader, f"tokenizer.ggml.{name}")
    return meta
