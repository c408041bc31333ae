"""Unit: the SQLite adapter's schema, its versioning, and how it refuses files it cannot use."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from keel import ConfigurationError, NotAStore, StoreError
from keel.store import SqliteStore
from keel.store.sqlfiles import load_migrations
from keel.store.sqlite import SCHEMA_VERSION
from schema_upgrade import OldStore, check_upgraded

TABLES = {"tasks", "task_events", "task_steps", "keel_schema", "task_changes", "keel_sessions"}
INDEXES = {
    "tasks_owner_idempotency_key",
    "tasks_ready",
    "tasks_leased",
    "tasks_expiry",
    "task_events_task",
}


def _objects(conn: sqlite3.Connection, kind: str) -> dict[str, str | None]:
    rows = conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = ? AND name NOT LIKE 'sqlite_%'", (kind,)
    )
    return dict(rows.fetchall())


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A fresh Keel store file, created by opening and closing a SqliteStore."""
    path = tmp_path / "keel.db"
    SqliteStore(path).close_sync()
    return path


def test_schema_has_the_expected_tables_and_indexes(db):
    """After migrations the file has the tasks, events, steps and schema tables and indexes."""
    with sqlite3.connect(db) as conn:
        assert set(_objects(conn, "table")) == TABLES
        indexes = _objects(conn, "index")
    assert set(indexes) >= INDEXES
    key_index = indexes["tasks_owner_idempotency_key"] or ""
    assert "UNIQUE" in key_index.upper()
    assert "idempotency_key IS NOT NULL" in key_index


def test_schema_version_is_recorded(db):
    """keel_schema holds every migration once, up to SCHEMA_VERSION."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT version, name FROM keel_schema ORDER BY version").fetchall()
    assert [v for v, _ in rows] == list(range(1, SCHEMA_VERSION + 1))
    assert [n for _, n in rows] == [m.name for m in load_migrations("keel.store.sqlite.migrations")]
    store = SqliteStore(db)
    try:
        assert store.schema_version == SCHEMA_VERSION
    finally:
        store.close_sync()


def test_reopening_does_not_migrate_again(db):
    """Opening an up-to-date file applies nothing and records nothing."""
    SqliteStore(db).close_sync()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM keel_schema").fetchone()[0] == SCHEMA_VERSION


def test_fresh_schema_equals_all_migrations_applied(db):
    """The store's schema is exactly the migrations' SQL applied in order, nothing else."""
    reference = sqlite3.connect(":memory:")
    try:
        for migration in load_migrations("keel.store.sqlite.migrations"):
            reference.executescript(migration.sql)
        expected = {k: _objects(reference, k) for k in ("table", "index", "trigger", "view")}
    finally:
        reference.close()
    with sqlite3.connect(db) as conn:
        actual = {k: _objects(conn, k) for k in ("table", "index", "trigger", "view")}
    del actual["table"]["keel_schema"]
    assert actual == expected


@pytest.mark.anyio
async def test_a_store_of_schema_5_keeps_its_traces_after_the_upgrade(tmp_path):
    """A file written by Keel with schema version 5 (trace contexts as the reserved step
    ``keel:trace-context``, no claim times) opens migrated: each trace context in its
    task's column, the reserved step gone, a leased task's claim time from its claim."""
    path, old = tmp_path / "old.db", OldStore()
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute(
            "CREATE TABLE keel_schema (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
            " applied_at REAL NOT NULL) STRICT"
        )
        for migration in load_migrations("keel.store.sqlite.migrations")[:5]:
            conn.executescript(migration.sql)
            conn.execute(
                "INSERT INTO keel_schema VALUES (?, ?, 0)", (migration.version, migration.name)
            )
        old.fill(conn, ":{}", "?")
    store = SqliteStore(path)
    try:
        assert store.schema_version == SCHEMA_VERSION
        await check_upgraded(store)
    finally:
        await store.close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        names = conn.execute("SELECT DISTINCT name FROM task_steps").fetchall()
    assert names == [("fetch",)]


def test_store_uses_wal_and_passes_an_integrity_check(db):
    """The file is in WAL mode and sound."""
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store = SqliteStore(db)
    try:
        assert store.integrity_check() == "ok"
    finally:
        store.close_sync()


def test_newer_schema_is_refused(db):
    """A file whose schema is newer than this Keel raises StoreError saying so."""
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO keel_schema (version, name, applied_at) VALUES (?, 'future', 0)",
            (SCHEMA_VERSION + 1,),
        )
    with pytest.raises(StoreError, match="newer") as info:
        SqliteStore(db)
    assert str(SCHEMA_VERSION + 1) in str(info.value)
    assert "upgrade" in str(info.value)


@pytest.mark.parametrize(
    "content",
    [b"this is not a database, it is a teaching-store JSON file\n" * 20, b"\x00" * 4096],
    ids=["text", "zeros"],
)
def test_non_database_file_is_refused_clearly(tmp_path, content):
    """Opening a file that is not SQLite raises NotAStore with a clear message, not sqlite3."""
    path = tmp_path / "tasks.json"
    path.write_bytes(content)
    with pytest.raises(NotAStore) as info:
        SqliteStore(path)
    assert isinstance(info.value, StoreError)
    assert str(path) in str(info.value)
    assert "not a SQLite database" in str(info.value)
    assert path.read_bytes() == content, "a file that is not ours is left alone"


def test_missing_folders_are_created(tmp_path):
    """SqliteStore creates the folders of its path."""
    path = tmp_path / "a" / "b" / "keel.db"
    SqliteStore(path).close_sync()
    assert path.is_file()


def test_unusable_location_is_a_store_error(tmp_path):
    """A path under a regular file cannot be opened: StoreError, not OSError."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError):
        SqliteStore(blocker / "keel.db")


def test_bad_synchronous_is_a_configuration_error(tmp_path):
    """synchronous must be full or normal."""
    with pytest.raises(ConfigurationError, match="synchronous"):
        SqliteStore(tmp_path / "keel.db", synchronous="off")


@pytest.mark.anyio
async def test_closed_store_refuses_work_and_closes_twice(tmp_path):
    """A closed store raises StoreError on use; close() is safe to call twice."""
    store = SqliteStore(tmp_path / "keel.db")
    await store.close()
    await store.close()
    with pytest.raises(StoreError, match="closed"):
        await store.get("anything")
