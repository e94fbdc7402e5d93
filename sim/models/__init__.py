"""Pretrained models built from shared blocks on the chip (docs/transformer.md,
docs/llm.md): the sentence encoder all-MiniLM-L6-v2 and the decoder LLM
SmolLM2-135M-Instruct."""

from .causal_lm import CausalLM
from .sentence import SentenceEncoder

__all__ = ["SentenceEncoder", "CausalLM"]
