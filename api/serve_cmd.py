"""`applespec serve`: the OpenAI Batch API, the dashboard and /metrics over HTTP (uvicorn)."""

from __future__ import annotations

import time

import click

from core.settings import Settings


@click.command("serve")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    envvar="APPLESPEC_HOST",
    help="Address to listen on; beyond loopback only with API keys (applespec keys create).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    envvar="APPLESPEC_PORT",
)
@click.option(
    "--log-level",
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
    default="info",
    show_default=True,
)
def serve_cmd(host: str, port: int, log_level: str) -> None:
    """Serve the OpenAI Batch API at /v1, the live dashboard at / and /metrics.

    Point an OpenAI client at it by changing its base URL only:

    \b
        from openai import OpenAI
        client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key=KEY)

    On a loopback address the API is open until the first key is made; beyond loopback
    every request needs a key, and `serve` refuses to start until one exists.

    \b
    Example:
        applespec keys create pipeline     # prints the key last
        applespec serve --host 0.0.0.0 --port 8000
    """
    import uvicorn

    from api.http.app import create_app, is_loopback
    from api.openers import open_store
    from core.store import keys

    settings = Settings.from_env()
    exposed = not is_loopback(host)
    if exposed:
        with open_store(settings, readonly=True)() as s:
            active = keys.active_keys(s)
        if not active:
            raise click.ClickException(
                f"refusing to listen on {host} without API keys: anyone who can reach it could "
                "read and run batches. Make one with `applespec keys create NAME`, or serve on "
                "127.0.0.1."
            )
    for attempt in range(3):  # `make farm` starts the worker's migration at the same moment
        try:
            open_store(settings)  # migrate; an unreachable store is a one-line error
            break
        except click.ClickException:
            if attempt == 2:
                raise
            time.sleep(2)
    app = create_app(settings, require_keys=exposed)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
