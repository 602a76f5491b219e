"""Signing in to the dashboard with a key, in Debian's chromium against a real `serve`.

A key's holder opens `/`, lands on the sign-in page, signs in once and sees its own batch
(not another key's); after signing out an operator key sees the whole farm.
"""

from __future__ import annotations

import pytest

from tests.worker.service import service_env

from .dashboard_store import Owners
from .server import Server
from .test_dashboard_browser import browser, wait_for  # noqa: F401 - the fixture

pytestmark = pytest.mark.service


@pytest.mark.slow
def test_a_browser_signs_in_with_a_key_and_sees_its_own_batches(browser, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By

    db = f"sqlite:///{tmp_path / 'store.db'}"
    store = Owners(db)
    a_id, a = store.key("team a")
    b_id, _ = store.key("team b")
    _, ops = store.key("ops", operator=True)
    mine, theirs = store.batch(a_id), store.batch(b_id)
    server = Server(service_env(db), tmp_path / "server.log")
    try:
        server.wait_ready()

        def rows() -> set[str]:
            return set(
                browser.execute_script(
                    "return [...document.querySelectorAll('tr[data-job]')]"
                    ".map((r) => r.dataset.job);"
                )
            )

        def sign_in(token: str) -> None:
            wait_for(lambda: "/signin" in browser.current_url, 10, "the sign-in page")
            browser.find_element(By.ID, "key").send_keys(token)
            browser.find_element(By.ID, "signin").click()
            wait_for(lambda: "/signin" not in browser.current_url, 10, "signed in")

        browser.get(server.url + "/")
        assert "/signin" in browser.current_url  # no key, no farm
        assert mine not in browser.page_source and theirs not in browser.page_source
        sign_in(a)
        assert wait_for(lambda: rows() or None, 10, "the key's jobs") == {mine}
        wait_for(  # the page's 1 s refresh, with the cookie: still only its own
            lambda: browser.execute_script(
                "return document.getElementById('live').title.startsWith('updated')"
            ),
            10,
            "a refresh",
        )
        assert rows() == {mine}
        browser.save_screenshot(str(tmp_path / "signed-in.png"))
        browser.get(f"{server.url}/jobs/{theirs}")
        assert "No such" in browser.page_source or "no job" in browser.page_source
        browser.get(server.url + "/")
        browser.find_element(By.ID, "signout").click()
        sign_in(ops)
        assert wait_for(lambda: rows() or None, 10, "the farm's jobs") == {mine, theirs}
        assert browser.find_element(By.ID, "workers") is not None
    finally:
        server.stop()
        store.dispose()
