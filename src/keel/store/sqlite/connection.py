"""The store's one SQLite connection: opened, configured, migrated, and locked.

* WAL journal, so readers never block the writer and the writer never blocks readers.
* ``synchronous=FULL`` by default: a commit is fsynced before it is acknowledged.
* ``busy_timeout`` is 0 while the connection is used on the event loop (another
  process's lock answers SQLITE_BUSY at once, and the work moves to a thread), and set
  only around work in a thread that may wait (:meth:`Connection.waiting`).
* Schema versions are the migrations in ``migrations/``; a file newer than this Keel is
  refused.

A :class:`threading.Lock` serialises the connection between the event loop and worker
threads: whoever holds it owns the connection and its open transaction.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path

from keel.errors import StoreError
from keel.store.sqlfiles import load_migrations
from keel.store.sqlite.faults import is_busy, translate

__all__ = [
    "CACHE_KIB",
    "DEFAULT_BUSY_TIMEOUT",
    "SCHEMA_VERSION",
    "WAL_LIMIT_BYTES",
    "Connection",
    "Synchronous",
]

_MIGRATIONS = load_migrations("keel.store.sqlite.migrations")
SCHEMA_VERSION = _MIGRATIONS[-1].version
"""The schema version this Keel writes and reads."""

DEFAULT_BUSY_TIMEOUT = 30.0  # seconds a writer waits for another process's lock
CACHE_KIB = 64 * 1024  # page cache per connection, KiB
WAL_LIMIT_BYTES = 64 * 1024 * 1024  # a WAL larger than this is truncated after checkpoints

_JITTER = random.Random()  # noqa: S311 - spreads lock polls; nothing secret about it


class Synchronous(StrEnum):
    """How hard a commit is pushed to disk before it is acknowledged."""

    FULL = "full"
    """fsync on every commit: survives process crashes and power loss (the default)."""
    NORMAL = "normal"
    """fsync at checkpoints only: survives process crashes; power loss may lose recent commits."""


class Connection:
    """The open connection of one store, with the lock that serialises its use.

    Raises:
        StoreError: the file cannot be opened as a Keel store, or its schema is newer than
            this Keel understands.
    """

    def __init__(self, path: Path, *, synchronous: Synchronous, busy_timeout: float) -> None:
        self.path = path
        self.busy_ms = int(busy_timeout * 1000)
        self.lock = threading.Lock()
        self.closed = False
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.sql = sqlite3.connect(
                path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
            )
        except OSError as exc:  # its folder cannot be made
            raise StoreError(f"cannot open store {path}: {exc}") from exc
        except sqlite3.Error as exc:
            raise translate(exc, path) from exc
        self.sql.row_factory = sqlite3.Row
        try:
            self._configure(synchronous, busy_timeout)
            self._migrate()
            self.sql.execute("PRAGMA busy_timeout = 0")
        except sqlite3.Error as exc:
            self.sql.close()
            raise translate(exc, path) from exc
        except BaseException:
            self.sql.close()
            raise

    def fail(self, exc: sqlite3.Error) -> StoreError:
        """``exc`` as a StoreError naming this store (see :mod:`.faults`)."""
        return translate(exc, self.path)

    def _configure(self, synchronous: Synchronous, busy_timeout: float) -> None:
        c = self.sql
        c.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        mode = self._switch_to_wal(busy_timeout)
        if str(mode).lower() != "wal":  # pragma: no cover - e.g. a read-only medium
            raise StoreError(f"store {self.path} cannot use WAL journaling (got {mode})")
        c.execute(f"PRAGMA synchronous = {synchronous.value.upper()}")
        c.execute("PRAGMA foreign_keys = ON")
        # Keep hot index pages in memory: claims and updates touch random b-tree leaves.
        c.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        # After a checkpoint, shrink a WAL that a burst of writes grew, instead of keeping it.
        c.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")

    def _switch_to_wal(self, busy_timeout: float) -> str:
        # Switching a new file to WAL needs an exclusive lock, and SQLite answers
        # SQLITE_BUSY at once here without calling the busy handler: another process
        # opening the same new file at the same moment would make this fail. So wait for
        # it, as busy_timeout promises, with a short backoff.
        deadline = time.monotonic() + busy_timeout
        pause = 0.001
        while True:
            try:
                return str(self.sql.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            except sqlite3.OperationalError as exc:
                if not is_busy(exc) or time.monotonic() > deadline:
                    raise
            time.sleep(pause)  # waiting for another process's lock, not for a result
            pause = min(pause * 2, 0.05)

    def _current_version(self) -> int:
        exists = self.sql.execute(
            "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'keel_schema'"
        ).fetchone()
        if not exists:
            return 0
        row = self.sql.execute("SELECT coalesce(max(version), 0) FROM keel_schema").fetchone()
        return int(row[0])

    def _migrate(self) -> None:
        # A read first: an up-to-date store (every open but the first) never queues for
        # the write lock behind a busy writer just to learn that there is nothing to do.
        current = self._current_version()
        _check_version(self.path, current)
        if current == SCHEMA_VERSION:
            return
        c = self.sql
        self.begin(True)
        try:
            c.execute(
                "CREATE TABLE IF NOT EXISTS keel_schema ("
                " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL"
                ") STRICT"
            )
            current = c.execute("SELECT coalesce(max(version), 0) FROM keel_schema").fetchone()[0]
            _check_version(self.path, current)
            for migration in _MIGRATIONS[current:]:
                for statement in _statements(migration.sql):
                    c.execute(statement)
                c.execute(
                    "INSERT INTO keel_schema (version, name, applied_at) VALUES (?, ?, ?)",
                    (migration.version, migration.name, time.time()),
                )
        except BaseException:
            self.rollback()
            raise
        c.execute("COMMIT")

    def schema_version(self) -> int:
        """The schema version recorded in the file."""
        with self.lock:
            return int(self.sql.execute("SELECT max(version) FROM keel_schema").fetchone()[0])

    # --- transactions and locks ------------------------------------------------------

    def begin(self, write: bool) -> None:
        """``BEGIN IMMEDIATE`` (the write lock, up front) or a deferred read transaction."""
        self.sql.execute("BEGIN IMMEDIATE" if write else "BEGIN")

    def rollback(self) -> None:
        if self.sql.in_transaction:
            self.sql.execute("ROLLBACK")

    def fail_closed(self) -> StoreError:
        """The error of any use after :meth:`close`."""
        return StoreError(f"store {self.path} is closed")

    def check_open(self) -> None:
        if self.closed:
            raise self.fail_closed()

    def begin_write_waiting(self) -> None:
        """``BEGIN IMMEDIATE``, waiting for another process's write lock (in a thread).

        SQLite's own busy handler sleeps ever longer (up to 100 ms) between tries, which
        all but hands the lock back to the process that holds it. Short jittered polls take
        it within a fraction of a millisecond of its release instead.
        """
        deadline = time.monotonic() + self.busy_ms / 1000
        pause = 0.0002  # seconds
        while True:
            try:
                self.sql.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if not is_busy(exc) or time.monotonic() >= deadline:
                    raise
            else:
                return
            time.sleep(pause * (0.5 + _JITTER.random()))  # waiting for a lock, not a result
            pause = min(pause * 1.5, 0.002)

    @contextmanager
    def waiting(self) -> Iterator[sqlite3.Connection]:
        """Hold the lock with ``busy_timeout`` set: for work in a thread that may wait."""
        with self.lock:
            self.check_open()
            self.sql.execute(f"PRAGMA busy_timeout = {self.busy_ms}")
            try:
                yield self.sql
            finally:
                self.sql.execute("PRAGMA busy_timeout = 0")

    def close(self) -> None:
        """Close the connection. Safe to call twice."""
        with self.lock:
            if not self.closed:
                self.closed = True
                self.sql.close()


def _check_version(path: Path, current: int) -> None:
    if current > SCHEMA_VERSION:
        raise StoreError(
            f"store {path} has schema version {current}, newer than this Keel "
            f"supports ({SCHEMA_VERSION}); upgrade keel-tasks"
        )


def _statements(script: str) -> Iterator[str]:
    """Split a migration into statements (``executescript`` would commit on its own)."""
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            statement = buffer.strip()
            buffer = ""
            if statement and not all(
                part.strip().startswith("--") or not part.strip() for part in statement.splitlines()
            ):
                yield statement
    if buffer.strip() and not all(
        p.strip().startswith("--") or not p.strip() for p in buffer.splitlines()
    ):  # pragma: no cover - a migration missing its last semicolon
        raise RuntimeError(f"unterminated statement in migration: {buffer.strip()[:80]}")
