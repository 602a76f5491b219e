"""One settings object, read from the environment (`APPLESPEC_*`), checked when it is made.

A bad value is a `SettingsError` naming the variable and the rule, one line; the CLI prints it
as an error, never a traceback. URLs with credentials are shown masked (`mask_url`,
`Settings.redact`) in every message and in the object's repr.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

DEFAULT_MODEL = "smollm2-135m"  # the model a command, worker or job runs when none is named

MASK = "***"


class SettingsError(ValueError):
    """An APPLESPEC_* value that cannot be used; the message names the variable."""


def default_database_url(env: Mapping[str, str] = os.environ) -> str:
    """SQLite under the user's data dir: `$XDG_DATA_HOME/applespec/applespec.db`.

    `~/.local/share/applespec/applespec.db` when XDG_DATA_HOME is unset. One fixed place (not
    the working directory) so `run`, `submit`, `results` and local workers all see the same jobs.
    """
    base = Path(env.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return f"sqlite:///{base / 'applespec' / 'applespec.db'}"


_SECRET_KEYS = re.compile(r"pass|secret|token|key", re.IGNORECASE)


def mask_url(url: str) -> str:
    """`url` with its password (and password-like query values) replaced by ***."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        if ":" in userinfo:
            netloc = f"{userinfo.split(':', 1)[0]}:{MASK}@{host}"
    query = parts.query
    if query and _SECRET_KEYS.search(query):
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, MASK if _SECRET_KEYS.search(k) else v) for k, v in pairs])
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def url_secrets(url: str) -> list[str]:
    """The secrets written in a URL (password, password-like query values), raw and decoded."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found = []
    userinfo = parts.netloc.rsplit("@", 1)[0] if "@" in parts.netloc else ""
    if ":" in userinfo:
        found.append(userinfo.split(":", 1)[1])
    for k, v in parse_qsl(parts.query, keep_blank_values=True):
        if _SECRET_KEYS.search(k):
            found.append(v)
    found += [unquote(s) for s in found]
    return sorted({s for s in found if s}, key=len, reverse=True)


@dataclass(frozen=True, repr=False)
class Settings:
    """Everything the service reads from the environment.

    Attributes:
        database_url: APPLESPEC_DATABASE_URL; SQLite by default, `postgresql+psycopg://...`
            for a farm.
        broker_url: APPLESPEC_BROKER_URL, the Celery broker (Redis).
        model: APPLESPEC_MODEL, the default model spec.
        max_attempts: APPLESPEC_MAX_ATTEMPTS, starts after which an item that keeps killing
            its worker is marked failed.
        visibility_timeout: APPLESPEC_VISIBILITY_TIMEOUT (s), after which Redis hands an
            unacknowledged chunk to another worker: the last resort behind leases.
        chunk_size: APPLESPEC_CHUNK_SIZE, items per Celery task.
        sweep_interval: APPLESPEC_SWEEP_INTERVAL (s), how often a worker re-queues items whose
            lease expired and checks that the broker still holds the queued chunks.
        lease_timeout: APPLESPEC_LEASE_TIMEOUT (s), how long a worker's claim on an item lasts
            without a heartbeat; a dead worker's items are re-queued this long after its last
            heartbeat (plus at most one sweep interval).
        heartbeat_interval: APPLESPEC_HEARTBEAT_INTERVAL (s), how often a worker renews the
            leases of the items it holds; under half the lease timeout.
        idle_warning: APPLESPEC_IDLE_WARNING (s), after which `wait` warns that no worker has
            consumed the job's queue.
        max_line_bytes: APPLESPEC_MAX_LINE_BYTES, the longest input line; longer ones are
            per-line errors, read no further than the limit.
        max_lines: APPLESPEC_MAX_LINES, the most requests in one job file.
        max_file_bytes: APPLESPEC_MAX_FILE_BYTES, the largest job file.
        max_tokens_limit: APPLESPEC_MAX_TOKENS_LIMIT, the largest max_tokens a request may ask.
        model_aliases: APPLESPEC_MODEL_ALIASES, `NAME=MODEL,...`: names (OpenAI model names,
            say) that stand for a model this farm serves, in `--model` and in a body's "model".
        strict_models: APPLESPEC_STRICT_MODELS=1 makes a body "model" that is neither the job's
            model nor one of its aliases a per-line error; by default such a line runs on the
            job's model (the response names the model that ran).
        draft_model_dirs: APPLESPEC_DRAFT_MODEL_DIRS, directories (os.pathsep-separated) whose
            models a job may name in `draft-model:NAME` besides the registry aliases.
        batch_size: APPLESPEC_BATCH_SIZE, rows of a worker's continuous batch; 0 = chosen
            from the machine's measured verify-cost surface.
        learn_share: APPLESPEC_LEARN_SHARE, the share of a worker's wall time its
            self-drafter (`adapter[:L]`, `auto` with a stored one) may spend learning from
            the rows it finishes (0 = no online learning; at most 1).
        kv_budget_mb: APPLESPEC_KV_BUDGET_MB, the KV cache a batch of a worker (or `run`)
            may hold, in MiB; 0 = half the device's memory less the weights. A request that
            cannot fit alone fails with `request_too_large`; others wait for room.
        share_answers: APPLESPEC_SHARE_ANSWERS=0 keeps each worker's suffix index to its own
            answers; by default the workers of a job read each other's from the store.
        serve_models: APPLESPEC_SERVE_MODELS, comma-separated model specs the HTTP API runs a
            batch on when its lines name one (`model` is always served); any other body.model
            runs on `model`.
    """

    database_url: str
    broker_url: str = "redis://127.0.0.1:6379/0"
    model: str = DEFAULT_MODEL
    max_attempts: int = 3
    visibility_timeout: int = 3600
    chunk_size: int = 8
    sweep_interval: float = 10.0
    lease_timeout: float = 20.0
    heartbeat_interval: float = 5.0
    idle_warning: float = 30.0
    max_line_bytes: int = 1 << 20
    max_lines: int = 50_000
    max_file_bytes: int = 200 * (1 << 20)
    max_tokens_limit: int = 32_768
    model_aliases: Mapping[str, str] = field(default_factory=dict, hash=False)
    strict_models: bool = False
    draft_model_dirs: tuple[str, ...] = ()
    serve_models: tuple[str, ...] = ()
    batch_size: int = 0
    learn_share: float = 0.1
    kv_budget_mb: int = 0
    share_answers: bool = True

    @property
    def kv_budget_bytes(self) -> int | None:
        """The KV budget in bytes, None for the engine's default."""
        return self.kv_budget_mb * 2**20 if self.kv_budget_mb else None

    def __post_init__(self) -> None:
        for name, (minimum, _kind) in _NUMBERS.items():
            value = getattr(self, name)
            if not _number_ok(value, minimum, whole=_kind is int):
                raise SettingsError(_rule(name, value))
        if self.learn_share > 1:
            raise SettingsError(_rule("learn_share", self.learn_share))
        if self.heartbeat_interval * 2 > self.lease_timeout:
            raise SettingsError(
                f"APPLESPEC_HEARTBEAT_INTERVAL ({self.heartbeat_interval:g} s) must be at most "
                f"half of APPLESPEC_LEASE_TIMEOUT ({self.lease_timeout:g} s), so one late "
                "heartbeat does not lose a lease"
            )
        for name in ("database_url", "broker_url"):
            url = getattr(self, name)
            if not isinstance(url, str) or "://" not in url:
                raise SettingsError(
                    f"APPLESPEC_{name.upper()} must be a URL (scheme://...), got {mask_url(str(url))!r}"
                )
        if not isinstance(self.model, str) or not self.model.strip():
            raise SettingsError("APPLESPEC_MODEL must be a model spec, got an empty value")

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Settings:
        """The settings of `env`; unset or empty variables take the defaults.

        Raises:
            SettingsError: a value that is not a number where one is needed, out of range, or
                malformed (one line naming the variable).
        """

        def get(name: str) -> str | None:
            value = env.get(f"APPLESPEC_{name.upper()}")
            return value.strip() if value and value.strip() else None

        values: dict[str, Any] = {
            "database_url": get("database_url") or default_database_url(env),
        }
        for name in ("broker_url", "model"):
            if get(name) is not None:
                values[name] = get(name)
        for name, (_minimum, kind) in _NUMBERS.items():
            raw = get(name)
            if raw is not None:
                values[name] = _parse_number(name, raw, kind)
        if get("model_aliases") is not None:
            values["model_aliases"] = parse_aliases(get("model_aliases"))
        for name in ("strict_models", "share_answers"):
            if get(name) is not None:
                values[name] = _parse_bool(name, get(name))
        if get("draft_model_dirs") is not None:
            dirs = [d for d in get("draft_model_dirs").split(os.pathsep) if d.strip()]
            values["draft_model_dirs"] = tuple(str(Path(d).expanduser()) for d in dirs)
        if get("serve_models") is not None:
            values["serve_models"] = tuple(
                m.strip() for m in get("serve_models").split(",") if m.strip()
            )
        return cls(**values)

    def resolve_model(self, name: str) -> str:
        """The model spec a name stands for: an alias's model, else the name itself."""
        return self.model_aliases.get(name, name)

    def job_limits(self):
        """The job-file limits (core.jobs.JobLimits) these settings set."""
        from core.jobs import JobLimits

        return JobLimits(
            line_bytes=self.max_line_bytes,
            lines=self.max_lines,
            file_bytes=self.max_file_bytes,
            max_tokens=self.max_tokens_limit,
        )

    def redact(self, text: str) -> str:
        """`text` with the credentials of the configured URLs masked (for any message)."""
        for url in (self.database_url, self.broker_url):
            if url_secrets(url):
                text = text.replace(url, mask_url(url))
                for secret in url_secrets(url):
                    text = text.replace(secret, MASK)
        return text

    def __repr__(self) -> str:
        shown = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("database_url", "broker_url"):
                value = mask_url(value)
            shown.append(f"{f.name}={value!r}")
        return f"Settings({', '.join(shown)})"


