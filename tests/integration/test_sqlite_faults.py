"""Real SQLite failures reach callers as the StoreError their result code maps to.

Each test makes SQLite itself fail (a lock held by another connection, a file that is
not a database, a read-only file) and checks both the Keel message and the driver
error chained under it, whose code ``keel.store.sqlite.faults`` translated.
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from keel.errors import NotAStore, StoreError, StoreUnavailable
from keel.model import Status
from keel.store import SqliteStore
from runtime.support import outcome_through_outage
from store_files import read_only_folder

pytestmark = pytest.mark.anyio

JOB = "job"


def _code(error: BaseException) -> str:
    """The SQLite result code chained under a StoreError."""
    cause = error.__cause__
    assert isinstance(cause, sqlite3.Error), f"no sqlite3 error under {error!r}"
    return str(cause.sqlite_errorname)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "keel.db"
    SqliteStore(path).close_sync()  # the schema, in WAL mode
    return path


@pytest.fixture
def locked(db: Path) -> Iterator[sqlite3.Connection]:
    """Another connection holding the file's write lock for the whole test."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    finally:
        conn.execute("ROLLBACK")
        conn.close()


async def test_a_lock_held_past_the_busy_timeout_is_busy(db, locked):
    """A write that waits out its busy timeout behind another connection's lock fails
    with "busy", from SQLITE_BUSY; nothing is written."""
    store = SqliteStore(db, busy_timeout=0.05)
    try:
        with pytest.raises(StoreUnavailable, match=f"store {db} is unavailable: busy") as info:
            await store.create(name=JOB)
        assert _code(info.value).startswith("SQLITE_BUSY")
        locked.execute("ROLLBACK")
        assert await store.list() == []
        locked.execute("BEGIN IMMEDIATE")  # as the fixture expects to find it
    finally:
        await store.close()


@pytest.mark.parametrize(
    "content", [b"not a database, a JSON file\n" * 200, b"\x00" * 4096], ids=["text", "zeros"]
)
def test_a_file_that_is_not_a_database_is_unreadable(tmp_path, content):
    """Opening a file that is not SQLite: NotAStore, read from its header before SQLite
    opens it; the file is left as it was, and no -wal or -shm appears beside it."""
    path = tmp_path / "tasks.json"
    path.write_bytes(content)
    with pytest.raises(NotAStore, match=re.escape(f"store {path} is not a SQLite database")):
        SqliteStore(path)
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tasks.json"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes read-only files anyway")
async def test_a_read_only_file_cannot_be_written(db):
    """A store file without write permission: opening it or writing to it fails with
    "read-only" (SQLITE_READONLY) or "cannot open store" (SQLITE_CANTOPEN)."""

    async def open_and_write() -> None:
        store = SqliteStore(db)
        try:
            await store.create(name=JOB)
        finally:
            await store.close()

    db.chmod(0o444)
    try:
        with pytest.raises(
            StoreError, match=f"(store {db} is unavailable: read-only|cannot open store {db})"
        ) as info:
            await open_and_write()
        assert _code(info.value).startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN"))
    finally:
        db.chmod(0o644)


def test_a_store_in_a_read_only_folder_is_named_read_only(tmp_path):
    """A store file alone in a folder that cannot be written (a read-only mount, as a
    read-only data volume is): SQLite cannot make its -wal and -shm there, and the error
    says the folder is read-only, naming the store, instead of only "unable to open";
    the file is left as it was."""
    folder = tmp_path / "data"
    folder.mkdir()
    SqliteStore(folder / "keel.db").close_sync()
    content = (folder / "keel.db").read_bytes()
    with read_only_folder(folder) as view:
        if view is None:
            pytest.skip("no read-only folder can be made here (root without a bind mount)")
        path = view / "keel.db"
        message = f"cannot open store {path}: its folder is read-only"
        with pytest.raises(StoreError, match=re.escape(message)) as info:
            SqliteStore(path)
        assert _code(info.value).startswith("SQLITE_CANTOPEN")
        assert path.read_bytes() == content


async def test_a_read_only_connection_cannot_write(db):
    """The same mapping where permissions cannot be taken away (as root): SQLite's
    ``query_only`` makes the store's connection refuse writes with SQLITE_READONLY, as a
    read-only file or medium does. Reads still work."""
    store = SqliteStore(db)
    try:
        store._db.sql.execute("PRAGMA query_only = ON")  # the store's one connection
        with pytest.raises(StoreUnavailable, match=f"store {db} is unavailable: read-only") as info:
            await store.create(name=JOB)
        assert _code(info.value) == "SQLITE_READONLY"
        assert await store.list() == []
    finally:
        await store.close()


def test_a_folder_in_place_of_the_file_cannot_be_opened(tmp_path):
    """A directory where the database file should be: NotAStore, "is a folder"."""
    path = tmp_path / "keel.db"
    path.mkdir()
    with pytest.raises(NotAStore, match=re.escape(f"store {path} is a folder")):
        SqliteStore(path)


async def test_a_full_disk_is_named_and_writes_nothing(db):
    """A database that cannot grow (``max_page_count``: SQLite's own limit, met exactly as
    a full disk is, with SQLITE_FULL): StoreUnavailable "the disk is full", and the
    write that met it left nothing behind; reads still work."""
    store = SqliteStore(db)
    try:
        pages = store._db.sql.execute("PRAGMA page_count").fetchone()[0]
        store._db.sql.execute(f"PRAGMA max_page_count = {pages + 2}")
        made = 0

        async def fill() -> None:
            nonlocal made
            for _ in range(1000):
                await store.create(name=JOB, arguments={"pad": "x" * 2000})
                made += 1

        with pytest.raises(StoreUnavailable, match=f"store {db} is unavailable: the disk is full"):
            await fill()
        assert len(await store.list(limit=1000)) == made
    finally:
        await store.close()


@pytest.mark.slow  # waits out a lease
async def test_an_outcome_refused_by_a_full_disk_is_written_once_it_has_room(db):
    """The disk fills while a handler runs (its one attempt), for longer than its lease:
    the completion is refused as "disk full", tried again, and written once the file can
    grow again; the task completes instead of being dead-lettered."""
    store = SqliteStore(db, timeout=1.0)
    sql = store._db.sql  # the store's one connection

    async def fill_the_disk() -> None:
        sql.execute(f"PRAGMA max_page_count = {sql.execute('PRAGMA page_count').fetchone()[0]}")

    async def make_room() -> None:
        sql.execute("PRAGMA max_page_count = 1073741823")

    try:
        done, history = await outcome_through_outage(
            store,
            lease=1.0,
            result="x" * 50_000,  # needs new pages: what a full disk refuses
            break_store=fill_the_disk,
            mend_store=make_room,
        )
        assert done.status is Status.COMPLETED, history
        assert done.attempt == 1
    finally:
        await store.close()
