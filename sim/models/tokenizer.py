"""A GGUF file's tokenizer, as llama.cpp runs it (docs/llm.md, "Tokenizers").

``tokenizer.ggml.model`` picks the algorithm (`TOKENIZER_MODELS`):

- ``gpt2``: byte-level BPE, built with `tokenizers` from the file's
  vocabulary and merges. llama.cpp names the pre-tokenizer in
  ``tokenizer.ggml.pre``; each name maps to the regular expressions llama.cpp
  splits with before BPE (`PRE_TOKENIZERS` holds the ones mxu knows).
- ``llama``: SentencePiece, llama.cpp's ``llm_tokenizer_spm``: spaces become
  "▁", then the adjacent pair whose merged text is a token of the highest
  score merges first, until no pair is a token; a character that is no token
  falls back to its UTF-8 bytes (``<0xXX>``).

Both share llama.cpp's handling of the special tokens (control and
user-defined ones are cut out of the text first, longest first), the BOS,
the detokenizer and the chat template. The ids equal llama.cpp's for the
same file and text: tests/data/smollm2_tokens.json and gemma3_tokens.json
were made with llama-cpp-python (tests/data/make_gguf_tokens.py).
"""

import heapq

__all__ = ["GgufTokenizer", "TOKENIZER_MODELS", "PRE_TOKENIZERS", "tokenizer_metadata"]

# GPT-2's split, as llama.cpp writes it.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# llama.cpp's regular expressions per ``tokenizer.ggml.pre``, applied in turn.
PRE_TOKENIZERS = {
    "gpt2": (_GPT2,),
    "smollm": (r"\p{N}", _GPT2),          # every digit its own token first
    "starcoder": (r"\p{N}", _GPT2),
    "refact": (r"\p{N}", _GPT2),
}

# llama.cpp's token types (``tokenizer.ggml.token_type``).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
# Tokens llama.cpp makes control tokens by their text whatever their type
# (end of generation, end of turn, fill-in-the-middle: llama-vocab.cpp,
# ``load``; of the fill-in-the-middle ones llama.cpp marks one of each kind,
# mxu every one). Gemma 3's "</s>" (an HTML tag, user-defined) is one:
# llama.cpp neither cuts it out of plain text nor prints it.
_CONTROL_BY_TEXT = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>", "\u2581<PRE>", "<|code_prefix|>",
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>", "\u2581<SUF>", "<|code_suffix|>",
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>", "\u2581<MID>", "<|code_middle|>",
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", "<|fim_repo|>", "<|repo_name|>",
    "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>"))
_SPACE = "\u2581"      # SentencePiece's "▁"


def tokenizer_metadata(fields):
    """The ``general.*`` and ``tokenizer.*`` metadata of a GGUF file, what
    `GgufTokenizer` takes, from its key-value pairs (a dict, as
    `gguf_file.read_metadata` gives, or an open `gguf_file.GgufFile` or
    `gguf.GGUFReader`): the vocabulary's arrays under short keys ("tokens",
    "token_type", and "merges" and "scores" when the file has them)."""
    if hasattr(fields, "fields"):                       # an open file
        fields = {key: field.contents() for key, field in fields.fields.items()}
    arrays = {"tokenizer.ggml.tokens": "tokens", "tokenizer.ggml.token_type": "token_type",
              "tokenizer.ggml.merges": "merges", "tokenizer.ggml.scores": "scores"}
    meta = {arrays.get(key, key): value for key, value in fields.items()
            if key.startswith(("general.", "tokenizer."))}
    if "tokens" not in meta:
        raise ValueError("the GGUF file has no 'tokenizer.ggml.tokens'")
    return meta


