"""Take the README's dashboard screenshots against a running farm (headless Debian chromium).

    APPLESPEC_MODEL=tiny-random:779 APPLESPEC_CHUNK_SIZE=4 make farm   # in one terminal
    .venv/bin/python docs/dashboard_screenshots.py     # in another: docs/dashboard*.png

It submits three demo batches through the `openai` package, waits until the last one is
about half done and saves `/` (with it running) and the first job's page.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from openai import OpenAI
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

HERE = Path(__file__).resolve().parent


def submit(client: OpenAI, workdir: Path, name: str, n: int, max_tokens: int, text: str):
    path = workdir / f"{name}.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {
                    "custom_id": f"{name}-{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {
                        "model": "gpt-4o-mini",
                        "messages": [{"role": "user", "content": text.format(i=i)}],
                        "max_tokens": max_tokens,
                    },
                }
            )
            + "\n"
            for i in range(n)
        )
    )
    file = client.files.create(file=path.open("rb"), purpose="batch")
    return client.batches.create(
        input_file_id=file.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"name": name},
    )


def wait(client: OpenAI, batch_id: str, fraction: float = 1.0) -> None:
    while True:
        c = client.batches.retrieve(batch_id).request_counts
        if c.completed + c.failed >= fraction * c.total:
            return
        time.sleep(0.3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--key", default="unused", help="an API key, when the farm has keys")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    client = OpenAI(base_url=args.url + "/v1", api_key=args.key)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        first = submit(client, work, "reviews", 40, 24, "Label review {i}: the food was great.")
        wait(client, first.id)
        second = submit(client, work, "cities", 12, 32, "Extract the city: 'I left Lyon in {i}'.")
        wait(client, second.id)
        running = submit(
            client,
            work,
            "rewrite",
            400,
            48,
            "Rewrite politely: send report {i} by Friday, report {i} by Friday.",
        )
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"):
            options.add_argument(arg)
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}  # OpenBLAS kills it
        service = Service("/usr/bin/chromedriver", env=env)
        driver = webdriver.Chrome(service=service, options=options)
        try:
            driver.set_window_size(1300, 590)  # the window, browser chrome included
            driver.get(args.url + "/")
            wait(client, running.id, 0.45)
            time.sleep(3.5)  # the broker monitor's next round: workers and chunks
            driver.save_screenshot(str(args.out / "dashboard.png"))
            driver.set_window_size(1300, 1400)
            driver.get(f"{args.url}/jobs/{first.id}")
            time.sleep(2)
            driver.save_screenshot(str(args.out / "dashboard-job.png"))
        finally:
            driver.quit()
    print(f"saved {args.out / 'dashboard.png'} and {args.out / 'dashboard-job.png'}")


if __name__ == "__main__":
    main()
