"""`applespec calibrate` with CliRunner on the tiny model: a stored adapter the engine then
drafts with, the JSON report, and one clear line for every kind of bad input."""

import json

import pytest
from click.testing import CliRunner

from api.cli import cli
from tests.api.jobfiles import chat, write_job

WORDS = ["red", "blue", "green", "big", "small", "old"]
LINES = [chat(f"c{i}", f"Describe the {WORDS[i % 6]} thing number {i}.") for i in range(20)]


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("APPLESPEC_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _calibrate(*args):
    return CliRunner().invoke(cli, ["calibrate", "--model", "tiny-random", *args])


def _report(*args) -> dict:
    """`calibrate ... --json` that succeeds, its report."""
    result = _calibrate(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_calibrate_stores_an_adapter_the_engine_drafts_with(tmp_path, home):
    job = write_job(tmp_path / "job.jsonl", LINES)
    args = ["--data", job, "--exit-layer", "2", "--tokens", "2000", "--max-tokens", "12"]
    result = _calibrate(*args, "--samples", "1", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["layer"] == 2
    assert report["held_out_prompts"] == 4 and report["train_prompts"] == 16
    assert report["after"] > report["before"]
    assert report["curve"][0][0] == 0 and report["curve"][-1][0] == report["tokens"]
    assert len(report["curve"]) >= 3
    assert list(home.glob("adapters/*/early-exit-L2-*.safetensors"))
    _drafts_losslessly("adapter:2", "Describe the red thing.")


def _drafts_losslessly(draft: str, text: str) -> None:
    """The stored drafter drafts on `text` and the output is plain greedy's."""
    from core.engine import CostSurface, Engine, GenerationParams
    from core.models import load_model

    target = load_model("tiny-random")
    prompt = target.encode_prompt(text)
    params = GenerationParams(max_tokens=16)
    flat = CostSurface.flat()
    want = Engine(target, draft="none", surface=flat, batch_size=1).generate(prompt, params)
    got = Engine(target, draft=draft, k=2, surface=flat, batch_size=1).generate(prompt, params)
    assert got.tokens == want.tokens
    assert got.speculative["draft_tokens"] > 0


def test_calibrate_prints_the_learning_curve(tmp_path):
    job = write_job(tmp_path / "job.jsonl", LINES)
    result = _calibrate(
        "--data", job, "--tokens", "800", "--max-tokens", "8", "--samples", "0", "--no-save"
    )
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "held-out top-1 agreement" in out and "learning curve" in out
    assert "stored:" not in out


def _one_line_error(result, *needles):
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    err = result.stderr.strip().splitlines()
    assert len(err) == 1 or err[0].startswith("Usage"), result.output
    for n in needles:
        assert n in result.output, result.output


def test_missing_data_file(tmp_path):
    _one_line_error(_calibrate("--data", str(tmp_path / "nope.jsonl")), "does not exist")


def test_empty_data_file(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    _one_line_error(_calibrate("--data", str(path)), "has no request lines")


def test_malformed_data_file(tmp_path):
    job = write_job(tmp_path / "bad.jsonl", [*LINES[:3], "{not json"])
    _one_line_error(_calibrate("--data", job), "line 4", "bad.jsonl")


@pytest.mark.parametrize("layer", ["0", "4", "-1", "2,4"])
def test_exit_layer_out_of_range(tmp_path, layer):
    job = write_job(tmp_path / "job.jsonl", LINES)
    _one_line_error(_calibrate("--data", job, "--exit-layer", layer), "between 1 and 3")


def test_unknown_model(tmp_path):
    job = write_job(tmp_path / "job.jsonl", LINES)
    result = CliRunner().invoke(cli, ["calibrate", "--model", "no-such-model-xyz", "--data", job])
    _one_line_error(result, "no-such-model-xyz")


def test_one_distinct_prompt_is_not_enough(tmp_path):
    job = write_job(tmp_path / "job.jsonl", [chat(f"d{i}", "same prompt") for i in range(3)])
    _one_line_error(_calibrate("--data", job, "--tokens", "100"), "at least two distinct prompts")


@pytest.mark.slow
def test_draft_adapter_without_one_names_calibrate(tmp_path):
    """With online learning off, `adapter:L` needs a stored adapter; `adapter` (no layer)
    always does. With learning on (the default), `adapter:L` starts untrained and runs."""
    job = write_job(tmp_path / "job.jsonl", LINES[:2])
    out = tmp_path / "out.jsonl"
    run = ["run", job, "-o", str(out), "--model", "tiny-random"]
    off = CliRunner(env={"APPLESPEC_LEARN_SHARE": "0"})
    _one_line_error(off.invoke(cli, [*run, "--draft", "adapter:2"]), "applespec calibrate")
    _one_line_error(CliRunner().invoke(cli, [*run, "--draft", "adapter"]), "applespec calibrate")
    learning = CliRunner().invoke(cli, [*run, "--draft", "adapter:2"])
    assert learning.exit_code == 0, learning.output
    assert len(out.read_text().splitlines()) == 2


def test_several_layers_answer_once_and_the_choice_is_the_promise(tmp_path, home):
    job = write_job(tmp_path / "job.jsonl", LINES)
    args = ["--data", job, "--exit-layer", "1,2", "--tokens", "600", "--max-tokens", "8"]
    report = _report(*args, "--samples", "0")
    by_layer = {r["layer"]: r for r in report["layers"]}
    assert set(by_layer) == {1, 2}
    assert "answers_s" in by_layer[1]["seconds"] and "answers_reused_s" in by_layer[2]["seconds"]
    assert by_layer[1]["draft_share"] < by_layer[2]["draft_share"]
    best = max(report["layers"], key=lambda r: (r["speedup"], r["after"]))
    assert report["chosen"] == best["layer"]
    assert len(list(home.glob("adapters/*/early-exit-L*.safetensors"))) == 2

    from core.engine.adapters.store import best as best_stored
    from core.models import load_model

    assert best_stored(load_model("tiny-random")).layer == report["chosen"]


@pytest.mark.parametrize("spec", ["2,x", "two", "1,,2"])
def test_exit_layer_list_that_is_not_numbers(tmp_path, spec):
    job = write_job(tmp_path / "job.jsonl", LINES)
    _one_line_error(_calibrate("--data", job, "--exit-layer", spec), "comma-separated")


def test_answers_are_kept_and_reused(tmp_path):
    job = write_job(tmp_path / "job.jsonl", LINES)
    answers = tmp_path / "answers.json"
    args = ["--data", job, "--tokens", "300", "--max-tokens", "6", "--samples", "1"]
    args += ["--exit-layer", "2"]
    first = _calibrate(*args, "--answers", str(answers), "--json", "--no-save")
    assert first.exit_code == 0, first.output
    assert answers.exists() and "answers_s" in json.loads(first.stdout)["seconds"]
    again = _calibrate(*args, "--answers", str(answers), "--json", "--no-save")
    assert again.exit_code == 0, again.output
    assert {"answers_reused_s", "features_reused_s"} <= set(json.loads(again.stdout)["seconds"])
    assert (tmp_path / "answers.json.L2.safetensors").exists()
    assert json.loads(again.stdout)["after"] == json.loads(first.stdout)["after"]  # seeded
    other = _calibrate(*args, "--answers", str(answers), "--json", "--no-save", "--seed", "1")
    assert "answers_s" in json.loads(other.stdout)["seconds"]  # other settings: answered again


def test_calibrate_head_stores_a_feature_head_the_engine_drafts_with(tmp_path, home):
    """`--exit-layer 2,head`: one adapter and the feature head on the same answers; the
    head is stored under its own kind and `--draft head` drafts with it, losslessly."""
    job = write_job(tmp_path / "job.jsonl", LINES)
    args = ["--data", job, "--exit-layer", "2,head", "--tokens", "1500", "--max-tokens", "12"]
    report = _report(*args, "--samples", "0")
    by_kind = {r["kind"]: r for r in report["layers"]}
    assert set(by_kind) == {"early-exit", "feature-head"}
    assert by_kind[report["chosen_kind"]]["layer"] == report["chosen"]
    fh = by_kind["feature-head"]
    assert fh["layer"] == 4 and fh["early_exit"] is None and fh["second"] is not None
    assert fh["after"] > fh["before"] and fh["kl_after"] < fh["kl_before"]
    assert fh["draft_share"] < by_kind["early-exit"]["draft_share"]
    assert list(home.glob("adapters/*/feature-head-L4-*.safetensors"))
    _drafts_losslessly("head", "Describe the blue thing.")


def test_calibrate_head_with_a_draft_vocabulary(tmp_path, home):
    """`--exit-layer head --draft-vocab N`: the head is trained and stored over the N tokens
    its answers hold most (a smaller share of the weights per draft token) and drafts with
    them, losslessly."""
    from core.engine.adapters import load, stored
    from core.models import load_model

    job = write_job(tmp_path / "job.jsonl", LINES)
    args = ["--data", job, "--exit-layer", "head", "--tokens", "1500", "--max-tokens", "12"]
    whole = _report(*args, "--samples", "0", "--no-save")
    report = _report(*args, "--samples", "0", "--draft-vocab", "30")
    n = report["draft_vocab"]  # at most 30: the tokens its answers hold
    assert report["kind"] == "feature-head" and 1 < n <= 30
    assert report["draft_share"] < whole["draft_share"]
    assert report["after"] > report["before"]
    assert report["after"] <= report["vocab_coverage"] <= 1.0
    target = load_model("tiny-random")
    ((meta, path),) = stored(target, kind="feature-head")
    assert meta["vocab_size"] == n and load(path, target).vocab.size == n
    _drafts_losslessly("head", "Describe the blue thing.")
    text = _calibrate(*args, "--samples", "0", "--draft-vocab", "30", "--no-save").stdout
    assert f"the feature head drafts the {n} tokens" in text


def test_calibrate_head_prints_the_second_token(tmp_path):
    job = write_job(tmp_path / "job.jsonl", LINES)
    args = ["--data", job, "--exit-layer", "head", "--tokens", "400", "--max-tokens", "6"]
    result = _calibrate(*args, "--samples", "0", "--no-save")
    assert result.exit_code == 0, result.output
    assert "feature head over the last layer's states" in result.stdout
    assert "second draft token" in result.stdout and "early exit at" not in result.stdout


@pytest.mark.parametrize("spec", ["head,x", "heads"])
def test_exit_layer_head_misspelled(tmp_path, spec):
    job = write_job(tmp_path / "job.jsonl", LINES)
    _one_line_error(_calibrate("--data", job, "--exit-layer", spec), "comma-separated")


def test_the_head_trains_for_passes_over_its_answers_unless_told(tmp_path):
    """Without --tokens the head sees its training positions HEAD_PASSES times over (an
    adapter: a fixed 60k); --tokens still sets it."""
    from api.calibrate_cmd import HEAD_PASSES

    job = write_job(tmp_path / "job.jsonl", LINES)
    args = ["--data", job, "--exit-layer", "head", "--max-tokens", "6", "--samples", "0"]
    report = _report(*args, "--no-save")
    passes = report["tokens"] / report["train_positions"]
    assert HEAD_PASSES - 1.5 <= passes <= HEAD_PASSES + 0.5, report["tokens"]
    assert len(report["curve"]) >= 5
    told = _report(*args, "--no-save", "--tokens", "300")
    assert told["tokens"] <= 400
