"""The model registry (docs/llm.md, "Models"): one list of names for the
encoders and the decoders, decoders by name or by GGUF path, the family
picked by the file's ``general.architecture``, Gemma 3 270M assembled from
its wheel's parts; clear errors for an unknown name, an unsupported
architecture, a truncated or corrupt file and a prompt longer than the
context, from the API and from `mxu generate --model`. The GGUF files are
tiny ones written here with `gguf.GGUFWriter`."""

from pathlib import Path

import numpy as np
import pytest

from chip_configs import VPU_SHAPES
from mxu.sim import Chip
from mxu.sim.models import CausalLM, SentenceEncoder
from mxu.sim.models.causal_lm import rope_mode
from mxu.sim.models.llama import LlamaConfig, LlamaWeights
from mxu.sim.models.registry import (ARCHITECTURES, assembled, decoder_metadata, find_decoder,
                                     find_model, model_names, read_decoder)
from mxu.verif import golden
from mxu.verif.llama import GoldenLlama

TINY = LlamaConfig(hidden=16, heads=2, kv_heads=1, ffn=32, layers=1, eps=float(np.float32(1e-5)),
                   rope_theta=10000.0, vocab=8, context=32, bos=0, eos=1)
# A byte-level BPE vocabulary: "a", "b", "ab" and a space ("Ġ").
TOKENS = ["<s>", "</s>", "a", "b", "c", "\u0120", "ab", "ba"]


