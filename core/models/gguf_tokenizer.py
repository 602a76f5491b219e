"""The tokenizer a GGUF file describes, as an mlx-lm `TokenizerWrapper`.

A GGUF carries no `tokenizer.json`: the vocabulary, merges, token types, special ids and
chat template live in `tokenizer.ggml.*` / `tokenizer.chat_template` metadata. We rebuild
the byte-level BPE (`tokenizer.ggml.model == "gpt2"`) with `tokenizers`, splitting text
the way the vocabulary was trained (`tokenizer.ggml.pre`), then wrap it in transformers'
`PreTrainedTokenizerFast` (chat template, bos/eos) and mlx-lm's `TokenizerWrapper`.
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, processors
from tokenizers import pre_tokenizers as pre

from .model import ModelError

# llama.cpp token types (llama_token_type).
NORMAL, CONTROL, USER_DEFINED = 1, 3, 4

QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _pre_tokenizer(pre_type: str) -> tuple[Any, Any]:
    """`(normalizer, pre_tokenizer)` matching the HF tokenizer.json of each `tokenizer.ggml.pre`."""
    if pre_type == "smollm":
        # llama.cpp's SMOLLM split ("\p{N}", then GPT-2's regex): every digit alone, then
        # GPT-2's byte-level regex.
        return None, pre.Sequence(
            [
                pre.Digits(individual_digits=True),
                pre.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if pre_type in ("qwen2", "deepseek-r1-qwen"):
        return normalizers.NFC(), _split_then_bytes(QWEN2_SPLIT)
    if pre_type in ("llama3", "llama-v3", "llama-bpe", "smaug-bpe"):
        return None, _split_then_bytes(LLAMA3_SPLIT)
    if pre_type in ("gpt2", "default"):
        return None, pre.ByteLevel(add_prefix_space=False, use_regex=True)
    raise ModelError(f"unsupported GGUF pre-tokenizer {pre_type!r}")


def _split_then_bytes(regex: str) -> Any:
    return pre.Sequence(
        [
            pre.Split(Regex(regex), behavior="isolated", invert=False),
            pre.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def build_tokenizer(metadata: dict[str, Any]) -> Tokenizer:
    """A `tokenizers.Tokenizer` from `tokenizer.ggml.*` metadata (byte-level BPE only).

    Control tokens become special added tokens, user-defined ones plain added tokens,
    so both are matched whole in text; ids are exactly the file's.
    """
    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelError(f"unsupported GGUF tokenizer model {kind!r} (only byte-level BPE 'gpt2')")
    tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
    types: list[int] = list(metadata.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in metadata.get("tokenizer.ggml.merges", [])]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ModelError("GGUF vocabulary has duplicate tokens")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    normalizer, pre_tok = _pre_tokenizer(str(metadata.get("tokenizer.ggml.pre", "default")))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tok
    tok.decoder = decoders.ByteLevel()
    added = [
        AddedToken(t, special=(ty == CONTROL), normalized=False)
        for t, ty in zip(tokens, types, strict=True)
        if ty in (CONTROL, USER_DEFINED)
    ]
    tok.add_special_tokens([a for a in added if a.special])
    tok.add_tokens([a for a in added if not a.special])
    if metadata.get("tokenizer.ggml.add_bos_token") and "tokenizer.ggml.bos_token_id" in metadata:
        bos = tokens[int(metadata["tokenizer.ggml.bos_token_id"])]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])]
        )
    if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise ModelError("GGUF tokenizer rebuilt with a different vocabulary size")
    return tok


def eos_ids(metadata: dict[str, Any]) -> list[int]:
    """Ids that end generation: eos, eot and eom, plus `<|endoftext|>` when it is a control token."""
    ids = [
        int(metadata[f"tokenizer.ggml.{k}_token_id"])
        for k in ("eos", "eot", "eom")
        if f"tokenizer.ggml.{k}_token_id" in metadata
    ]
    tokens = metadata["tokenizer.ggml.tokens"]
    types = metadata.get("tokenizer.ggml.token_type") or []
    for i, (t, ty) in enumerate(zip(tokens, types, strict=False)):
        if t == "<|endoftext|>" and ty == CONTROL:
            ids.append(i)
            break
    return sorted(set(ids))


def load_gguf_tokenizer(metadata: dict[str, Any]) -> Any:
    """The mlx-lm `TokenizerWrapper` for a GGUF file's metadata."""
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper
    from transformers import PreTrainedTokenizerFast

    tok = build_tokenizer(metadata)
    tokens = metadata["tokenizer.ggml.tokens"]

    def special(key: str) -> str | None:
        i = metadata.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[int(i)] if i is not None else None

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=special("bos"),
        eos_token=special("eos"),
        unk_token=special("unknown"),
        pad_token=special("padding"),
        chat_template=metadata.get("tokenizer.chat_template"),
        clean_up_tokenization_spaces=False,
    )
    return TokenizerWrapper(
        hf, detokenizer_class=BPEStreamingDetokenizer, eos_token_ids=eos_ids(metadata)
    )
