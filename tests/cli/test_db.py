"""``keel db migrate`` and :func:`keel.store.migrate` behind it: what it applies, what it
prints, and its errors as one line."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from keel import ConfigurationError
from keel.cli.app import cli
from keel.store import MigrationReport, SqliteStore, migrate
from keel.store.sqlfiles import load_migrations
from postgres.pg import drop_schema, new_schema, require_postgres, store_url


@pytest.fixture(autouse=True)
def no_env_store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test sees the caller's $KEEL_STORE, and each runs in its own directory."""
    monkeypatch.delenv("KEEL_STORE", raising=False)
    monkeypatch.chdir(tmp_path)


SQLITE = tuple(m.version for m in load_migrations("keel.store.sqlite.migrations"))
POSTGRES = tuple(m.version for m in load_migrations("keel.store.postgres.migrations"))
"""Every migration each adapter has, in order (a fresh store gets them all)."""


def listed(versions: tuple[int, ...]) -> str:
    return ", ".join(map(str, versions))


def keel(*args: str) -> Result:
    """Invoke the CLI in-process; stdout and stderr stay separate."""
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def free_port() -> int:
    """A port nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_sqlite_migrate_creates_the_file_then_finds_it_up_to_date(tmp_path):
    """A missing SQLite file is created with every migration; a second run does nothing."""
    first = keel("db", "migrate", "--store", "new.db")
    assert first.exit_code == 0
    expected = f"new.db: applied migration(s) {listed(SQLITE)}; schema version {SQLITE[-1]}\n"
    assert first.stdout == expected
    assert (tmp_path / "new.db").exists()
    again = keel("db", "migrate", "--store", "new.db")
    assert (again.exit_code, again.stdout) == (
        0,
        f"new.db: schema version {SQLITE[-1]}, up to date\n",
    )


def test_sqlite_migrate_uses_the_default_location(tmp_path):
    """Without --store or $KEEL_STORE it migrates keel-data/keel.db under the cwd."""
    result = keel("db", "migrate")
    assert result.exit_code == 0
    assert result.stdout.startswith("keel-data/keel.db: applied migration(s) 1")
    store = SqliteStore(tmp_path / "keel-data" / "keel.db")
    try:
        assert store.schema_version == SQLITE[-1]
    finally:
        store.close_sync()


def test_migrate_reports_what_it_did(tmp_path):
    """keel.store.migrate returns the report the CLI prints, honouring URL options."""
    url = f"sqlite:///{tmp_path}/k.db?synchronous=normal"
    assert migrate(url) == MigrationReport(f"{tmp_path}/k.db", SQLITE, SQLITE[-1])
    assert migrate(url) == MigrationReport(f"{tmp_path}/k.db", (), SQLITE[-1])


def test_memory_has_no_schema_to_migrate():
    """memory://: exit 1, one line; keel.store.migrate raises ConfigurationError."""
    result = keel("db", "migrate", "--store", "memory://")
    assert (result.exit_code, result.stderr) == (
        1,
        "keel: error: memory:// has no schema to migrate\n",
    )
    with pytest.raises(ConfigurationError, match="no schema to migrate"):
        migrate("memory://")


def test_unreachable_postgres_is_one_line_naming_the_address():
    """No server at the address: exit 1, one line naming host, port and database."""
    port = free_port()
    result = keel("db", "migrate", "--store", f"postgresql://u:pw@127.0.0.1:{port}/kdb")
    assert result.exit_code == 1
    assert result.stderr.startswith(
        f"keel: error: cannot connect to PostgreSQL at 127.0.0.1:{port} (database kdb): "
    )
    assert result.stderr.count("\n") == 1
    assert "pw" not in result.stderr


def test_bad_postgres_option_is_one_line():
    """A bad Keel option in the URL: exit 1, one line, no password."""
    result = keel("db", "migrate", "--store", "postgresql://u:pw@h/db?pool_max=none")
    assert result.exit_code == 1
    assert result.stderr.startswith("keel: error: pool_max must be a number >= 1")
    assert ":pw@" not in result.stderr


@pytest.mark.postgres
def test_postgres_migrate_applies_once_then_is_up_to_date():
    """A fresh schema gets every migration; the second run finds it up to date."""
    require_postgres()
    schema = new_schema()
    try:
        url = store_url(schema)
        first = keel("db", "migrate", "--store", url)
        assert first.exit_code == 0, first.stderr
        assert first.stdout.endswith(
            f"(schema {schema}): applied migration(s) {listed(POSTGRES)};"
            f" schema version {POSTGRES[-1]}\n"
        )
        again = keel("db", "migrate", "--store", url)
        assert again.stdout.endswith(
            f"(schema {schema}): schema version {POSTGRES[-1]}, up to date\n"
        )
        report = migrate(url)
        assert (report.applied, report.version) == ((), POSTGRES[-1])
        assert report.where.endswith(f"(schema {schema})")
    finally:
        drop_schema(schema)
