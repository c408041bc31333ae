"""Unit: store locations (parsing, precedence, the default) and open_store's choice."""

from __future__ import annotations

from pathlib import Path

import pytest

from keel import ConfigurationError
from keel.store import (
    DEFAULT_LOCATION,
    ENV_VAR,
    MemoryStore,
    SqliteStore,
    open_store,
    parse_location,
    resolve_location,
)


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    """No test here sees a KEEL_STORE from the environment it runs in."""
    monkeypatch.delenv(ENV_VAR, raising=False)


# --- parse_location ---------------------------------------------------------------------


@pytest.mark.parametrize("text", ["tasks.db", "data/keel.db", "/var/lib/keel/keel.db"])
def test_plain_path_is_a_sqlite_file(text):
    """A plain path is a SQLite file, relative or absolute, with no options."""
    loc = parse_location(text)
    assert (loc.kind, loc.path, loc.options) == ("sqlite", Path(text), {})


def test_path_like_is_accepted(tmp_path):
    """An os.PathLike location is a SQLite file too."""
    loc = parse_location(tmp_path / "keel.db")
    assert (loc.kind, loc.path) == ("sqlite", tmp_path / "keel.db")


def test_sqlite_url_with_three_slashes_is_relative():
    """sqlite:///rel.db names rel.db relative to the current directory."""
    assert parse_location("sqlite:///rel.db").path == Path("rel.db")
    assert parse_location("sqlite:///data/keel.db").path == Path("data/keel.db")


def test_sqlite_url_with_four_slashes_is_absolute():
    """sqlite:////abs.db names /abs.db (SQLAlchemy's convention)."""
    loc = parse_location("sqlite:////abs/keel.db")
    assert (loc.kind, loc.path) == ("sqlite", Path("/abs/keel.db"))
    assert loc.path.is_absolute()


def test_sqlite_url_options():
    """?synchronous=normal and ?busy_timeout=… are kept as options."""
    loc = parse_location("sqlite:///rel.db?synchronous=normal&busy_timeout=5")
    assert loc.path == Path("rel.db")
    assert loc.options == {"synchronous": "normal", "busy_timeout": "5"}
    assert loc.url == "sqlite:///rel.db?synchronous=normal&busy_timeout=5"
    assert "synchronous=normal" in loc.describe()


def test_sqlite_describe_says_full_by_default():
    """A SQLite location without options describes itself as synchronous=full."""
    assert parse_location("keel.db").describe() == "SQLite keel.db (synchronous=full)"


def test_unknown_sqlite_option_is_refused():
    """An unknown SQLite option raises ConfigurationError naming it and the known ones."""
    with pytest.raises(ConfigurationError, match="journal") as info:
        parse_location("sqlite:///rel.db?journal=off")
    assert "synchronous" in str(info.value)


@pytest.mark.parametrize("text", ["sqlite://host/x.db", "sqlite:///", "sqlite://"])
def test_sqlite_url_without_a_file_or_with_a_host_is_refused(text):
    """A SQLite URL with a host, or naming no file, raises ConfigurationError."""
    with pytest.raises(ConfigurationError):
        parse_location(text)


def test_memory_url():
    """memory:// is the in-process store, described as lost on exit."""
    loc = parse_location("memory://")
    assert (loc.kind, loc.path) == ("memory", None)
    assert "lost" in loc.describe()


def test_memory_url_takes_no_path():
    """memory://something raises ConfigurationError."""
    with pytest.raises(ConfigurationError):
        parse_location("memory://tasks")


@pytest.mark.parametrize(
    "url", ["postgresql://keel:secret@db.internal:5432/keel", "postgres://localhost/keel"]
)
def test_postgres_urls(url):
    """postgresql:// and postgres:// are PostgreSQL, the URL kept whole."""
    loc = parse_location(url)
    assert (loc.kind, loc.url, loc.path) == ("postgres", url, None)
    assert loc.describe().startswith("PostgreSQL")


def test_scheme_is_case_insensitive():
    """MEMORY:// is memory:// (URL schemes are case-insensitive)."""
    assert parse_location("MEMORY://").kind == "memory"


@pytest.mark.parametrize("text", ["mysql://db/keel", "redis://localhost", "file:///x.db"])
def test_unknown_scheme_is_refused(text):
    """An unknown scheme raises ConfigurationError naming the forms that work."""
    with pytest.raises(ConfigurationError, match="unknown store scheme") as info:
        parse_location(text)
    assert "memory://" in str(info.value)


