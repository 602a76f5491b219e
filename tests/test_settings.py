"""The settings object: defaults that recover fast, one clear line per bad value, masking."""

import pytest

from core.settings import Settings, SettingsError, mask_url, parse_aliases

URL = "sqlite:////tmp/x.db"


def test_defaults_take_back_a_dead_workers_items_well_under_a_minute():
    s = Settings.from_env({"APPLESPEC_DATABASE_URL": URL})
    # Worst case after the last heartbeat: the lease runs out, then the next sweep.
    assert s.lease_timeout + s.sweep_interval <= 30
    assert s.heartbeat_interval * 2 <= s.lease_timeout
    assert s.visibility_timeout == 3600  # the broker's last resort stays
    limits = s.job_limits()
    assert (limits.line_bytes, limits.lines, limits.file_bytes) == (1 << 20, 50_000, 200 << 20)


def test_every_variable_is_read():
    env = {
        "APPLESPEC_DATABASE_URL": URL,
        "APPLESPEC_BROKER_URL": "redis://h:1/2",
        "APPLESPEC_MODEL": "tiny-random",
        "APPLESPEC_MAX_ATTEMPTS": "5",
        "APPLESPEC_VISIBILITY_TIMEOUT": "600",
        "APPLESPEC_CHUNK_SIZE": "4",
        "APPLESPEC_SWEEP_INTERVAL": "2.5",
        "APPLESPEC_LEASE_TIMEOUT": "12",
        "APPLESPEC_HEARTBEAT_INTERVAL": "3",
        "APPLESPEC_IDLE_WARNING": "45",
        "APPLESPEC_MAX_LINE_BYTES": "4096",
        "APPLESPEC_MAX_LINES": "10",
        "APPLESPEC_MAX_FILE_BYTES": "100000",
        "APPLESPEC_MAX_TOKENS_LIMIT": "512",
        "APPLESPEC_MODEL_ALIASES": " gpt-3.5-turbo-0125 = smollm2-135m , gpt-4o=qwen2.5-coder-1.5b,",
        "APPLESPEC_STRICT_MODELS": "yes",
        "APPLESPEC_DRAFT_MODEL_DIRS": "/models/a:/models/b",
        "APPLESPEC_LEARN_SHARE": "0.25",
    }
    s = Settings.from_env(env)
    assert (s.max_attempts, s.visibility_timeout, s.chunk_size) == (5, 600, 4)
    assert (s.sweep_interval, s.lease_timeout, s.heartbeat_interval, s.idle_warning) == (
        2.5,
        12.0,
        3.0,
        45.0,
    )
    assert s.job_limits().max_tokens == 512 and s.max_lines == 10
    assert s.model_aliases == {"gpt-3.5-turbo-0125": "smollm2-135m", "gpt-4o": "qwen2.5-coder-1.5b"}
    assert s.resolve_model("gpt-4o") == "qwen2.5-coder-1.5b" and s.resolve_model("x") == "x"
    assert s.strict_models is True
    assert s.draft_model_dirs == ("/models/a", "/models/b")
    assert s.learn_share == 0.25
    assert hash(s) == hash(Settings.from_env(env))  # workers key per-process caches on it


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"APPLESPEC_MAX_ATTEMPTS": "abc"},
            "APPLESPEC_MAX_ATTEMPTS must be a whole number >= 1, got 'abc'",
        ),
        (
            {"APPLESPEC_MAX_ATTEMPTS": "2.5"},
            "APPLESPEC_MAX_ATTEMPTS must be a whole number >= 1, got '2.5'",
        ),
        ({"APPLESPEC_CHUNK_SIZE": "0"}, "APPLESPEC_CHUNK_SIZE must be a whole number >= 1, got 0"),
        (
            {"APPLESPEC_VISIBILITY_TIMEOUT": "-1"},
            "APPLESPEC_VISIBILITY_TIMEOUT must be a whole number >= 1, got -1",
        ),
        (
            {"APPLESPEC_SWEEP_INTERVAL": "nan"},
            "APPLESPEC_SWEEP_INTERVAL must be a number of seconds >= 0.05, got nan",
        ),
        (
            {"APPLESPEC_LEASE_TIMEOUT": "inf"},
            "APPLESPEC_LEASE_TIMEOUT must be a number of seconds >= 0.2, got inf",
        ),
        (
            {"APPLESPEC_MAX_LINE_BYTES": "1k"},
            "APPLESPEC_MAX_LINE_BYTES must be a whole number >= 64, got '1k'",
        ),
        (
            {"APPLESPEC_HEARTBEAT_INTERVAL": "15"},
            "APPLESPEC_HEARTBEAT_INTERVAL (15 s) must be at most half of APPLESPEC_LEASE_TIMEOUT (20 s)",
        ),
        (
            {"APPLESPEC_MODEL_ALIASES": "gpt-4o"},
            "APPLESPEC_MODEL_ALIASES entry 'gpt-4o' must be NAME=MODEL",
        ),
        ({"APPLESPEC_STRICT_MODELS": "maybe"}, "APPLESPEC_STRICT_MODELS must be 1 or 0"),
        (
            {"APPLESPEC_LEARN_SHARE": "1.5"},
            "APPLESPEC_LEARN_SHARE must be a share of the time between 0 and 1, got 1.5",
        ),
        (
            {"APPLESPEC_LEARN_SHARE": "ten"},
            "APPLESPEC_LEARN_SHARE must be a share of the time between 0 and 1, got 'ten'",
        ),
        ({"APPLESPEC_BROKER_URL": "localhost"}, "APPLESPEC_BROKER_URL must be a URL"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable(env, message):
    with pytest.raises(SettingsError) as e:
        Settings.from_env({"APPLESPEC_DATABASE_URL": URL, **env})
    assert str(e.value).startswith(message)
    assert "\n" not in str(e.value)


def test_empty_values_mean_the_default():
    s = Settings.from_env({"APPLESPEC_DATABASE_URL": URL, "APPLESPEC_CHUNK_SIZE": " "})
    assert s.chunk_size == 8


def test_credentials_are_masked():
    assert mask_url("redis://:pw@h:6379/0") == "redis://:***@h:6379/0"
    assert mask_url("rediss://user:p%40ss@h/0") == "rediss://user:***@h/0"
    assert mask_url("postgresql+psycopg://u:pw@db:5432/x") == "postgresql+psycopg://u:***@db:5432/x"
    assert (
        mask_url("redis://h:6379/0?password=pw&db=1") == "redis://h:6379/0?password=%2A%2A%2A&db=1"
    )
    assert mask_url("postgresql+psycopg://u@db/x") == "postgresql+psycopg://u@db/x"
    s = Settings(database_url="postgresql+psycopg://u:dbpw@db/x", broker_url="redis://:p%40ss@h/0")
    text = "failed: redis://:p%40ss@h/0 said p@ss; postgresql+psycopg://u:dbpw@db/x (dbpw)"
    redacted = s.redact(text)
    assert "dbpw" not in redacted and "p@ss" not in redacted and "p%40ss" not in redacted
    assert "redis://:***@h/0" in redacted
    assert "dbpw" not in repr(s) and "p%40ss" not in repr(s)


def test_aliases_parse():
    assert parse_aliases("a=b, c = d") == {"a": "b", "c": "d"}
    with pytest.raises(SettingsError):
        parse_aliases("a=")
