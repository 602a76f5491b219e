import json

from click.testing import CliRunner

from api.cli import cli
from core.engine.benchmark import format_table, load_prompts, run_bench
from core.engine.tiny import load_tiny


def test_bench_rows_on_tiny_models():
    target, draft = load_tiny("tiny-random:0"), load_tiny("tiny-random:0")
    res = run_bench(
        target,
        load_prompts()[:3],
        ["ngram", "early-exit:2/2", "draft-model:same"],
        max_tokens=12,
        draft_model=draft,
        mlx_lm_draft_tokens=(2,),
    )
    rows = {r["name"]: r for r in res["rows"]}
    assert {
        "mlx_lm",
        "mlx_lm_speculative_k2",
        "ours_none",
        "ours_ngram",
        "ours_early-exit:2/2",
        "ours_draft-model:same",
        "ours_best",
        "mlx_lm_speculative",
    } <= set(rows)
    # greedy everywhere: every configuration reproduces mlx-lm's tokens
    assert all(r["identical_to_mlx_lm"] for r in rows.values())
    assert rows["mlx_lm"]["ratio_vs_mlx_lm"] == 1.0
    # a draft model identical to the target is always accepted
    assert rows["ours_draft-model:same"]["acceptance_rate"] == 1.0
    assert set(res["verify_cost_ms"]) == {1, 2, 4, 8, 16}
    assert "labeling" in res["by_category"]
    assert "ours_ngram" in format_table(res)


def test_bench_cli_json(tmp_path):
    out = tmp_path / "b.json"
    r = CliRunner().invoke(
        cli,
        [
            "bench",
            "--model",
            "tiny-random",
            "--max-tokens",
            "6",
            "--drafters",
            "ngram",
            "--json",
            "-o",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    assert [row["name"] for row in data["rows"]][:3] == ["mlx_lm", "ours_none", "ours_ngram"]


def test_bench_cli_bad_drafter():
    r = CliRunner().invoke(cli, ["bench", "--model", "tiny-random", "--drafters", "bogus"])
    assert r.exit_code != 0
    assert "unknown drafter" in r.output and "Traceback" not in r.output
