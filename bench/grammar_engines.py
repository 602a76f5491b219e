"""Which grammar engine compiles `response_format` schemas: llguidance, outlines-core, xgrammar
measured on this machine with the default model's tokenizer (SmolLM2-135M, 49152 tokens).

Per engine: compile time of labeling-like schemas (first mask included: llguidance builds
lazily), mask time per token at 64 rows (64 matchers walked along a valid answer, one mask
each per token), which JSON Schema features compile (a feature suite), and installed size.

    .venv/bin/python bench/grammar_engines.py              # engines importable in this env
    PYTHONPATH=/tmp/gx .venv/bin/python bench/grammar_engines.py   # others installed with
        # pip install --no-deps --target /tmp/gx outlines-core xgrammar apache-tvm-ffi
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.make_jobs import LABEL_SCHEMA as LABEL  # noqa: E402 (the labeling job's schema)

REVIEW = {
    "type": "object",
    "properties": {
        "product": {"type": "string", "maxLength": 40},
        "sentiment": {"enum": ["positive", "negative", "neutral", "mixed"]},
        "rating": {"type": "integer", "minimum": 1, "maximum": 5},
        "tags": {
            "type": "array",
            "items": {"type": "string", "maxLength": 16},
            "minItems": 1,
            "maxItems": 3,
        },
        "refund": {"type": "boolean"},
    },
    "required": ["product", "sentiment", "rating", "tags", "refund"],
    "additionalProperties": False,
}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "email": {"type": "string", "format": "email"},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string"},
                "city": {"type": "string"},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["street", "city", "zip"],
            "additionalProperties": False,
        },
        "score": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["name", "age", "address"],
    "additionalProperties": False,
}
SCHEMAS = {"labeling": LABEL, "review": REVIEW, "person": PERSON}
ANSWERS = {
    "labeling": {"category": "billing", "urgency": "high", "customer": "Noah"},
    "review": {
        "product": "USB-C charging cable",
        "sentiment": "negative",
        "rating": 2,
        "tags": ["durability", "price"],
        "refund": True,
    },
    "person": {
        "name": "Ada Lovelace",
        "age": 36,
        "email": "ada@example.com",
        "address": {"street": "12 St James Sq", "city": "London", "zip": "12345"},
        "score": 0.75,
    },
}
S = {"type": "string"}
FEATURES = {
    "enum": {"enum": ["a", "b"]},
    "const": {"const": "x"},
    "nested objects": PERSON,
    "array min/maxItems": {"type": "array", "items": S, "minItems": 1, "maxItems": 3},
    "string min/maxLength": {"type": "string", "minLength": 2, "maxLength": 5},
    "pattern": {"type": "string", "pattern": "^[a-z]+-[0-9]{2}$"},
    "format date-time": {"type": "string", "format": "date-time"},
    "format uuid": {"type": "string", "format": "uuid"},
    "integer min/max": {"type": "integer", "minimum": -5, "maximum": 500},
    "number exclusiveMinimum": {"type": "number", "exclusiveMinimum": 0},
    "multipleOf": {"type": "integer", "multipleOf": 5},
    "optional properties": {"type": "object", "properties": {"a": S, "b": S}, "required": ["a"]},
    "additionalProperties false": {
        "type": "object",
        "properties": {"a": S},
        "additionalProperties": False,
    },
    "additionalProperties schema": {"type": "object", "additionalProperties": {"type": "integer"}},
    "anyOf": {"anyOf": [S, {"type": "integer"}]},
    "oneOf": {"oneOf": [{"type": "string"}, {"type": "boolean"}]},
    "allOf": {"allOf": [{"type": "object", "properties": {"a": S}}, {"required": ["a"]}]},
    "$ref / $defs": {
        "$defs": {"p": {"type": "integer"}},
        "type": "array",
        "items": {"$ref": "#/$defs/p"},
    },
    "recursive $ref": {
        "$defs": {
            "n": {
                "type": "object",
                "properties": {"c": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
            }
        },
        "$ref": "#/$defs/n",
    },
    "prefixItems": {"type": "array", "prefixItems": [S, {"type": "integer"}], "items": False},
    "uniqueItems": {"type": "array", "items": S, "uniqueItems": True},
    "patternProperties": {"type": "object", "patternProperties": {"^x_": S}},
    "if/then": {"if": {"type": "string"}, "then": {"minLength": 1}},
    "not": {"not": {"type": "string"}},
    "type list": {"type": ["string", "null"]},
}
ROWS = 64


def tokenizer():
    from core.models.loading import load_tokenizer

    tok, _ = load_tokenizer("smollm2-135m")
    return tok


def answer_tokens(tok, name: str) -> list[int]:
    text = json.dumps(ANSWERS[name], separators=(", ", ": "))
    return tok.encode(text, add_special_tokens=False)


class Llguidance:
    name = "llguidance"
    package = "llguidance"

    def __init__(self, tok):
        import llguidance
        import llguidance.hf

        self.ll = llguidance
        self.tok = llguidance.hf.from_tokenizer(tok._tokenizer, n_vocab=49152)
        self.words = (49152 + 31) // 32

    def compile(self, schema):
        g = self.ll.LLMatcher.grammar_from_json_schema(
            json.dumps(schema),
            overrides={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
        )
        is_error, msgs = self.ll.LLMatcher.validate_grammar_with_warnings(g, self.tok)
        if is_error:
            raise ValueError(msgs[0])
        m = self.ll.LLMatcher(self.tok, g, log_level=0)
        mask = np.zeros(self.words, np.int32)
        m.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)  # the lazy part
        return g

    def matcher(self, compiled):
        return self.ll.LLMatcher(self.tok, compiled, log_level=0)

    def mask(self, m, out):
        m.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)

    def advance(self, m, t):
        assert m.consume_token(t), m.get_error()


class OutlinesCore:
    name = "outlines-core"
    package = "outlines_core"

    def __init__(self, tok):
        import outlines_core
        from outlines_core.json_schema import build_regex_from_schema

        from core.models.tiny import _bytes_to_unicode

        self.oc, self.regex = outlines_core, build_regex_from_schema
        back = {c: b for b, c in _bytes_to_unicode().items()}
        hf = tok._tokenizer
        specials = set(hf.all_special_ids)
        vocab: dict[bytes, list[int]] = {}
        for s, i in hf.get_vocab().items():
            if i in specials:
                continue
            vocab.setdefault(bytes(back[c] for c in s), []).append(i)
        self.vocab = outlines_core.Vocabulary(hf.eos_token_id, vocab)
        self.words = (49152 + 31) // 32

    def compile(self, schema):
        regex = self.regex(json.dumps(schema), r"( )?")  # one optional blank: compact-ish
        return self.oc.Index(regex, self.vocab)

    def matcher(self, index):
        return self.oc.Guide(index)

    def mask(self, g, out):
        g.write_mask_into(out.ctypes.data, out.size, out.itemsize)

    def advance(self, g, t):
        g.advance(t)


class Xgrammar:
    name = "xgrammar"
    package = "xgrammar"

    def __init__(self, tok):
        import xgrammar as xgr  # imports torch: absent here, it cannot run

        self.xgr = xgr
        self.info = xgr.TokenizerInfo.from_huggingface(tok._tokenizer, vocab_size=49152)
        self.compiler = xgr.GrammarCompiler(self.info, cache_enabled=False)

    def compile(self, schema):
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def mask(self, m, out):
        import torch

        m.fill_next_token_bitmask(torch.from_numpy(out[None]), 0)

    def advance(self, m, t):
        assert m.accept_token(t)


def installed_mb(package: str) -> float | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) / 1e6


def measure(engine_cls, tok) -> dict:
    try:
        eng = engine_cls(tok)
    except Exception as e:  # not installed, or its imports fail (xgrammar wants torch)
        return {"engine": engine_cls.name, "error": f"{type(e).__name__}: {e}"}
    out = {"engine": eng.name, "installed_mb": round(installed_mb(eng.package) or 0, 1)}
    compiled = {}
    for name, schema in SCHEMAS.items():
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            compiled[name] = eng.compile(schema)
            times.append(time.perf_counter() - t0)
        out[f"compile_ms_{name}"] = round(1000 * statistics.median(times), 1)
    for name in ("labeling", "review"):
        tokens = answer_tokens(tok, name)
        matchers = [eng.matcher(compiled[name]) for _ in range(ROWS)]
        masks = np.zeros((ROWS, eng.words), np.int32)
        t0 = time.perf_counter()
        for t in tokens:
            for r, m in enumerate(matchers):
                eng.mask(m, masks[r])
                eng.advance(m, t)
        sec = time.perf_counter() - t0
        out[f"mask_us_per_token_{name}"] = round(1e6 * sec / (len(tokens) * ROWS), 1)
        out[f"mask_ms_per_step_64_rows_{name}"] = round(1e3 * sec / len(tokens), 2)
    ok = []
    for feature, schema in FEATURES.items():
        try:
            eng.compile(schema)
            ok.append(feature)
        except Exception:
            pass
    out["features_compiled"] = f"{len(ok)}/{len(FEATURES)}"
    out["features_missing"] = [f for f in FEATURES if f not in ok]
    return out


def main() -> None:
    tok = tokenizer()
    results = [measure(cls, tok) for cls in (Llguidance, OutlinesCore, Xgrammar)]
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
