"""The dashboard in a real headless browser (Debian's chromium through its chromedriver).

A job is submitted over HTTP while no worker serves its model, `/` shows it at 0 done; then
a worker starts and the page, never reloaded, shows its progress move to the end. The job
page's charts are then found drawn. Screenshots land in the test's temporary directory.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

from migrations import upgrade
from tests.worker.service import Store, Worker, service_env, unique_model

from .flow import request_line, write_jsonl
from .server import Server

pytestmark = [pytest.mark.service, pytest.mark.slow]

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
CHARTS = ("chart-acceptance", "chart-positions", "chart-time", "chart-workers", "chart-wait")


@pytest.fixture
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip(
            "no browser: Debian's chromium and chromium-driver are not installed "
            "(make setup installs them where apt is usable)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(arg)
    # `make test` preloads OpenBLAS; inside chromium it kills the GPU process at start.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    service = Service(executable_path=CHROMEDRIVER, env=env)
    driver = webdriver.Chrome(service=service, options=options)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_dashboard_shows_live_progress_and_job_figures(browser, tmp_path):
    from openai import OpenAI
    from selenium.webdriver.common.by import By

    db = f"sqlite:///{tmp_path / 'store.db'}"
    model = unique_model()
    # Four rows at a time, 0.05 s per item as its row joins: items finish in waves over
    # several of the page's 1 s refreshes
    env = service_env(db, APPLESPEC_MODEL=model, APPLESPEC_BATCH_SIZE="4")
    upgrade(db)
    server = Server(env, tmp_path / "server.log")
    worker = None
    store = Store(db)
    try:
        server.wait_ready()
        client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        total = 120
        lines = [request_line(f"r{i}", f"Review {i}: fine, fine, fine", 32) for i in range(total)]
        file = client.files.create(
            file=open(write_jsonl(tmp_path / "job.jsonl", lines), "rb"), purpose="batch"
        )
        batch = client.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )

        browser.get(server.url + "/")
        row = f'tr[data-job="{batch.id}"]'

        def read(selector: str, prop: str = "textContent"):
            # In one script: the page replaces its rows every second, so an element found
            # by one call may be gone by the next.
            return browser.execute_script(
                "const e = document.querySelector(arguments[0]);"
                "return e ? (arguments[1] === 'width' ? e.style.width : e[arguments[1]]) : null;",
                selector,
                prop,
            )

        def progress() -> str | None:
            return read(f"{row} .progress-text")

        assert wait_for(progress, 20, "the job's row") == f"0/{total}"
        browser.execute_script("window.notReloaded = true;")
        browser.save_screenshot(str(tmp_path / "dashboard-queued.png"))

        worker = Worker(env, model, tmp_path / "worker.log", item_delay=0.05)
        seen = [progress()]
        deadline = time.monotonic() + 150
        while seen[-1] != f"{total}/{total}":
            assert time.monotonic() < deadline, f"progress stuck at {seen[-1]}"
            now = progress()
            if now != seen[-1]:
                seen.append(now)
                if len(seen) == 3:
                    browser.save_screenshot(str(tmp_path / "dashboard-running.png"))
            time.sleep(0.2)
        assert browser.execute_script("return window.notReloaded === true;"), "the page reloaded"
        done = [int(p.split("/")[0]) for p in seen]
        assert done == sorted(done) and any(0 < n < total for n in done), seen
        assert read(f"{row} .fill", "width") == "100%"
        wait_for(lambda: read(f"{row} .status") == "completed", 10, "the completed status")
        assert wait_for(
            lambda: f"applespec.{model}" in (read("#workers") or ""), 15, "the job's worker online"
        )
        browser.save_screenshot(str(tmp_path / "dashboard.png"))

        browser.execute_script("document.querySelector(arguments[0]).click();", f"{row} a")
        wait_for(lambda: batch.id in browser.title, 10, "the job page")
        for chart in CHARTS:
            points = wait_for(
                lambda chart=chart: browser.execute_script(
                    "const c = Chart.getChart(arguments[0]);"
                    "return c ? c.data.datasets[0].data.filter((v) => v !== null).length : 0;",
                    chart,
                ),
                10,
                f"{chart} drawn",
            )
            assert points > 0, chart
            drawn = browser.execute_script(
                "const c = document.getElementById(arguments[0]);"
                "const blank = document.createElement('canvas');"
                "blank.width = c.width; blank.height = c.height;"
                "return c.width > 0 && c.toDataURL() !== blank.toDataURL();",
                chart,
            )
            assert drawn, f"{chart} is blank"
        assert browser.find_element(By.ID, "status").text == "completed"
        browser.save_screenshot(str(tmp_path / "job.png"))
        assert (tmp_path / "job.png").stat().st_size > 10_000
    finally:
        server.stop()
        if worker is not None:
            worker.stop()
        store.dispose()
