"""Per-item hooks: callables run with an item's custom_id as the item runs.

Production installs none. A test installs them in the process that runs items (for a
worker or `applespec run` subprocess, tests/support/hooked_cli.py does it before handing
over to the real command line) to crash the process on a chosen item or to slow every item
down. A worker runs them as an item's row joins the batch; `applespec run` as an item's
result is stored.
"""

from __future__ import annotations

from collections.abc import Callable

ItemHook = Callable[[str], None]  # called with the item's custom_id

_installed: list[ItemHook] = []


def install(hook: ItemHook) -> None:
    """Run `hook` for every item this process runs from now on, after those installed
    before it."""
    _installed.append(hook)


def uninstall(hook: ItemHook) -> None:
    _installed.remove(hook)


def item_hook(custom_id: str) -> Callable[[], None] | None:
    """A callable running the installed hooks for this item in order; None when none are
    installed (production)."""
    if not _installed:
        return None
    hooks = list(_installed)

    def run() -> None:
        for hook in hooks:
            hook(custom_id)

    return run
