"""The loaded model record shared by the engine, the drafters and the service."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.nn as nn


class ModelError(ValueError):
    """A model that cannot be loaded: missing file, unsupported architecture, no network."""


@dataclass
class LoadedModel:
    """A target (or draft) model with what generation needs around it.

    Attributes:
        name: the spec it was loaded from (alias, path or hub id).
        model: an mlx-lm model (`model.model.layers`, `model.model.norm`, `embed_tokens`).
        tokenizer: an mlx-lm `TokenizerWrapper` (encode/decode, `eos_token_ids`, chat template).
        context_length: the longest sequence the model was trained for.
        weight_format: how the weights are held ("float32", "float16", "q4", ...).
        info: free-form facts about the source (file, architecture, quantization).
    """

    name: str
    model: nn.Module
    tokenizer: Any
    context_length: int
    weight_format: str = "float32"
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_layers(self) -> int:
        return len(self.model.model.layers)

    @property
    def vocab_size(self) -> int:
        return self.model.model.embed_tokens.weight.shape[0]

    @property
    def eos_token_ids(self) -> set[int]:
        return set(self.tokenizer.eos_token_ids)

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of `messages` rendered by the model's chat template, ready to generate."""
        return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True))

    def encode_prompt(self, prompt: str) -> list[int]:
        """Token ids of a raw completion prompt (BOS added when the tokenizer asks for it)."""
        return list(self.tokenizer.encode(prompt))

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens)

    def encode_text(self, text: str) -> list[int]:
        """Token ids of a piece of text, nothing added (special-token strings map to their ids)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))