class GgufTokenizer:
    """The tokenizer of a GGUF file's metadata (`tokenizer_metadata`), of the
    class its ``tokenizer.ggml.model`` names in `TOKENIZER_MODELS`.

    ``encode(text, special=False)`` gives token ids as llama.cpp's
    ``tokenize(text, add_special=True, parse_special=special)``: a BOS first
    if the file asks for one (`add_bos`); with ``special=True`` control
    tokens written in the text (``<|im_start|>``, ``<start_of_turn>``) become
    their ids. ``decode(ids, special=False)`` gives the text back, control
    tokens dropped unless ``special=True``. ``apply_chat_template`` renders
    the file's chat template.
    """
    model = None           # the tokenizer.ggml.model a subclass implements
    add_bos_default = False
    add_space_prefix_default = False

    def __new__(cls, meta):
        if cls is GgufTokenizer:
            model = meta.get("tokenizer.ggml.model")
            if model not in TOKENIZER_MODELS:
                raise ValueError(f"unsupported tokenizer {model!r} (tokenizer.ggml.model); "
                                 f"supported: {sorted(TOKENIZER_MODELS)}")
            cls = TOKENIZER_MODELS[model]
        return super().__new__(cls)

    def __init__(self, meta):
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(meta["tokens"])]
        self.tokens, self.vocab_size = tokens, len(tokens)
        self._ids = {t: i for i, t in enumerate(tokens)}
        if len(self._ids) != len(tokens):
            raise ValueError("the GGUF vocabulary has a duplicate token")
        types = list(meta.get("token_type", [NORMAL] * len(tokens)))
        self.types = [CONTROL if t in _CONTROL_BY_TEXT else k for t, k in zip(tokens, types)]
        self.control = {tokens[i]: i for i, k in enumerate(self.types) if k == CONTROL}
        # Cut out of the text before the model's algorithm: longest first;
        # control and unknown tokens only when parsing special tokens.
        self._special = sorted(((tokens[i], i, k != USER_DEFINED)
                                for i, k in enumerate(self.types)
                                if k in (CONTROL, USER_DEFINED, UNKNOWN)),
                               key=lambda s: -len(s[0].encode()))
        self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", self.add_bos_default))
        self.add_space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix",
                                              self.add_space_prefix_default))
        self.bos = int(meta.get("tokenizer.ggml.bos_token_id", -1))
        self.eos = int(meta.get("tokenizer.ggml.eos_token_id", -1))
        if self.add_bos and not 0 <= self.bos < self.vocab_size:
            raise ValueError("the GGUF file asks for a BOS token but names none in its vocabulary")
        self.chat_template = meta.get("tokenizer.chat_template")

    # ---- encoding ------------------------------------------------------------------
    def _partition(self, text, special):
        """`text` cut into raw strings and the ids of the special tokens in it,
        as llama.cpp's ``tokenizer_st_partition``."""
        parts = [text] if text else []
        for piece, tid, needs_special in self._special:
            if needs_special and not special:
                continue
            cut = []
            for part in parts:
                if isinstance(part, str) and piece in part:
                    for k, raw in enumerate(part.split(piece)):
                        if k:
                            cut.append(tid)
                        if raw:
                            cut.append(raw)
                else:
                    cut.append(part)
            parts = cut
        return parts

    def encode(self, text, special=False):
        """Token ids (a list of int) of `text`; a BOS first if the file asks for one."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a string, not {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ValueError(f"the text is not valid Unicode at character {error.start}") from None
        ids = [self.bos] if self.add_bos else []
        self._encode_parts(self._partition(text, special), ids)
        return ids

    def _encode_parts(self, parts, out):
        raise NotImplementedError

    # ---- decoding ------------------------------------------------------------------
    def _piece(self, tid):
        """The bytes of a normal token."""
        raise NotImplementedError

    def _token_bytes(self, tid, special):
        kind = self.types[tid]
        if kind in (CONTROL, UNKNOWN):
            return self.tokens[tid].encode() if special else b""
        if kind == USER_DEFINED:
            return self.tokens[tid].encode()
        if kind == NORMAL:
            return self._piece(tid)
        if kind == BYTE:
            return bytes([int(self.tokens[tid][3:5], 16)])
        return b""             # unused and undefined tokens print nothing

    def decode(self, ids, special=False):
        """The text of token ids, as llama.cpp's ``llama_detokenize`` (without
        remove_special, as its ``common_detokenize``): the first token's
        leading space stripped if the encoder puts one in front of the text
        (`add_space_prefix`); bytes that are no UTF-8 become U+FFFD."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary of {self.vocab_size}")
        pieces = [self._token_bytes(i, special) for i in ids]
        if self.add_space_prefix and pieces and pieces[0].startswith(b" "):
            pieces[0] = pieces[0][1:]
        return b"".join(pieces).decode("utf-8", errors="replace")

    # ---- chat ------------------------------------------------------------------------
    def apply_chat_template(self, messages, add_generation_prompt=True):
        """The file's chat template (Jinja) rendered for `messages` (a list of
        {"role", "content"} dicts, or one user message as a string)."""
        if self.chat_template is None:
            raise ValueError("the GGUF file has no chat template (tokenizer.chat_template): "
                             "give the prompt as plain text")
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]

        def raise_exception(message):
            raise ValueError(f"the chat template refuses the messages: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=self.tokens[self.bos] if self.bos >= 0 else "",
            eos_token=self.tokens[self.eos] if self.eos >= 0 else "")


