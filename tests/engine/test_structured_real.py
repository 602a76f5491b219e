"""On the real default model, constrained answers are valid under their schema (the
`jsonschema` package) for a suite of schemas, and speculative decoding (`auto`) gives plain
constrained decoding's tokens."""

import json

import jsonschema
import pytest

from core.engine import CostSurface, Engine, GenerationParams
from core.models import load_model

pytestmark = pytest.mark.real_model

FLAT = CostSurface.flat()
NAME = {"type": "string", "minLength": 1, "maxLength": 20}
SUITE = {
    "enum": (
        "Is this review positive or negative? 'The battery died after a day.'",
        {"type": "object", "properties": {"sentiment": {"enum": ["positive", "negative"]}}},
    ),
    "nested": (
        "Extract the person as JSON. Text: John Smith lives at 4 Elm Road, Boston.",
        {
            "type": "object",
            "properties": {
                "name": NAME,
                "address": {
                    "type": "object",
                    "properties": {"street": NAME, "city": NAME},
                    "required": ["street", "city"],
                    "additionalProperties": False,
                },
            },
            "required": ["name", "address"],
            "additionalProperties": False,
        },
    ),
    "array": (
        "List two or three fruits.",
        {
            "type": "object",
            "properties": {
                "fruits": {"type": "array", "items": NAME, "minItems": 2, "maxItems": 3}
            },
            "required": ["fruits"],
        },
    ),
    "strings": (
        "Give a product name and a short slogan.",
        {
            "type": "object",
            "properties": {
                "product": {"type": "string", "minLength": 3, "maxLength": 12},
                "slogan": {"type": "string", "minLength": 5, "maxLength": 30},
            },
            "required": ["product", "slogan"],
            "additionalProperties": False,
        },
    ),
    "numbers": (
        "Rate the movie Titanic from 1 to 10, and give its year and a score from 0 to 1.",
        {
            "type": "object",
            "properties": {
                "rating": {"type": "integer", "minimum": 1, "maximum": 10},
                "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
                "score": {"type": "number", "minimum": 0, "maximum": 1},
            },
            "required": ["rating", "year", "score"],
            "additionalProperties": False,
        },
    ),
    "labeling": (
        "Label the support ticket: 'I was charged twice this month. This is urgent.' From Noah.",
        {
            "type": "object",
            "properties": {
                "category": {"enum": ["billing", "shipping", "technical", "account"]},
                "urgency": {"enum": ["low", "medium", "high"]},
                "customer": NAME,
            },
            "required": ["category", "urgency", "customer"],
            "additionalProperties": False,
        },
    ),
}


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2-135m")


def _fmt(schema):
    return {"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": True}}


@pytest.mark.slow
def test_every_answer_validates_and_auto_equals_none(smollm2):
    reqs = [
        (
            smollm2.encode_chat([{"role": "user", "content": prompt}]),
            GenerationParams(max_tokens=160, response_format=_fmt(schema)),
        )
        for prompt, schema in SUITE.values()
    ]
    reqs.append(
        (
            smollm2.encode_chat(
                [
                    {
                        "role": "user",
                        "content": "What is the capital of France? Answer as JSON with the key capital.",
                    }
                ]
            ),
            GenerationParams(max_tokens=160, response_format={"type": "json_object"}),
        )
    )
    none = Engine(smollm2, draft="none", surface=FLAT, batch_size=1).generate_many(reqs)
    auto = Engine(smollm2, draft="auto", surface=FLAT, batch_size=1).generate_many(reqs)
    for name, r in zip([*SUITE, "json_object"], none, strict=True):
        assert r.finish_reason == "stop", (name, r.text)
        answer = json.loads(r.text)
        if name in SUITE:
            jsonschema.validate(answer, SUITE[name][1])
        else:
            assert isinstance(answer, dict)
    assert [r.tokens for r in auto] == [r.tokens for r in none]
    forced = sum(r.speculative["forced_tokens"] for r in auto)
    assert forced > 0 and sum(r.speculative.get("verify_steps", 0) for r in auto) < sum(
        len(r.tokens) for r in auto
    )
