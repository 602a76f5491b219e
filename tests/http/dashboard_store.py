"""Batches of several owners made straight in the store, for the dashboard's key tests."""

from __future__ import annotations

import json

from core.jobs import parse_job
from core.store import batches, files, keys, repo
from core.store.database import make_engine, make_sessionmaker
from migrations import upgrade


class Owners:
    """A migrated store where `batch(key_id)` makes a batch (a job of one line) of a key."""

    def __init__(self, url: str):
        upgrade(url)
        self.engine = make_engine(url)
        self.sessions = make_sessionmaker(self.engine)

    def key(self, name: str, operator: bool = False) -> tuple[str, str]:
        """A new key: (key id, token)."""
        with self.sessions() as s:
            key, token = keys.create_key(s, name, operator=operator)
            return key.id, token

    def batch(self, key_id: str | None) -> str:
        line = json.dumps({"custom_id": "a", "prompt": "hi"})
        requests, errors = parse_job([line])
        with self.sessions() as s:
            f = files.store_upload(
                s, key_id=key_id, filename="a.jsonl", purpose="batch", f=_bytes(line), lines=1
            )
            job = repo.create_job(s, model="tiny-random", requests=requests, errors=errors)
            batches.add_batch(
                s,
                job,
                key_id=key_id,
                input_file_id=f.id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
                metadata=None,
            )
            s.commit()
            return job.id

    def cli_job(self) -> str:
        """A job submitted from the CLI: no batch, no key."""
        requests, errors = parse_job([json.dumps({"custom_id": "a", "prompt": "hi"})])
        with self.sessions() as s:
            job = repo.create_job(s, model="tiny-random", requests=requests, errors=errors)
            s.commit()
            return job.id

    def dispose(self) -> None:
        self.engine.dispose()


def _bytes(line: str):
    import io

    return io.BytesIO(line.encode() + b"\n")