def _gpt2_bytes():
    """GPT-2's map of the 256 bytes to printable characters, inverted."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class BpeTokenizer(GgufTokenizer):
    """Byte-level BPE (``tokenizer.ggml.model = gpt2``) of a GGUF file."""
    model = "gpt2"

    def __init__(self, meta):
        from tokenizers import Regex, Tokenizer, models, pre_tokenizers

        super().__init__(meta)
        pre = meta.get("tokenizer.ggml.pre", "gpt2")
        if pre not in PRE_TOKENIZERS:
            raise ValueError(f"unknown pre-tokenizer {pre!r}; known: {sorted(PRE_TOKENIZERS)}")
        if "merges" not in meta:
            raise ValueError("the GGUF file has no 'tokenizer.ggml.merges' for its BPE tokenizer")
        merges = [tuple(m.split(" ", 1)) for m in meta["merges"]]
        bpe = Tokenizer(models.BPE(vocab=self._ids, merges=merges))
        splits = [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in PRE_TOKENIZERS[pre]]
        bpe.pre_tokenizer = pre_tokenizers.Sequence(
            splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        self._bpe = bpe
        self._bytes = _gpt2_bytes()

    def _encode_parts(self, parts, out):
        for part in parts:
            if isinstance(part, int):
                out.append(part)
            else:
                out.extend(self._bpe.encode(part, add_special_tokens=False).ids)

    def _piece(self, tid):
        text = self.tokens[tid]
        if all(c in self._bytes for c in text):
            return bytes(self._bytes[c] for c in text)
        # llama.cpp's llama_decode_text marks a character outside the byte map.
        return b"".join(bytes([self._bytes[c]]) if c in self._bytes else
                        b"[UNK_BYTE_0x" + c.encode().hex().encode() + text.encode() + b"]"
                        for c in text)


class SpmTokenizer(GgufTokenizer):
    """SentencePiece (``tokenizer.ggml.model = llama``) of a GGUF file, as
    llama.cpp's ``llm_tokenizer_spm``: merges by the ``tokenizer.ggml.scores``
    of the merged pieces, byte fallback for characters that are no token."""
    model = "llama"
    add_bos_default = True
    add_space_prefix_default = True

    def __init__(self, meta):
        super().__init__(meta)
        scores = meta.get("scores")
        self.scores = [float(s) for s in scores] if scores is not None else [0.0] * self.vocab_size
        if len(self.scores) < self.vocab_size:
            raise ValueError(f"the GGUF file has {len(self.scores)} token scores for "
                             f"{self.vocab_size} tokens")

    def _encode_parts(self, parts, out):
        prev_special = True
        for part in parts:
            if isinstance(part, int):
                out.append(part)
                prev_special = True
            else:
                text = (" " if self.add_space_prefix and prev_special else "") + part
                self._spm(text.replace(" ", _SPACE), out)
                prev_special = False

    def _spm(self, text, out):
        """llm_tokenizer_spm_session.tokenize: symbols are characters in a
        linked list; the queue holds the adjacent pairs that are tokens, the
        highest score first (then the leftmost)."""
        n = len(text)
        if not n:
            return
        start, size = list(range(n)), [1] * n
        prev, nxt = list(range(-1, n - 1)), list(range(1, n)) + [-1]
        queue, merged_from = [], {}

        def pair(left, right):
            if left < 0 or right < 0:
                return
            piece = text[start[left]:start[left] + size[left] + size[right]]
            tid = self._ids.get(piece)
            if tid is not None:
                heapq.heappush(queue, (-self.scores[tid], left, right, len(piece)))
                merged_from[piece] = (left, right)

        for i in range(1, n):
            pair(i - 1, i)
        while queue:
            _, left, right, length = heapq.heappop(queue)
            if not size[left] or not size[right] or size[left] + size[right] != length:
                continue        # one side merged since: a stale pair
            size[left] += size[right]
            size[right] = 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            pair(prev[left], left)
            pair(left, nxt[left])

        def emit(i):
            piece = text[start[i]:start[i] + size[i]]
            tid = self._ids.get(piece)
            if tid is not None:
                out.append(tid)
            elif piece in merged_from:
                emit(merged_from[piece][0])
                emit(merged_from[piece][1])
            else:
                out.extend(self._byte_token(b) for b in piece.encode())

        i = 0
        while i != -1:
            emit(i)
            i = nxt[i]

    def _byte_token(self, byte):
        tid = self._ids.get(f"<0x{byte:02X}>")
        if tid is None:
            tid = self._ids.get(chr(byte)) if byte < 0x80 else None
        if tid is None:
            raise ValueError(f"the vocabulary has no token for byte 0x{byte:02X} (byte fallback)")
        return tid

    def _piece(self, tid):
        return self.tokens[tid].replace(_SPACE, " ").encode()


TOKENIZER_MODELS = {cls.model: cls for cls in (BpeTokenizer, SpmTokenizer)}
