"""The fast GGUF reader (sim/models/gguf_file.py, docs/llm.md "Models"):
the same fields and tensors as `gguf.GGUFReader` on a file of float and
quantized tensors and arrays of every kind; a file cut anywhere, or not
GGUF, is a ValueError naming it."""

import numpy as np
import pytest

from mxu.sim.models.gguf_file import GgufFile, read_metadata


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory):
    import gguf
    from gguf.quants import quantize
    path = tmp_path_factory.mktemp("gguf") / "small.gguf"
    rng = np.random.default_rng(1)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("test.u32", 7)
    w.add_float32("test.f32", 0.25)
    w.add_bool("test.bool", True)
    w.add_string("test.str", "naïve ▁ 日本")
    w.add_array("test.ints", [1, -2, 3])
    w.add_array("test.floats", [0.5, -1.5])
    w.add_array("test.strs", ["a", "", "<0x0A>", "\n\n"])
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 4)).astype(np.float16))
    for qtype in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q5_0):
        x = rng.standard_normal((4, 64)).astype(np.float32)
        w.add_tensor(qtype.name.lower(), quantize(x, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _same_as_gguf_reader(path):
    import gguf
    mine, theirs = GgufFile(path), gguf.GGUFReader(str(path))
    assert isinstance(mine, gguf.GGUFReader)      # what family readers check
    want = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert set(mine.fields) == set(want)
    for key, value in want.items():
        got = mine.fields[key].contents()
        assert got == (list(value) if isinstance(value, (list, np.ndarray)) else value), key
    assert read_metadata(path) == {k: f.contents() for k, f in mine.fields.items()}
    for a, b in zip(mine.tensors, theirs.tensors, strict=True):
        assert (a.name, a.tensor_type, list(a.shape), a.n_bytes, a.data_offset) == \
            (b.name, b.tensor_type, list(b.shape), b.n_bytes, b.data_offset)
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape
        assert np.array_equal(np.asarray(a.data).view(np.uint8), np.asarray(b.data).view(np.uint8))
    return mine


def test_the_same_fields_and_tensors_as_gguf_reader(small_gguf):
    mine = _same_as_gguf_reader(small_gguf)
    assert [t.name for t in mine.tensors] == ["f32", "f16", "q8_0", "q5_0"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["SmolLM2-135M-Instruct", "gemma-3-270m"])
def test_the_model_files_read_as_gguf_reader_reads_them(name):
    """Every field and tensor of the real files (GGUFReader takes 7 s and
    33 s over them: slow)."""
    from mxu.sim.models.registry import find_decoder
    _same_as_gguf_reader(find_decoder(name)[1])


@pytest.mark.parametrize("cut", [3, 30, 150, -700, -40])
def test_a_file_cut_anywhere_is_a_clear_error(small_gguf, tmp_path, cut):
    """Cut in the header, the metadata, the tensor infos or the tensor data
    (the last tensor is padded to 32 bytes: -40 cuts into its data)."""
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(small_gguf.read_bytes()[:cut])
    with pytest.raises(ValueError, match=r"cut.gguf' is not a readable GGUF file \(truncated or "
                                         r"corrupt\?\)"):
        GgufFile(bad)


def test_not_gguf_at_all(tmp_path):
    bad = tmp_path / "text.gguf"
    bad.write_text("a text file, long enough to hold a header")
    for read in (GgufFile, read_metadata):
        with pytest.raises(ValueError, match="does not start with a GGUF header"):
            read(bad)
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        read_metadata(tmp_path / "none.gguf")
