"""Which drafters a job may name: aliases and configured directories, never paths."""

import pytest

from core.draft_policy import DraftNotAllowed, resolve_draft
from core.settings import Settings


@pytest.fixture
def settings(tmp_path):
    (tmp_path / "mini.gguf").write_bytes(b"GGUF")
    (tmp_path / "mlx-draft").mkdir()
    (tmp_path / "mlx-draft" / "config.json").write_text("{}")
    return Settings(
        database_url="sqlite://",
        draft_model_dirs=(str(tmp_path),),
        model_aliases={"house-draft": "/opt/models/draft.gguf"},
    )


def test_allowed_drafters(settings, tmp_path):
    for spec in ("auto", "none", "ngram", "tree", "early-exit:4", "draft-model:smollm2-135m"):
        assert resolve_draft(spec, settings) == spec
    assert resolve_draft("draft-model:tiny-random:3", settings) == "draft-model:tiny-random:3"
    assert resolve_draft("draft-model:mini", settings) == f"draft-model:{tmp_path / 'mini.gguf'}"
    assert (
        resolve_draft("draft-model:mini.gguf", settings) == f"draft-model:{tmp_path / 'mini.gguf'}"
    )
    assert (
        resolve_draft("draft-model:mlx-draft", settings) == f"draft-model:{tmp_path / 'mlx-draft'}"
    )
    # The operator's own alias may name a path: it comes from the settings, not the job.
    assert (
        resolve_draft("draft-model:house-draft", settings) == "draft-model:/opt/models/draft.gguf"
    )


@pytest.mark.parametrize(
    ("spec", "what"),
    [
        ("draft-model:/etc/passwd", "a path"),
        ("draft-model:../../etc/passwd", "a path"),
        ("draft-model:~/x.gguf", "a path"),
        ("draft-model:sub/mini.gguf", "a path"),
        ("draft-model:..", "a path"),
        ("draft-model:nothere", "an unknown name"),
    ],
)
def test_paths_and_unknown_names_are_refused(settings, spec, what):
    with pytest.raises(DraftNotAllowed) as e:
        resolve_draft(spec, settings)
    assert str(e.value).startswith(
        f"--draft {spec}: {what}; a draft model must be a registry alias"
    )


def test_other_refusals(settings):
    with pytest.raises(DraftNotAllowed, match="unknown drafter 'magic'"):
        resolve_draft("magic", settings)
    with pytest.raises(DraftNotAllowed, match="unknown drafter 'tree:3,2,1'"):
        resolve_draft("tree:3,2,1", settings)
