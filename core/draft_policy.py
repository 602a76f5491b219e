"""Which drafters a job may ask for: `draft-model:NAME` names a model, never a path.

A job comes from whoever can submit (the CLI today, HTTP later), and its drafter spec is
loaded on every worker. So a draft model is a registry alias, a `tiny-random[:SEED]` spec,
a model alias of the settings (APPLESPEC_MODEL_ALIASES), or a model inside one of the directories the operator
configured (APPLESPEC_DRAFT_MODEL_DIRS); a path is refused at submit without touching the
file system, and the worker checks again before loading.
"""

from __future__ import annotations

import re
from pathlib import Path

from core.settings import Settings

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


class DraftNotAllowed(ValueError):
    """A drafter spec a job may not use; the message says what it may name."""


def resolve_draft(spec: str, settings: Settings) -> str:
    """The drafter spec to load for a job's `spec`, with a directory model as its path.

    Raises:
        DraftNotAllowed: an unknown drafter, a path, or a name nobody configured.
    """
    from core.engine import parse_draft_spec
    from core.models.registry import REGISTRY

    try:
        kind, arg = parse_draft_spec(spec)
    except ValueError as e:
        raise DraftNotAllowed(str(e)) from None
    if kind != "draft-model":
        return spec
    if arg in settings.model_aliases:  # the operator's own name for a model
        return f"draft-model:{settings.model_aliases[arg]}"
    if arg in REGISTRY or re.fullmatch(r"tiny-random(:\d+)?", arg):
        return spec
    if _NAME.fullmatch(arg) and ".." not in arg:
        for directory in settings.draft_model_dirs:
            for candidate in (Path(directory) / arg, Path(directory) / f"{arg}.gguf"):
                if _is_model(candidate):
                    return f"draft-model:{candidate}"
    dirs = ", ".join(settings.draft_model_dirs) or "unset"
    what = "a path" if not _NAME.fullmatch(arg) or ".." in arg else "an unknown name"
    raise DraftNotAllowed(
        f"--draft draft-model:{arg[:80]}: {what}; a draft model must be a registry alias "
        f"({', '.join(REGISTRY)}), tiny-random[:SEED], an APPLESPEC_MODEL_ALIASES name, or a model in "
        f"APPLESPEC_DRAFT_MODEL_DIRS ({dirs})"
    )


def _is_model(path: Path) -> bool:
    if path.suffix == ".gguf":
        return path.is_file()
    return (path / "config.json").is_file()
