"""Pretrained models built from the runtime's layers (docs/transformer.md)."""

from .sentence import SentenceEncoder

__all__ = ["SentenceEncoder"]
