"""A GGUF file's byte-level BPE tokenizer, built with `tokenizers` from the
file's own vocabulary and merges (docs/llm.md).

llama.cpp names the pre-tokenizer in ``tokenizer.ggml.pre``; each name maps
to the regular expressions llama.cpp splits with before BPE (`PRE_TOKENIZERS`
holds the ones mxu knows). The ids equal llama.cpp's for the same file and
text (tests/data/smollm2_tokens.json was made with llama-cpp-python).
"""

__all__ = ["GgufTokenizer", "PRE_TOKENIZERS"]

# GPT-2's split, as llama.cpp writes it.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# llama.cpp's regular expressions per ``tokenizer.ggml.pre``, applied in turn.
PRE_TOKENIZERS = {
    "gpt2": (_GPT2,),
    "smollm": (r"\p{N}", _GPT2),          # every digit its own token first
    "starcoder": (r"\p{N}", _GPT2),
    "refact": (r"\p{N}", _GPT2),
}
_CONTROL = 3     # llama.cpp's token type of special (control) tokens


class GgufTokenizer:
    """Byte-level BPE of a GGUF file's metadata (`mxu.sim.models.llama.read_gguf`).

    ``encode(text, special=False)`` gives token ids, with ``special=True``
    control tokens written in the text (``<|im_start|>``) become their ids,
    as llama.cpp's ``parse_special``; ``decode(ids)`` gives the text back
    (control tokens are dropped unless ``special=True``). No BOS is added:
    the file says whether to (``tokenizer.ggml.add_bos_token``), see
    `add_bos`.
    """

    def __init__(self, meta):
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

        model = meta.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise ValueError(f"only byte-level BPE ('gpt2') tokenizers are supported, not {model!r}")
        pre = meta.get("tokenizer.ggml.pre", "gpt2")
        if pre not in PRE_TOKENIZERS:
            raise ValueError(f"unknown pre-tokenizer {pre!r}; known: {sorted(PRE_TOKENIZERS)}")
        tokens = list(meta["tokens"])
        self.vocab_size = len(tokens)
        vocab = {tok: i for i, tok in enumerate(tokens)}
        merges = [tuple(m.split(" ", 1)) for m in meta["merges"]]
        tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
        splits = [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in PRE_TOKENIZERS[pre]]
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tk.decoder = decoders.ByteLevel()
        types = list(meta["token_type"])
        self.control = {tokens[i]: i for i, t in enumerate(types) if t == _CONTROL}
        tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in self.control])
        self._special = tk
        # Without parse_special, a control token's text is ordinary text.
        plain = Tokenizer(models.BPE(vocab=vocab, merges=merges))
        plain.pre_tokenizer, plain.decoder = tk.pre_tokenizer, tk.decoder
        self._plain = plain
        self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
        self.bos = int(meta.get("tokenizer.ggml.bos_token_id", -1))
        self.eos = int(meta.get("tokenizer.ggml.eos_token_id", -1))
        self.tokens = tokens
        self.chat_template = meta.get("tokenizer.chat_template")

    def encode(self, text, special=False):
        """Token ids (a list of int) of `text`; a BOS first if the file asks for one."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a string, not {type(text).__name__}")
        ids = (self._special if special else self._plain).encode(text, add_special_tokens=False).ids
        return ([self.bos] if self.add_bos else []) + list(ids)

    def decode(self, ids, special=False):
        """The text of token ids."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary of {self.vocab_size}")
        if not special:
            ids = [i for i in ids if self.tokens[i] not in self.control]
        return self._special.decode(ids, skip_special_tokens=False)

    def apply_chat_template(self, messages, add_generation_prompt=True):
        """The file's chat template (Jinja) rendered for `messages` (a list of
        {"role", "content"} dicts, or one user message as a string)."""
        if self.chat_template is None:
            raise ValueError("the GGUF file has no chat template (tokenizer.chat_template)")
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=self.tokens[self.bos] if self.bos >= 0 else "",
            eos_token=self.tokens[self.eos] if self.eos >= 0 else "")
