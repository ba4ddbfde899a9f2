"""Settings: defaults, URL normalisation, placeholder secrets refused outside dev, process
settings read when used."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app import db, gcfreeze
from app.errors import ConfigurationError
from app.settings import PLACEHOLDER_SECRET, Settings, get_settings, load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("PRIORLY_DATABASE_URL", "PRIORLY_ENV", "PRIORLY_SECRET_KEY", "PRIORLY_PORT"):
        monkeypatch.delenv(name, raising=False)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()  # no settings of this test's environment outlive it


def test_defaults() -> None:
    s = Settings()
    assert s.database_url == "sqlite:///./priorly.db" and s.env == "dev"
    assert s.secret_key.get_secret_value() == PLACEHOLDER_SECRET
    assert (s.host, s.port) == ("127.0.0.1", 8000)
    assert (s.demo_dataset / "dataset.json").is_file()


def test_env_prefix_and_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIORLY_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
    monkeypatch.setenv("PRIORLY_PORT", "8123")
    s = get_settings()
    assert s.database_url == "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    assert s.port == 8123
    assert get_settings() is s


@pytest.mark.parametrize("env", ["prod", "test"])
def test_placeholder_secret_refused_outside_dev(env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIORLY_ENV", env)
    with pytest.raises(ConfigurationError, match="PRIORLY_SECRET_KEY"):
        load_settings()
    monkeypatch.setenv("PRIORLY_SECRET_KEY", "short")
    with pytest.raises(ConfigurationError, match="at least 32"):
        load_settings()
    monkeypatch.setenv("PRIORLY_SECRET_KEY", "k" * 40)
    assert load_settings().env == env


def test_bad_values_are_one_line_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIORLY_PORT", "not-a-port")
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert "PRIORLY_PORT" in str(info.value) and "\n" not in str(info.value)
    monkeypatch.delenv("PRIORLY_PORT")
    with pytest.raises(ConfigurationError, match="unsupported database URL"):
        load_settings(database_url="mysql://x")


def test_process_settings_are_read_when_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pool size, overflow and the gc freeze come from the environment at use time (after
    the modules were imported), through the cached settings."""
    monkeypatch.setenv("PRIORLY_DB_POOL_SIZE", "3")
    monkeypatch.setenv("PRIORLY_DB_MAX_OVERFLOW", "2")
    monkeypatch.setenv("PRIORLY_GC_FREEZE", "0")
    get_settings.cache_clear()
    engine = db.make_engine("postgresql+psycopg://u@127.0.0.1:1/none")  # connects lazily
    try:
        assert (engine.pool.size(), engine.pool._max_overflow) == (3, 2)  # type: ignore[attr-defined]
    finally:
        engine.dispose()
    assert not gcfreeze.enabled()
    monkeypatch.delenv("PRIORLY_GC_FREEZE")
    get_settings.cache_clear()
    assert gcfreeze.enabled()


@pytest.mark.parametrize(
    ("name", "value"),
    [("PRIORLY_DB_POOL_SIZE", "0"), ("PRIORLY_TORCH_THREADS", "0"), ("PRIORLY_GC_FREEZE", "x")],
)
def test_bad_process_settings_are_refused(
    name: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError, match=name):
        load_settings()
