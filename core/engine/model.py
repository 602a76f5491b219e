"""The loaded model record shared by the engine, the drafters and the service."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import mlx.nn as nn

PIECES = 1 << 16  # short texts and token runs whose codings are remembered (per model)
PIECE_TOKENS, PIECE_CHARS = 8, 256  # what counts as short


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

    def __post_init__(self):
        # Drafters decode a row's last tokens and re-tokenize short continuations every step,
        # and a job's rows repeat the same pieces (keys, labels): remembered, per model.
        self._decode_piece = functools.lru_cache(PIECES)(self._decode)
        self._encode_piece = functools.lru_cache(PIECES)(self._encode)

    def decode(self, tokens: list[int]) -> str:
        if len(tokens) <= PIECE_TOKENS:
            return self._decode_piece(tuple(tokens))
        return self._decode(tokens)

    def encode_text(self, text: str) -> list[int]:
        """Token ids of a piece of text, nothing added (special-token strings map to their ids)."""
        if len(text) <= PIECE_CHARS:
            return list(self._encode_piece(text))
        return list(self._encode(text))

    def _decode(self, tokens) -> str:
        return self.tokenizer.decode(list(tokens))

    def _encode(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(text, add_special_tokens=False))
