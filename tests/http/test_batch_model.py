"""Which model a batch runs on (api.http.batches.batch_model)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from api.http.batches import batch_model
from api.http.errors import OpenAIError
from core.settings import Settings

SETTINGS = dataclasses.replace(
    Settings.from_env({}), model="tiny-random:1", serve_models=("tiny-random:2",)
)


def line(model=None, prompt=False) -> str:
    if prompt:
        return json.dumps({"custom_id": "p", "prompt": "x", **({"model": model} if model else {})})
    body = {"messages": [{"role": "user", "content": "x"}], **({"model": model} if model else {})}
    return json.dumps(
        {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": body}
    )


@pytest.mark.parametrize(
    ("lines", "model"),
    [
        ([line("gpt-4o-mini")], "tiny-random:1"),  # not served: the default
        ([line()], "tiny-random:1"),
        ([line("tiny-random:2"), line("gpt-4o-mini")], "tiny-random:2"),
        ([line("tiny-random:2", prompt=True)], "tiny-random:2"),
        (["{broken", line("tiny-random:1")], "tiny-random:1"),
    ],
)
def test_batch_model(lines, model):
    assert batch_model(lines, SETTINGS) == model


def test_two_served_models_in_one_file_are_refused():
    with pytest.raises(OpenAIError) as e:
        batch_model([line("tiny-random:1"), line("tiny-random:2")], SETTINGS)
    assert e.value.status == 400 and e.value.code == "multiple_models"
    assert "tiny-random:1, tiny-random:2" in e.value.message
