import json

import pytest
from click.testing import CliRunner

from api.cli import cli
from core.benchmark import JobFileError, format_table, load_job, run_bench
from core.engine import CostSurface
from core.models.tiny import load_tiny

JOB = [
    {
        "custom_id": f"r{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "category": "labeling",
        "body": {
            "model": "x",
            "messages": [{"role": "user", "content": f"Copy: item {i} is red. Again:"}],
            "max_tokens": 10 + i,
        },
    }
    for i in range(5)
]


@pytest.fixture
def job(tmp_path):
    path = tmp_path / "job.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in JOB) + "\n")
    return path


@pytest.fixture
def tiny_job(job, monkeypatch):
    """The tiny model and the job's items, with a flat cost surface (nothing measured)."""
    monkeypatch.setattr("core.engine.engine.load_or_measure", lambda *a, **k: CostSurface.flat())
    target = load_tiny("tiny-random:0")
    return target, load_job(target, job, None)


@pytest.mark.slow
def test_bench_rows_on_a_job_file(tiny_job):
    target, items = tiny_job
    assert [it.max_tokens for it in items] == [10, 11, 12, 13, 14]
    res = run_bench(target, items, mlx_lm_batches=[2, 4], our_batches=[2, 4], also_draft=["suffix"])
    rows = {r["name"]: r for r in res["rows"]}
    assert {
        "mlx_lm_single",
        "mlx_lm_batch_2",
        "mlx_lm_batch_4",
        "mlx_lm_batch",
        "ours_single",
        "ours_single_spec",
        "ours_batched_2",
        "ours_batched_4",
        "ours_batched",
        "ours_batched_spec_2",
        "ours_batched_spec_4",
        "ours_batched_spec",
        "ours_batched_draft-suffix_2",
        "ours_batched_draft-suffix_4",
        "ours_batched_draft-suffix",
    } <= set(rows)
    # greedy everywhere, float32 tiny model: every row reproduces plain single-row greedy
    assert all(r["identical_rows"] == 5 and r["identical_to_mlx_lm"] for r in rows.values())
    best = max(rows["mlx_lm_batch_2"]["tokens_per_s"], rows["mlx_lm_batch_4"]["tokens_per_s"])
    assert rows["mlx_lm_batch"]["tokens_per_s"] == best
    assert rows["mlx_lm_batch"]["ratio_vs_mlx_lm"] == 1.0
    assert rows["ours_batched_spec"]["drafters"]  # steps by drafter
    assert "ours_batched_spec" in format_table(res)
    assert set(rows["ours_batched_draft-suffix_2"]["drafters"]) <= {"suffix", "none"}


def test_accepted_length_over_the_job_halves_and_eighths():
    from core.benchmark import _curve

    per_item = [1.0] * 8 + [2.0] * 8
    c = _curve(per_item)
    assert c["accepted_length_first_half"] == 1.0 and c["accepted_length_later_half"] == 2.0
    assert c["accepted_length_curve"] == [1.0] * 4 + [2.0] * 4
    assert _curve([1.0] * 5) == {}  # nothing was ever accepted: no curve


def test_a_bench_file_that_is_not_a_job_is_one_clear_error(tmp_path):
    target = load_tiny("tiny-random:0")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"custom_id": "a", "method": "POST"}\nnot json\n')
    with pytest.raises(JobFileError, match="line 2"):
        load_job(target, bad, None)
    r = CliRunner().invoke(cli, ["bench", "--model", "tiny-random", "--input", str(bad)])
    assert r.exit_code == 1 and "line 2" in r.output and "Traceback" not in r.output