@pytest.mark.parametrize("text", ["", "   "])
def test_empty_location_is_refused(text):
    """An empty location raises ConfigurationError."""
    with pytest.raises(ConfigurationError, match="empty"):
        parse_location(text)


# --- resolve_location -------------------------------------------------------------------


def test_default_is_the_keel_data_file():
    """With nothing given, the location is keel-data/keel.db (a file, not memory)."""
    assert DEFAULT_LOCATION == "keel-data/keel.db"
    assert resolve_location() == DEFAULT_LOCATION
    assert parse_location(resolve_location()).kind == "sqlite"


def test_environment_beats_the_default(monkeypatch):
    """$KEEL_STORE is used when no location is given."""
    monkeypatch.setenv(ENV_VAR, "memory://")
    assert ENV_VAR == "KEEL_STORE"
    assert resolve_location() == "memory://"
    assert resolve_location(None) == "memory://"


def test_explicit_location_beats_the_environment(monkeypatch):
    """An explicit location wins over $KEEL_STORE."""
    monkeypatch.setenv(ENV_VAR, "memory://")
    assert resolve_location("tasks.db") == "tasks.db"


def test_empty_environment_means_the_default(monkeypatch):
    """An empty $KEEL_STORE is ignored."""
    monkeypatch.setenv(ENV_VAR, "")
    assert resolve_location() == DEFAULT_LOCATION


# --- open_store -------------------------------------------------------------------------


def test_open_store_memory():
    """open_store("memory://") is a MemoryStore."""
    assert isinstance(open_store("memory://"), MemoryStore)


def test_open_store_file_with_options(tmp_path):
    """open_store on a sqlite URL opens that file with its options."""
    store = open_store(f"sqlite:///{tmp_path}/keel.db?synchronous=normal")
    try:
        assert isinstance(store, SqliteStore)
        assert store.path == tmp_path / "keel.db"
        assert store.synchronous == "normal"
        assert (tmp_path / "keel.db").exists()
    finally:
        store.close_sync()


def test_open_store_default_is_a_file_under_the_cwd(tmp_path, monkeypatch):
    """open_store() with nothing set opens keel-data/keel.db under the current directory."""
    monkeypatch.chdir(tmp_path)
    store = open_store()
    try:
        assert isinstance(store, SqliteStore)
        assert (tmp_path / "keel-data" / "keel.db").exists()
    finally:
        store.close_sync()


def test_open_store_uses_the_environment(monkeypatch):
    """open_store() follows $KEEL_STORE."""
    monkeypatch.setenv(ENV_VAR, "memory://")
    assert isinstance(open_store(), MemoryStore)


@pytest.mark.parametrize(
    "query", ["synchronous=off", "busy_timeout=soon"], ids=["synchronous", "busy"]
)
def test_open_store_refuses_bad_option_values(tmp_path, query):
    """A bad synchronous or busy_timeout value raises ConfigurationError."""
    with pytest.raises(ConfigurationError):
        open_store(f"sqlite:///{tmp_path}/keel.db?{query}")


def test_open_store_postgres_without_a_server_is_a_configuration_error():
    """A PostgreSQL URL with no server (or database) there: ConfigurationError naming it."""
    with pytest.raises(ConfigurationError, match=r"PostgreSQL at 127\.0\.0\.1:1"):
        open_store("postgresql://127.0.0.1:1/keel?connect_timeout=2")


def test_a_postgres_password_never_shows_in_descriptions():
    """describe() masks the password (startup messages and logs print it)."""
    described = parse_location("postgresql://keel:s3cret@db.example:5432/keel").describe()
    assert "s3cret" not in described
    assert described == "PostgreSQL postgresql://keel:***@db.example:5432/keel"
    assert "***" not in parse_location("postgresql://keel@db/keel").describe()


def test_a_password_in_the_query_is_masked_too():
    """libpq takes ?password= (and ?sslpassword=): masked in descriptions and errors."""
    described = parse_location("postgresql://keel@db/keel?password=s3cret&schema=x").describe()
    assert "s3cret" not in described
    assert "password=***" in described
    with pytest.raises(ConfigurationError) as info:
        open_store("postgresql://keel@db/keel?sslpassword=s3cret&pool_max=x")
    assert "s3cret" not in str(info.value)
