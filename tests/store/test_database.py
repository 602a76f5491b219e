"""A SQLite engine stops at a deleted or replaced file instead of writing into it."""

import os
import shutil

import pytest
from sqlalchemy import text

from core.store.database import StoreGone, make_engine, make_sessionmaker
from migrations import upgrade


def _select(sessions):
    with sessions() as s:
        return s.execute(text("select count(*) from jobs")).scalar()


@pytest.mark.parametrize("how", ["deleted", "replaced", "moved"])
def test_a_gone_file_is_store_gone(tmp_path, how):
    path = tmp_path / "a.db"
    upgrade(f"sqlite:///{path}")
    engine = make_engine(f"sqlite:///{path}")
    sessions = make_sessionmaker(engine)
    assert _select(sessions) == 0
    if how == "deleted":
        path.unlink()
    elif how == "replaced":  # a restored backup under the same name
        shutil.copy(path, tmp_path / "copy.db")
        os.replace(tmp_path / "copy.db", path)
    else:
        path.rename(tmp_path / "elsewhere.db")
    with pytest.raises(StoreGone, match=f"the SQLite database {path} was"):
        _select(sessions)
    engine.dispose()
    if how != "replaced":
        assert not path.exists()  # no empty database was created in its place


def test_a_new_connection_does_not_create_an_empty_file_in_its_place(tmp_path):
    from sqlalchemy.pool import NullPool

    path = tmp_path / "c.db"
    upgrade(f"sqlite:///{path}")
    engine = make_engine(f"sqlite:///{path}", poolclass=NullPool)  # a connection per session
    sessions = make_sessionmaker(engine)
    assert _select(sessions) == 0
    path.unlink()
    for _ in range(2):
        with pytest.raises(StoreGone, match="was deleted or moved"):
            _select(sessions)
    assert not path.exists()
    engine.dispose()


def test_a_new_file_is_fine_for_a_new_engine(tmp_path):
    url = f"sqlite:///{tmp_path / 'b.db'}"
    upgrade(url)
    engine = make_engine(url)
    assert _select(make_sessionmaker(engine)) == 0
    engine.dispose()