@pytest.mark.slow
def test_bench_cli_json(job, tmp_path, monkeypatch):
    monkeypatch.setattr("core.engine.engine.load_or_measure", lambda *a, **k: CostSurface.flat())
    out = tmp_path / "b.json"
    r = CliRunner().invoke(
        cli,
        [
            "bench",
            "--model",
            "tiny-random",
            "--input",
            str(job),
            "--max-tokens",
            "6",
            "--batch-sizes",
            "2",
            "--our-batch-sizes",
            "2",
            "--rows",
            "mlx_lm,ours_batched_spec",
            "--reference",
            "ours_single",
            "--json",
            "-o",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    names = [row["name"] for row in data["rows"]]
    assert {"mlx_lm_batch", "ours_batched_spec", "ours_single"} <= set(names)
    for row in data["rows"]:
        assert {
            "name",
            "batch_size",
            "tokens_per_s",
            "ratio_vs_mlx_lm",
            "identical_to_mlx_lm",
        } <= set(row)


@pytest.mark.slow
def test_phases_time_the_parts_of_our_steps(tiny_job):
    target, items = tiny_job
    res = run_bench(
        target,
        items,
        our_batches=[4],
        configs={"ours_batched", "ours_batched_spec"},
        reference="ours_single",
        phases=True,
    )
    batched = [r for r in res["rows"] if r["name"].startswith("ours_batched")]
    assert len(batched) == 4  # each config's row and its best-of row
    for r in batched:
        ph = r["phases"]
        # `seconds` is rounded to the millisecond, the phases' sums are not
        assert 0 < sum(sec for sec, _ in ph.values()) <= r["seconds"] + 5e-4
    plain = next(r for r in res["rows"] if r["name"] == "ours_batched_4")
    assert set(plain["phases"]) == {"plain"} and plain["phases"]["plain"][1] > 0
    spec = next(r for r in res["rows"] if r["name"] == "ours_batched_spec_4")
    ph = spec["phases"]
    assert ph["draft"][1] > 0 and ph["plan"][1] == ph["draft"][1] == ph["commit"][1]


@pytest.mark.slow
def test_repeat_times_every_configuration_in_rounds_and_gives_the_ratios_per_round(
    tiny_job, monkeypatch
):
    target, items = tiny_job
    from core.engine.engine import Engine

    order = []
    run = Engine.generate_many

    def spy(self, requests, *a, **k):
        requests = list(requests)
        if len(requests) == len(items):  # a timed run of the whole job
            order.append(self.draft_spec)
        return run(self, requests, *a, **k)

    monkeypatch.setattr("core.engine.engine.Engine.generate_many", spy)
    res = run_bench(
        target,
        items,
        our_batches=[4],
        configs={"ours_batched", "ours_batched_spec"},
        drafter="ngram",
        also_draft=["suffix"],
        reference="ours_single",
        reference_items=2,
        repeat=3,
    )
    # each configuration once per round, in turn (the reference ran on the job's first
    # items only)
    assert order == ["none", "ngram", "suffix"] * 3
    rows = {r["name"]: r for r in res["rows"] if "config" not in r}
    for name in ("ours_batched_4", "ours_batched_spec_4", "ours_batched_draft-suffix_4"):
        r = rows[name]
        assert len(r["rounds_tokens_per_s"]) == 3 and r["items_changed_between_rounds"] == 0
        per = sorted(r["rounds_tokens_per_s"])
        assert r["tokens_per_s"] == pytest.approx(per[1], rel=1e-3)  # the median round
    ratios = {(q["name"], q["over"]): q for q in res["round_ratios"]}
    assert set(ratios) == {
        ("ours_batched_spec_4", "ours_batched_4"),
        ("ours_batched_spec_4", "ours_batched_draft-suffix_4"),
        ("ours_batched_draft-suffix_4", "ours_batched_4"),
    }
    q = ratios[("ours_batched_spec_4", "ours_batched_4")]
    a, b = rows["ours_batched_spec_4"], rows["ours_batched_4"]
    want = [x / y for x, y in zip(a["rounds_tokens_per_s"], b["rounds_tokens_per_s"], strict=True)]
    assert q["per_round"] == pytest.approx(want, rel=1e-2)
    assert "tok/s by round" in format_table(res) and "median" in format_table(res)


def _structured_job(tmp_path):
    """The bench job with one schema on every line, and the tiny model it is read for."""
    schema = {
        "type": "object",
        "properties": {"label": {"enum": ["red", "blue"]}, "n": {"type": "integer", "maximum": 9}},
        "required": ["label", "n"],
        "additionalProperties": False,
    }
    lines = []
    for line in JOB:
        line = json.loads(json.dumps(line))
        line["body"]["max_tokens"] = 60
        line["body"]["response_format"] = {"type": "json_schema", "json_schema": {"schema": schema}}
        lines.append(json.dumps(line))
    path = tmp_path / "structured.jsonl"
    path.write_text("\n".join(lines) + "\n")
    target = load_tiny("tiny-random:0")
    return target, load_job(target, path, None)


@pytest.mark.slow
def test_response_format_lines_are_benched_constrained(tmp_path, monkeypatch):
    """A job with a schema: every row (mlx-lm's through llguidance's logits processor) gives
    the constrained reference's tokens, answers are counted valid, `ours_batched_free` drops
    the schema and is not compared."""
    monkeypatch.setattr("core.engine.engine.load_or_measure", lambda *a, **k: CostSurface.flat())
    target, items = _structured_job(tmp_path)
    assert all(it.response_format for it in items)
    res = run_bench(
        target,
        items,
        mlx_lm_batches=[2],
        our_batches=[2],
        configs={"mlx_lm", "ours_batched", "ours_batched_spec", "ours_batched_free"},
    )
    rows = {r["name"]: r for r in res["rows"] if "config" not in r}
    assert res["constrained_items"] == 5
    for name in ("mlx_lm_batch_2", "ours_batched_2", "ours_batched_spec_2"):
        assert rows[name]["identical_rows"] == 5, name
        assert rows[name]["valid_answers"] == 5, name
    assert rows["ours_batched_2"]["forced_tokens"] > 0
    assert rows["ours_batched_free_2"]["identical_rows"] is None
    assert "valid 5/5" in format_table(res)


def test_a_structured_job_checked_on_its_first_items_counts_each_rows_valid_answers(
    tmp_path, monkeypatch
):
    """With the single-row reference run on the first items only (and not asked for as a row
    of its own), the reference row counts the valid answers among those, the batched rows
    among all."""
    monkeypatch.setattr("core.engine.engine.load_or_measure", lambda *a, **k: CostSurface.flat())
    target, items = _structured_job(tmp_path)
    res = run_bench(
        target,
        items,
        our_batches=[2],
        configs={"ours_batched"},
        reference="ours_single",
        reference_items=2,
    )
    rows = {r["name"]: r for r in res["rows"] if "config" not in r}
    assert rows["ours_single"]["valid_answers"] == 2
    assert rows["ours_batched_2"]["valid_answers"] == 5
    assert rows["ours_batched_2"]["identical_rows"] == 2
