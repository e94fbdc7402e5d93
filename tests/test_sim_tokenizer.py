"""A GGUF file's tokenizer (docs/llm.md, "Tokenizers"), chosen by its
``tokenizer.ggml.model``: Gemma 3's SentencePiece vocabulary against
llama.cpp's ids and detokenized text (tests/data/gemma3_tokens.json, made by
tests/data/make_gguf_tokens.py), the SentencePiece merge order and byte
fallback on a tiny vocabulary, llama.cpp's special-token rules, bad input.
(SmolLM2's byte-level BPE against llama.cpp: tests/test_sim_llm.py.)"""

import json
from pathlib import Path

import pytest

from mxu.sim.models.gguf_file import read_metadata
from mxu.sim.models.tokenizer import (CONTROL, GgufTokenizer, SpmTokenizer, TOKENIZER_MODELS,
                                      tokenizer_metadata)

DATA = Path(__file__).parent / "data"


def _spm(tokens, scores, types, **keys):
    meta = {"tokenizer.ggml.model": "llama", "tokens": tokens, "scores": scores,
            "token_type": types, "tokenizer.ggml.bos_token_id": 0}
    meta.update({f"tokenizer.ggml.{k}": v for k, v in keys.items()})
    return GgufTokenizer(meta)


# A SentencePiece vocabulary: <s> (control), the bytes 'a' and 0xC3 0xA9
# ("é"), pieces with scores, a user-defined "<br>".
_TOKENS = ["<s>", "<0x61>", "<0xC3>", "<0xA9>", "\u2581", "a", "b", "c", "ab", "bc", "abc",
           "\u2581a", "<br>", "</s>"]
_SCORES = [0, 0, 0, 0, -1, -2, -2, -2, -5, -3, -4, -1, 0, 0]
_TYPES = [3, 6, 6, 6, 1, 1, 1, 1, 1, 1, 1, 1, 4, 4]


def test_the_model_key_picks_the_tokenizer():
    assert sorted(TOKENIZER_MODELS) == ["gpt2", "llama"]
    tok = _spm(_TOKENS, _SCORES, _TYPES)
    assert isinstance(tok, SpmTokenizer) and tok.add_bos and tok.add_space_prefix
    with pytest.raises(ValueError, match=r"unsupported tokenizer 'bert' \(tokenizer.ggml.model\);"
                                         r" supported: \['gpt2', 'llama'\]"):
        GgufTokenizer({"tokenizer.ggml.model": "bert", "tokens": ["a"]})
    with pytest.raises(ValueError, match="duplicate token"):
        _spm(["a", "a"], [0, 0], [1, 1])


def test_sentencepiece_merges_the_best_scored_pair_first():
    """"abc": "bc" (-3) merges before "ab" (-5), then "a"+"bc" = "abc" (-4).
    With the space prefix the text is "▁abc": "▁a" (-1) merges first, "bc"
    next, and "▁a"+"bc" is no token. llama.cpp's detokenizer drops the
    prefix space unless a BOS comes first."""
    tok = _spm(_TOKENS, _SCORES, _TYPES, add_space_prefix=False)
    assert tok.encode("abc") == [0, 10]
    assert tok.encode("ab") == [0, 8]
    spaced = _spm(_TOKENS, _SCORES, _TYPES)
    assert spaced.encode("abc") == [0, 11, 9]
    assert spaced.decode([11, 9]) == "abc"
    assert spaced.decode([0, 11, 9]) == " abc"
    assert spaced.decode([0, 11, 9], special=True) == "<s> abc"


def test_byte_fallback_and_special_tokens():
    tok = _spm(_TOKENS, _SCORES, _TYPES, add_space_prefix=False)
    # "é" is no token: its UTF-8 bytes; "d" has no byte token: a clear error.
    assert tok.encode("é") == [0, 2, 3] and tok.decode([0, 2, 3]) == "é"
    with pytest.raises(ValueError, match="no token for byte 0x64"):
        tok.encode("d")
    # A user-defined token is cut out of plain text; a control one only
    # with special=True; "</s>" is a control token by its text (llama.cpp).
    assert tok.types[13] == CONTROL
    assert tok.encode("a<br>b") == [0, 5, 12, 6]
    assert tok.encode("<s>", special=True) == [0, 0]
    assert tok.encode("</s>", special=True) == [0, 13]
    with pytest.raises(ValueError, match="no token for byte 0x3C"):
        tok.encode("</s>")          # not cut out: its "<" goes to the byte fallback
    assert tok.decode([0, 13, 12]) == "<br>" and tok.decode([13], special=True) == "</s>"
    with pytest.raises(ValueError, match="outside the vocabulary of 14"):
        tok.decode([14])
    with pytest.raises(ValueError, match="not valid Unicode"):
        tok.encode("a\udcff")
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template("hi")


# ---- Gemma 3 270M against llama.cpp ------------------------------------------------------

@pytest.fixture(scope="module")
def gemma3():
    from mxu.sim.models.registry import find_decoder
    return GgufTokenizer(tokenizer_metadata(read_metadata(find_decoder("gemma-3-270m")[1])))


def test_gemma3_gives_llama_cpps_ids(gemma3):
    """Every string of the fixture: llama.cpp's ids (BOS included) and its
    detokenized text. The text comes back (after the printed BOS with
    special tokens), but for a literal "▁": SentencePiece's mark of a space."""
    fixture = json.loads((DATA / "gemma3_tokens.json").read_text())
    assert isinstance(gemma3, SpmTokenizer) and gemma3.add_bos and not gemma3.add_space_prefix
    assert len(fixture["plain"]) + len(fixture["special"]) >= 16
    for special, cases in ((False, fixture["plain"]), (True, fixture["special"])):
        for text, ids, printed in cases:
            assert gemma3.encode(text, special=special) == ids, text
            assert gemma3.decode(ids, special=special) == printed, text
            if "\u2581" not in text:
                assert printed == ("<bos>" if special else "") + text, text
    # Byte fallback (rare characters, "\r") and whitespace runs are exercised.
    ids = {i for _, case, _ in fixture["plain"] for i in case}
    assert {gemma3.tokens[i] for i in ids} >= {"<0xF0>", "<0x0D>", "   ", "\t\t\t", "\n\n"}


def test_gemma3_chat_markup(gemma3):
    """The turn markers are single tokens with special=True, text without;
    the file has no chat template (a pretrained model): a clear error."""
    ids = gemma3.encode("<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
                        special=True)
    assert [gemma3.tokens[i] for i in ids][:3] == ["<bos>", "<start_of_turn>", "user"]
    assert "<start_of_turn>" not in [gemma3.tokens[i] for i in gemma3.encode("<start_of_turn>")]
    with pytest.raises(ValueError, match="no chat template"):
        gemma3.apply_chat_template("Hi")


def test_a_gemma_style_chat_template_renders():
    """A template that uses bos_token and raise_exception (Gemma's do)."""
    template = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
                "{{ raise_exception('no system role') }}{% endif %}<start_of_turn>"
                "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] }}"
                "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n"
                "{% endif %}")
    tok = GgufTokenizer({"tokenizer.ggml.model": "llama", "tokens": _TOKENS, "scores": _SCORES,
                         "token_type": _TYPES, "tokenizer.ggml.bos_token_id": 0,
                         "tokenizer.chat_template": template})
    assert tok.apply_chat_template("Hi") == \
        "<s><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    with pytest.raises(ValueError, match="refuses the messages: no system role"):
        tok.apply_chat_template([{"role": "system", "content": "x"}])
