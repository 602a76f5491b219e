"""The dashboard behind keys (in-process app): open with no key, sign-in once keys exist, a
key sees its own batches, an operator key the whole farm and what was made before keys."""

from __future__ import annotations

import dataclasses

import pytest
from fastapi.testclient import TestClient

from api.http.app import create_app
from api.http.signin import COOKIE
from core.settings import Settings

from .dashboard_store import Owners


@pytest.fixture
def store(tmp_path):
    owners = Owners(f"sqlite:///{tmp_path / 's.db'}")
    yield owners
    owners.dispose()


def _client(store, **kwargs) -> TestClient:
    url = store.engine.url.render_as_string(hide_password=False)
    settings = dataclasses.replace(Settings.from_env({}), database_url=url)
    return TestClient(create_app(settings, monitor=False, **kwargs), follow_redirects=False)


def _ids(state: dict) -> set[str]:
    return {j["id"] for j in state["jobs"]}


def test_without_keys_the_dashboard_stays_open(store):
    job = store.batch(None)
    with _client(store) as client:
        assert client.get("/").status_code == 200
        assert job in _ids(client.get("/dashboard/state").json())
        assert client.get(f"/jobs/{job}").status_code == 200


def test_with_keys_every_dashboard_route_needs_a_signed_in_key(store):
    job = store.batch(None)
    store.key("pipeline")
    with _client(store) as client:
        for path in ("/", f"/jobs/{job}"):
            r = client.get(path)
            assert r.status_code == 303, path
            assert r.headers["location"].startswith("/signin?next=")
        for path in ("/dashboard/state", f"/dashboard/jobs/{job}"):
            r = client.get(path)
            assert r.status_code == 401, path
            assert job not in r.text
        assert client.get("/signin").status_code == 200


def test_a_key_sees_its_own_batches_and_the_operator_sees_the_farm(store):
    before = store.batch(None)  # made while no key existed
    a_id, a = store.key("team a")
    b_id, b = store.key("team b")
    _, ops = store.key("ops", operator=True)  # takes what was made before keys
    mine, theirs, cli = store.batch(a_id), store.batch(b_id), store.cli_job()
    with _client(store) as client:
        wrong = client.post("/signin", data={"key": "as-not-a-key", "next": "/"})
        assert wrong.status_code == 401 and COOKIE not in wrong.cookies
        signed = client.post("/signin", data={"key": a, "next": f"/jobs/{mine}"})
        assert signed.status_code == 303 and signed.headers["location"] == f"/jobs/{mine}"
        cookie = signed.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie
        state = client.get("/dashboard/state").json()
        assert _ids(state) == {mine}
        assert state["scope"] == "key" and state["workers"] == [] and state["queues"] == []
        assert client.get(f"/jobs/{mine}").status_code == 200
        for other in (theirs, cli, before):
            assert client.get(f"/jobs/{other}").status_code == 404
            assert client.get(f"/dashboard/jobs/{other}").status_code == 404
        assert theirs not in client.get("/").text
        assert client.post("/signout").status_code == 303
        client.cookies.clear()
        assert client.get("/dashboard/state").status_code == 401
        client.post("/signin", data={"key": ops, "next": "/"})
        state = client.get("/dashboard/state").json()
        assert _ids(state) >= {before, mine, theirs, cli} and state["scope"] == "farm"
        # A script may send the key as a bearer token instead of the cookie.
        client.cookies.clear()
        bearer = {"Authorization": f"Bearer {b}"}
        assert _ids(client.get("/dashboard/state", headers=bearer).json()) == {theirs}
        # What was made before keys is the operator's over the API too.
        op = {"Authorization": f"Bearer {ops}"}
        assert client.get(f"/v1/batches/{before}", headers=op).status_code == 200
        assert client.get(f"/v1/batches/{before}", headers=bearer).status_code == 404


def test_sign_in_never_redirects_off_the_server(store):
    _, token = store.key("k")
    with _client(store) as client:
        for target in ("//evil.example/", "https://evil.example/", "/\\evil.example"):
            r = client.post("/signin", data={"key": token, "next": target})
            assert r.status_code == 303 and r.headers["location"] == "/", target