def _write_llama(path, weights, arch="llama"):
    """`weights` (a `LlamaWeights`) as a GGUF file of architecture `arch`."""
    import gguf
    c = weights.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(c.context)
    w.add_embedding_length(c.hidden)
    w.add_block_count(c.layers)
    w.add_feed_forward_length(c.ffn)
    w.add_head_count(c.heads)
    w.add_head_count_kv(c.kv_heads)
    w.add_rope_dimension_count(c.head_dim)
    w.add_rope_freq_base(c.rope_theta)
    w.add_layer_norm_rms_eps(c.eps)
    w.add_vocab_size(c.vocab)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(TOKENS)
    w.add_token_merges(["a b", "b a"])
    w.add_token_types([3, 3, 1, 1, 1, 1, 1, 1])
    w.add_bos_token_id(c.bos)
    w.add_eos_token_id(c.eos)
    f32 = lambda x: np.ascontiguousarray(x, np.float32)
    w.add_tensor("token_embd.weight", f32(weights.embed))
    w.add_tensor("output_norm.weight", f32(weights.final_norm))
    for i, lw in enumerate(weights.layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", f32(lw.attn_norm))
        w.add_tensor(p + "ffn_norm.weight", f32(lw.ffn_norm))
        for name, m in (("attn_q", lw.wq), ("attn_k", lw.wk), ("attn_v", lw.wv),
                        ("attn_output", lw.wo), ("ffn_gate", lw.w_gate), ("ffn_up", lw.w_up),
                        ("ffn_down", lw.w_down)):
            w.add_tensor(p + name + ".weight", f32(m.T))     # GGUF keeps (out, in)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    weights = LlamaWeights.random(TINY, seed=4)
    return weights, _write_llama(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf", weights)


def test_one_registry_of_names():
    """Encoders and decoders in one registry; aliases resolve; an unknown name
    lists the known names of its kind; a name of the other kind says so."""
    assert model_names("decoder") == ["SmolLM2-135M-Instruct", "gemma-3-270m"]
    assert model_names("encoder") == ["all-MiniLM-L6-v2"]
    assert find_decoder("smollm2")[0] == "SmolLM2-135M-Instruct"
    assert find_decoder("HuggingFaceTB/SmolLM2-135M-Instruct")[1].endswith(".gguf")
    assert find_model("sentence-transformers/all-MiniLM-L6-v2", "encoder").name == \
        "all-MiniLM-L6-v2"
    with pytest.raises(ValueError, match=r"unknown model 'llama-70b'; known models: "
                                         r"\['SmolLM2-135M-Instruct', 'gemma-3-270m'\]"):
        CausalLM("llama-70b")
    with pytest.raises(ValueError, match=r"unknown model 'bert'; known models: "
                                         r"\['all-MiniLM-L6-v2'\]"):
        SentenceEncoder("bert")
    with pytest.raises(ValueError, match="is a decoder, not an encoder; known encoders"):
        SentenceEncoder("SmolLM2-135M-Instruct")
    with pytest.raises(TypeError, match="model name or a GGUF path"):
        CausalLM(3)


def test_a_decoder_from_its_gguf_path(tiny_gguf):
    """Any GGUF of a supported architecture by path: the family of its
    general.architecture reads it (the weights as written), and it runs on
    the chip bit-exact to the golden Llama form."""
    weights, path = tiny_gguf
    assert "llama" in ARCHITECTURES
    got, meta = read_decoder(path)
    assert got.config == TINY
    for a, b in ((got.embed, weights.embed), (got.layers[0].wq, weights.layers[0].wq),
                 (got.layers[0].w_down, weights.layers[0].w_down)):
        assert np.array_equal(a, b)
    cfg = VPU_SHAPES["4x4"]
    lm = CausalLM(str(path), chip=Chip(cfg, fast_mac=True))
    assert lm.name == "tiny-llama"
    prompt = lm.tokenizer.encode("ab ba")
    assert prompt == [6, 5, 7]
    logits = lm.logits_ids(prompt)
    gold = GoldenLlama(got, rows=cfg.rows, lanes=cfg.cols, rope=rope_mode(cfg, TINY.head_dim))
    want = gold.forward([(0, prompt)], logits="all")[0]
    golden.assert_bits_equal(logits, want, "logits of the GGUF by path")


def test_an_unsupported_architecture_lists_the_supported_ones(tmp_path):
    path = _write_llama(tmp_path / "other.gguf", LlamaWeights.random(TINY, seed=5), arch="gpt2")
    with pytest.raises(ValueError, match=r"other.gguf' holds a 'gpt2' model; supported "
                                         r"architectures: \['gemma3', 'llama'\]"):
        CausalLM(str(path))


@pytest.mark.parametrize("cut", [0, 10, 200, -4000, -3])
def test_a_truncated_or_corrupt_file_is_a_clear_error_naming_it(tiny_gguf, tmp_path, cut):
    """Cut in the header, the metadata, or the tensor data; or not GGUF at all."""
    data = tiny_gguf[1].read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(data[:cut] if cut else b"GGUF? no: " + data[10:400])
    with pytest.raises(ValueError, match=r"bad.gguf' is not a readable GGUF file"):
        CausalLM(str(bad))


def test_a_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        CausalLM(str(tmp_path / "nowhere.gguf"))


def test_the_metadata_alone_is_enough_to_check_a_prompt(tiny_gguf):
    """The architecture, the tokenizer and the context without the tensors."""
    arch, meta, context = decoder_metadata(tiny_gguf[1])
    assert (arch, context, meta["tokens"]) == ("llama", TINY.context, TOKENS)


# ---- Gemma 3 270M by name ---------------------------------------------------------------------

def test_gemma_3_270m_is_assembled_from_its_wheel_and_verified(monkeypatch):
    """The name finds the file the wheel's parts assemble (sha256 as
    published); until a gemma3 family is registered, CausalLM says which
    architectures it runs."""
    import hashlib
    name, path = find_decoder("gemma-3-270m")
    assert name == "gemma-3-270m" and find_decoder("google/gemma-3-270m")[1] == path
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    assert digest.startswith("a5fd3b62") and digest.endswith("6818")
    monkeypatch.delitem(ARCHITECTURES, "gemma3", raising=False)
    with pytest.raises(ValueError, match=r"gemma-3-270m-q4_k_m.gguf' holds a 'gemma3' model; "
                                         r"supported architectures: \['llama'\]"):
        CausalLM("gemma-3-270m")


def test_a_wheels_parts_are_assembled_once_and_atomically(tmp_path):
    """A fake model wheel: the file appears whole (a process's own part file
    renamed into place), is reused, and a file that does not match its
    sha256 is assembled again."""
    import hashlib
    from types import SimpleNamespace
    content = b"GGUF" + bytes(range(256)) * 3
    calls = []

    def assemble(output_path, overwrite=False):
        calls.append(output_path)
        assert overwrite and output_path.name.startswith(".") and output_path.suffix == ".part"
        output_path.write_bytes(content)
        return output_path

    wheel = SimpleNamespace(MODEL_NAME="m.gguf", assemble=assemble,
                            EXPECTED_SHA256=hashlib.sha256(content).hexdigest(),
                            default_output_path=lambda: tmp_path / "default" / "m.gguf")
    path = assembled(wheel, tmp_path / "cache")
    assert path == tmp_path / "cache" / "m.gguf" and path.read_bytes() == content
    assert assembled(wheel, tmp_path / "cache") == path and len(calls) == 1
    path.write_bytes(b"GGUF corrupt")
    assert assembled(wheel, tmp_path / "cache").read_bytes() == content and len(calls) == 2
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["m.gguf"]
    assert assembled(wheel) == tmp_path / "default" / "m.gguf"
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError, match=r"cannot assemble m.gguf into '.*file/cache'"):
        assembled(wheel, tmp_path / "file" / "cache")


# ---- a prompt longer than the context ------------------------------------------------------

def test_a_prompt_longer_than_the_context_fails_before_any_chip_work(tiny_gguf, monkeypatch):
    lm = CausalLM(str(tiny_gguf[1]), chip=Chip(VPU_SHAPES["4x4"], fast_mac=True))

    def no_chip_work(*args, **kwargs):
        raise AssertionError("the chip ran a step")

    monkeypatch.setattr(lm.model, "step", no_chip_work)
    with pytest.raises(ValueError, match=r"30 prompt tokens \+ 3 new ones = 33 positions, longer "
                                         r"than the model's context of 32"):
        lm.generate("ab" * 30, max_new_tokens=3)
    assert lm.last_stats is None


# ---- mxu generate --model ------------------------------------------------------------------

def _generate(argv, capsys, monkeypatch):
    """`mxu generate` with a chip that must not be built."""
    import mxu.sim.runtime.chip as chip_module
    from mxu.sim.cli import main
    monkeypatch.setattr(chip_module, "Chip", None)
    status = main(["generate"] + argv)
    return status, capsys.readouterr().err


@pytest.mark.parametrize("case", ["unknown", "missing", "corrupt", "unsupported", "too long",
                                  "no template"])
def test_generate_with_a_bad_model_is_a_one_line_error_before_the_build(case, tiny_gguf, tmp_path,
                                                                        capsys, monkeypatch):
    path = str(tiny_gguf[1])
    argv, message = {
        "unknown": (["hi", "--model", "llama-70b"],
                    "unknown model 'llama-70b'; known models: ['SmolLM2-135M-Instruct', "
                    "'gemma-3-270m']"),
        "missing": (["hi", "--model", str(tmp_path / "none.gguf")], "no GGUF file"),
        "corrupt": (["hi", "--model", str(tmp_path / "cut.gguf")],
                    "cut.gguf' is not a readable GGUF file (truncated or corrupt?)"),
        "unsupported": (["hi", "--model", str(tmp_path / "other.gguf")],
                        f"holds a 'gpt2' model; supported architectures: "
                        f"{sorted(ARCHITECTURES)}"),
        "too long": (["ab" * 20, "--model", path, "--max-new-tokens", "13"],
                     "20 prompt tokens + 13 new ones = 33 positions, longer than the model's "
                     "context of 32"),
        "no template": (["hi", "--model", path, "--chat"], "has no chat template"),
    }[case]
    (tmp_path / "cut.gguf").write_bytes(tiny_gguf[1].read_bytes()[:300])
    _write_llama(tmp_path / "other.gguf", LlamaWeights.random(TINY, seed=5), arch="gpt2")
    status, err = _generate(argv, capsys, monkeypatch)
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("mxu generate: error: ") and message in err, err
