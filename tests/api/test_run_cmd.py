"""`applespec run` with CliRunner on the tiny model: good lines, every bad class, the store."""

import json

import pytest
from click.testing import CliRunner

from api.cli import cli
from tests.api.jobfiles import GOOD, mixed_lines, read_jsonl, write_job


def _run(*args):
    return CliRunner().invoke(cli, ["run", *args, "--model", "tiny-random"])


def test_run_good_lines(tmp_path):
    job = write_job(tmp_path / "job.jsonl", GOOD)
    out = tmp_path / "out.jsonl"
    result = _run(job, "-o", str(out), "--json", "--draft", "none")
    assert result.exit_code == 0, result.output
    lines = read_jsonl(out)
    assert [line["custom_id"] for line in lines] == ["g1", "g2", "g3"]
    for line in lines:
        assert line["error"] is None
        body = line["response"]["body"]
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert body["choices"][0]["finish_reason"] in ("stop", "length")
        u = body["usage"]
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
        assert {"drafter", "verify_steps"} <= set(body["speculative"])
        assert "total_s" in body["timing"]
    # max_tokens from the body: 6 and 5 tokens at most
    assert lines[0]["response"]["body"]["usage"]["completion_tokens"] <= 6
    assert lines[1]["response"]["body"]["usage"]["completion_tokens"] <= 5
    summary = json.loads(result.stdout)
    assert summary["status"] == "completed"
    assert summary["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    assert "tokens in" in result.stderr


def test_cli_options_override_the_body(tmp_path):
    job = write_job(tmp_path / "job.jsonl", GOOD)
    out = tmp_path / "out.jsonl"
    result = _run(job, "-o", str(out), "--max-tokens", "2")
    assert result.exit_code == 0, result.output
    for line in read_jsonl(out):
        assert line["response"]["body"]["usage"]["completion_tokens"] <= 2


def test_every_bad_class_is_reported_per_line_and_valid_lines_still_run(tmp_path):
    lines, expected = mixed_lines()
    job = write_job(tmp_path / "job.jsonl", lines)
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    result = _run(job, "-o", str(out), "--errors", str(err))
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert [line["custom_id"] for line in read_jsonl(out)] == ["g1", "g2", "g3"]
    errors = read_jsonl(err)
    assert len(errors) == len(expected)
    for (line_no, code), line in zip(sorted(expected.items()), errors, strict=True):
        assert line["response"] is None
        assert line["error"]["code"] == code
        assert line["error"]["message"].startswith(f"line {line_no}: ")


def test_without_errors_file_bad_lines_go_to_the_output_in_order(tmp_path):
    lines, expected = mixed_lines()
    job = write_job(tmp_path / "job.jsonl", lines)
    out = tmp_path / "out.jsonl"
    result = _run(job, "-o", str(out))
    assert result.exit_code == 1
    got = read_jsonl(out)
    assert len(got) == len(expected) + 3
    codes = [line["error"]["code"] if line["error"] else "ok" for line in got]
    want = ["ok"] + [expected[n] for n in sorted(expected)]
    want.insert(want.index("invalid_role") + 1, "ok")
    assert codes == want + ["ok"]


@pytest.mark.slow
def test_run_jobs_are_in_the_store(tmp_path):
    job = write_job(tmp_path / "job.jsonl", [*GOOD, "{bad"])
    out = tmp_path / "out.jsonl"
    result = _run(job, "-o", str(out), "--json")
    assert result.exit_code == 1
    job_id = json.loads(result.stdout)["id"]
    runner = CliRunner()
    status = runner.invoke(cli, ["status", job_id, "--json"])
    assert status.exit_code == 0, status.output
    s = json.loads(status.stdout)
    assert s["status"] == "completed" and s["mode"] == "embedded"
    assert s["request_counts"] == {"total": 4, "completed": 3, "failed": 1}
    again = tmp_path / "again.jsonl"
    res = runner.invoke(cli, ["results", job_id, "-o", str(again)])
    assert res.exit_code == 0, res.output
    assert read_jsonl(again) == read_jsonl(out)  # the store holds exactly what run wrote
    listed = runner.invoke(cli, ["jobs", "--json"])
    assert job_id in [j["id"] for j in json.loads(listed.stdout)]
    retry = runner.invoke(cli, ["retry", job_id])
    assert retry.exit_code == 1 and "was run with `applespec run`" in retry.output


def test_user_mistakes_are_one_line_errors(tmp_path):
    out = str(tmp_path / "out.jsonl")
    missing = _run(str(tmp_path / "nope.jsonl"), "-o", out)
    assert missing.exit_code == 2 and "does not exist" in missing.output
    empty = write_job(tmp_path / "empty.jsonl", ["", "  "])
    r = _run(empty, "-o", out)
    assert r.exit_code == 1 and "has no requests" in r.output
    job = write_job(tmp_path / "job.jsonl", GOOD)
    r = CliRunner().invoke(cli, ["run", job, "-o", out, "--model", "no-such-model"])
    assert r.exit_code == 1 and r.output.startswith("Error: ") and "no-such-model" in r.output
    r = _run(job, "-o", out, "--draft", "magic")
    assert r.exit_code == 2 and "unknown drafter 'magic'" in r.output
    r = _run(job, "-o", str(tmp_path / "no-such-dir" / "out.jsonl"))
    assert r.exit_code == 1 and r.output.startswith("Error: cannot write ")
    listed = CliRunner().invoke(cli, ["jobs", "--json"])
    assert listed.exit_code == 0 and listed.stdout.strip() == "[]"  # no job was left behind
    r = _run(job, "-o", out, "--top-p", "0")
    assert r.exit_code == 2 and "--top-p" in r.output
    for res in (missing, r):
        assert "Traceback" not in res.output
    for command in (["status"], ["wait"], ["results", "-o", out], ["cancel"], ["retry"]):
        unknown = CliRunner().invoke(cli, [*command[:1], "batch_nope", *command[1:]])
        assert unknown.exit_code == 1, command
        assert unknown.output == "Error: no job 'batch_nope'\n", command


def test_a_request_past_the_kv_budget_fails_alone_and_the_others_run(tmp_path, monkeypatch):
    """APPLESPEC_KV_BUDGET_MB: a line whose KV cache cannot fit is a per-line
    request_too_large error before it runs; the lines that fit are answered."""
    from core.engine.memory import bytes_per_position
    from core.models.tiny import tiny_model

    per = bytes_per_position(tiny_model())
    budget_mb = 1
    too_many = budget_mb * 2**20 // per  # positions the budget holds
    lines = [
        {"custom_id": "small", "prompt": "hello", "max_tokens": 4},
        {"custom_id": "huge", "prompt": "hello", "max_tokens": too_many},
        {"custom_id": "small2", "prompt": "hi", "max_tokens": 4},
    ]
    monkeypatch.setenv("APPLESPEC_KV_BUDGET_MB", str(budget_mb))
    job = write_job(tmp_path / "job.jsonl", [json.dumps(x) for x in lines])
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    result = _run(job, "-o", str(out), "--errors", str(err), "--draft", "none")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert [line["custom_id"] for line in read_jsonl(out)] == ["small", "small2"]
    (bad,) = read_jsonl(err)
    assert bad["custom_id"] == "huge" and bad["error"]["code"] == "request_too_large"
    assert "KV cache" in bad["error"]["message"]