# name -> (smallest allowed value, type); every one is a positive number.
_NUMBERS: dict[str, tuple[float, type]] = {
    "max_attempts": (1, int),
    "visibility_timeout": (1, int),
    "chunk_size": (1, int),
    "sweep_interval": (0.05, float),
    "lease_timeout": (0.2, float),
    "heartbeat_interval": (0.05, float),
    "idle_warning": (0.0, float),
    "max_line_bytes": (64, int),
    "max_lines": (1, int),
    "max_file_bytes": (64, int),
    "max_tokens_limit": (1, int),
    "batch_size": (0, int),
    "learn_share": (0.0, float),
    "kv_budget_mb": (0, int),
}


def _number_ok(value: Any, minimum: float, whole: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if whole and not isinstance(value, int):
        return False
    return math.isfinite(value) and value >= minimum


def _rule(name: str, value: Any) -> str:
    minimum, kind = _NUMBERS[name]
    if name == "learn_share":
        return f"APPLESPEC_LEARN_SHARE must be a share of the time between 0 and 1, got {value!r}"
    what = "a whole number" if kind is int else "a number of seconds"
    return f"APPLESPEC_{name.upper()} must be {what} >= {minimum:g}, got {value!r}"


def _parse_number(name: str, raw: str, kind: type) -> int | float:
    try:
        return int(raw) if kind is int else float(raw)
    except ValueError:
        raise SettingsError(_rule(name, raw)) from None


def _parse_bool(name: str, raw: str) -> bool:
    low = raw.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"APPLESPEC_{name.upper()} must be 1 or 0 (true/false), got {raw!r}")


def parse_aliases(raw: str) -> dict[str, str]:
    """`NAME=MODEL,NAME=MODEL` as a dict; a malformed entry is a SettingsError."""
    aliases: dict[str, str] = {}
    for entry in raw.split(","):
        if not entry.strip():
            continue
        name, sep, model = (s.strip() for s in entry.partition("="))
        if not sep or not name or not model:
            raise SettingsError(
                f"APPLESPEC_MODEL_ALIASES entry {entry.strip()!r} must be NAME=MODEL "
                "(e.g. gpt-3.5-turbo-0125=smollm2-135m)"
            )
        aliases[name] = model
    return aliases
