"""Pretrained models built from shared blocks on the chip (docs/transformer.md,
docs/llm.md): the sentence encoder all-MiniLM-L6-v2 and the decoder LLMs,
known by name (`registry.MODELS`) or given as a GGUF file."""

from .causal_lm import CausalLM
from .sentence import SentenceEncoder

__all__ = ["SentenceEncoder", "CausalLM"]
