"""The loaded model record shared by the engine, the drafters and the service."""

from __future__ import annotations

import functools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import mlx.nn as nn
import tokenizers

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
        self._pieces: OrderedDict[str, tuple[int, ...]] = OrderedDict()  # short texts' ids

    def decode(self, tokens: list[int]) -> str:
        if len(tokens) <= PIECE_TOKENS:
            return self._decode_piece(tuple(tokens))
        return self._decode(tokens)

    def encode_text(self, text: str) -> list[int]:
        """Token ids of a piece of text, nothing added (special-token strings map to their ids)."""
        return self.encode_texts([text])[0]

    def encode_texts(self, texts: list[str]) -> list[list[int]]:
        """`encode_text` of each text; those not remembered are tokenized in one batch (the
        fast tokenizer's `encode_batch`, which runs them in parallel)."""
        out: list[list[int] | None] = [None] * len(texts)
        missing: dict[str, list[int]] = {}
        for i, text in enumerate(texts):
            ids = self._pieces.get(text) if len(text) <= PIECE_CHARS else None
            if ids is None:
                missing.setdefault(text, []).append(i)
            else:
                self._pieces.move_to_end(text)
                out[i] = list(ids)
        if missing:
            for text, ids in zip(missing, self._encode_many(list(missing)), strict=True):
                for i in missing[text]:
                    out[i] = list(ids)
                if len(text) <= PIECE_CHARS:
                    self._pieces[text] = tuple(ids)
            while len(self._pieces) > PIECES:
                self._pieces.popitem(last=False)
        return out  # type: ignore[return-value]

    def _encode_many(self, texts: list[str]) -> list[list[int]]:
        backend = getattr(getattr(self.tokenizer, "_tokenizer", None), "_tokenizer", None)
        if isinstance(backend, tokenizers.Tokenizer) and len(texts) > 1:
            return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
        return [list(self._encode(t)) for t in texts]

    def _decode(self, tokens) -> str:
        return self.tokenizer.decode(list(tokens))

    def _encode(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(text, add_special_tokens=False))
