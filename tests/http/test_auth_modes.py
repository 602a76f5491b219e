"""When the API is open and when it needs a key (in-process app, no broker needed)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from fastapi.testclient import TestClient

from api.http.app import create_app
from core.settings import Settings
from core.store import keys
from core.store.database import make_engine, make_sessionmaker
from migrations import upgrade

LINE = json.dumps({"custom_id": "a", "prompt": "hi"}).encode() + b"\n"


@pytest.fixture
def settings(tmp_path):
    return dataclasses.replace(Settings.from_env({}), database_url=f"sqlite:///{tmp_path / 's.db'}")


def _app(settings, **kwargs) -> TestClient:
    return TestClient(create_app(settings, monitor=False, **kwargs))


def _upload(client, headers=None):
    return client.post(
        "/v1/files", files={"file": ("a.jsonl", LINE)}, data={"purpose": "batch"}, headers=headers
    )


def _new_key(settings, name="k", operator=False) -> str:
    upgrade(settings.database_url)
    engine = make_engine(settings.database_url)
    with make_sessionmaker(engine)() as s:
        _, token = keys.create_key(s, name, operator=operator)
    engine.dispose()
    return token


def test_open_on_loopback_until_the_first_key(settings):
    with _app(settings) as client:
        anonymous = _upload(client)
        assert anonymous.status_code == 200
        assert client.get("/v1/files").json()["data"][0]["id"] == anonymous.json()["id"]
        token = _new_key(settings)
        assert client.get("/v1/files").status_code == 401
        keyed = {"Authorization": f"Bearer {token}"}
        # Objects made before keys belong to the operator; no other key sees them.
        assert client.get("/v1/files", headers=keyed).json()["data"] == []
        assert client.get(f"/v1/files/{anonymous.json()['id']}", headers=keyed).status_code == 404
        ops = {"Authorization": f"Bearer {_new_key(settings, 'ops', operator=True)}"}
        assert client.get(f"/v1/files/{anonymous.json()['id']}", headers=ops).status_code == 200


def test_revoking_the_last_key_does_not_open_the_api(settings):
    token = _new_key(settings)
    engine = make_engine(settings.database_url)
    with make_sessionmaker(engine)() as s:
        keys.revoke_key(s, keys.list_keys(s)[0].id)
    engine.dispose()
    with _app(settings) as client:
        assert client.get("/v1/files").status_code == 401
        assert (
            client.get("/v1/files", headers={"Authorization": f"Bearer {token}"}).status_code == 401
        )


def test_require_keys_closes_the_api_even_without_keys(settings):
    with _app(settings, require_keys=True) as client:
        r = _upload(client)
        assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
        # The dashboard asks for a key too (api.http.signin); /metrics stays the farm's.
        page = client.get("/", follow_redirects=False)
        assert page.status_code == 303 and page.headers["location"].startswith("/signin")
        assert client.get("/metrics").status_code == 200
