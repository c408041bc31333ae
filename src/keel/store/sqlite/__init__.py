"""The SQLite adapter: the embedded default store, one file that several processes share.

* WAL journal, so readers never block the writer and the writer never blocks readers.
* Every write is one ``BEGIN IMMEDIATE`` transaction, which takes the write lock up front:
  a read-then-write transaction can never fail to upgrade its lock half way.
* ``busy_timeout`` makes a writer wait for another process's transaction instead of
  failing at once.
* ``synchronous=FULL`` by default: a commit is fsynced before it is acknowledged, so it
  survives power loss. ``synchronous=NORMAL`` (``?synchronous=normal`` in the URL) is much
  faster and still survives any process crash, but an OS crash or power loss may roll back
  the last commits.

Work runs in a thread so that waiting for the disk or for another process's lock never
blocks the event loop. ``sqlite3`` errors become :mod:`keel.errors` here and nowhere else.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread

from keel.errors import ConfigurationError, StoreError
from keel.model import Event, JsonValue, Limits, Status, Task
from keel.store.base import TxStore, task_from_row, task_to_row
from keel.store.protocol import Clock
from keel.store.sqlfiles import load_migrations, load_queries

__all__ = ["SCHEMA_VERSION", "SqliteStore", "Synchronous"]

T = TypeVar("T")

_Q = load_queries(__name__)
_MIGRATIONS = load_migrations(f"{__name__}.migrations")
SCHEMA_VERSION = _MIGRATIONS[-1].version
"""The schema version this Keel writes and reads."""

DEFAULT_BUSY_TIMEOUT = 30.0  # seconds a writer waits for another process's lock
CACHE_KIB = 64 * 1024  # page cache per connection, KiB


class Synchronous(StrEnum):
    """How hard a commit is pushed to disk before it is acknowledged."""

    FULL = "full"
    """fsync on every commit: survives process crashes and power loss (the default)."""
    NORMAL = "normal"
    """fsync at checkpoints only: survives process crashes; power loss may lose recent commits."""


class _SqliteTx:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._c = conn

    def _one(self, query: str, params: dict[str, Any]) -> Task | None:
        row = self._c.execute(_Q[query], params).fetchone()
        return None if row is None else task_from_row(row)

    def _all(self, query: str, params: dict[str, Any]) -> list[Task]:
        return [task_from_row(r) for r in self._c.execute(_Q[query], params)]

    def load(self, task_id: str) -> Task | None:
        return self._one("get_task", {"task_id": task_id})

    def load_by_key(self, owner: str, key: str) -> Task | None:
        return self._one("get_task_by_key", {"owner": owner, "idempotency_key": key})

    def insert(self, task: Task) -> None:
        self._c.execute(_Q["insert_task"], task_to_row(task))

    def update(self, old: Task, new: Task) -> None:
        params = task_to_row(new, mutable_only=True)
        params.update(task_id=old.task_id, old_status=old.status.value, old_fence=old.fence)
        if self._c.execute(_Q["update_task"], params).fetchone() is None:
            # Cannot happen under BEGIN IMMEDIATE; if it does, refuse rather than guess.
            raise StoreError(f"task {old.task_id} changed under a write; nothing was written")

    def append(self, event: Event) -> None:
        self._c.execute(
            _Q["insert_event"],
            {
                "task_id": event.task_id,
                "at": event.at,
                "from_status": None if event.from_status is None else event.from_status.value,
                "to_status": event.to_status.value,
                "reason": event.reason,
                "actor": event.actor,
            },
        )

    def ready(self, names: Collection[str], now: float, limit: int) -> list[Task]:
        return self._all(
            "ready_tasks", {"names": json.dumps(list(names)), "now": now, "limit": limit}
        )

    def expired(self, now: float, limit: int) -> list[Task]:
        return self._all("expired_leases", {"now": now, "limit": limit})

    def stale(self, cutoff: float) -> list[Task]:
        return self._all("stale_tasks", {"cutoff": cutoff})

    def purgeable(self, now: float, limit: int) -> list[str]:
        rows = self._c.execute(_Q["purgeable_tasks"], {"now": now, "limit": limit})
        return [r["task_id"] for r in rows]

    def delete(self, task_ids: Sequence[str]) -> None:
        if task_ids:
            self._c.execute(_Q["delete_tasks"], {"task_ids": json.dumps(list(task_ids))})

    def put_step(self, task_id: str, step: str, value_json: str, at: float) -> None:
        self._c.execute(
            _Q["put_step"],
            {"task_id": task_id, "name": step, "value": value_json, "created_at": at},
        )

    def get_steps(self, task_id: str) -> dict[str, JsonValue]:
        rows = self._c.execute(_Q["get_steps"], {"task_id": task_id})
        return {r["name"]: json.loads(r["value"]) for r in rows}

    def events(self, task_id: str) -> list[Event]:
        return [
            Event(
                task_id=r["task_id"],
                at=r["at"],
                from_status=None if r["from_status"] is None else Status(r["from_status"]),
                to_status=Status(r["to_status"]),
                reason=r["reason"],
                actor=r["actor"],
            )
            for r in self._c.execute(_Q["get_events"], {"task_id": task_id})
        ]

    def page(
        self, status: Status | None, owner: str | None, limit: int, after: str | None
    ) -> list[Task]:
        return self._all(
            "page_tasks",
            {
                "status": None if status is None else status.value,
                "owner": owner,
                "after": after,
                "limit": limit,
            },
        )


def _describe(exc: sqlite3.Error, path: str) -> str:
    text = str(exc)
    if "locked" in text or "busy" in text:
        return (
            f"store {path} is busy: another process held its write lock longer than "
            f"the busy timeout ({text})"
        )
    if "not a database" in text or "malformed" in text:
        return f"store {path} is not a readable Keel SQLite store ({text})"
    if "readonly" in text or "unable to open" in text:
        return f"cannot write to store {path} ({text})"
    return f"SQLite error on store {path}: {text}"


class SqliteStore(TxStore):
    """A :class:`keel.store.Store` in one SQLite file.

    Args:
        path: the database file; its folder is created if missing.
        synchronous: ``full`` (default, survives power loss) or ``normal`` (faster; see
            :class:`Synchronous`).
        busy_timeout: seconds a write waits for another process's transaction.
        clock: seconds since the epoch (injected in tests).

    Raises:
        ConfigurationError: bad options.
        StoreError: the file cannot be opened as a Keel store, or its schema is newer than
            this Keel understands.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: Synchronous | str = Synchronous.FULL,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        clock: Clock | None = None,
        limits: Limits | None = None,
    ) -> None:
        super().__init__(clock=clock, limits=limits)
        try:
            self.synchronous = Synchronous(str(synchronous).lower())
        except ValueError:
            raise ConfigurationError(
                f"synchronous must be 'full' or 'normal', not {synchronous!r}"
            ) from None
        self.path = Path(path)
        self._busy_ms = int(busy_timeout * 1000)
        self._lock = threading.Lock()
        self._closed = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(
                self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
            )
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open store {self.path}: {exc}") from exc
        self._conn.row_factory = sqlite3.Row
        try:
            self._configure(busy_timeout)
            self._migrate()
            self._conn.execute("PRAGMA busy_timeout = 0")
        except sqlite3.Error as exc:
            self._conn.close()
            raise StoreError(_describe(exc, str(self.path))) from exc
        except BaseException:
            self._conn.close()
            raise

    def _configure(self, busy_timeout: float) -> None:
        c = self._conn
        c.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        mode = c.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":  # pragma: no cover - e.g. a read-only medium
            raise StoreError(f"store {self.path} cannot use WAL journaling (got {mode})")
        c.execute(f"PRAGMA synchronous = {self.synchronous.value.upper()}")
        c.execute("PRAGMA foreign_keys = ON")
        # Keep hot index pages in memory: claims and updates touch random b-tree leaves.
        c.execute(f"PRAGMA cache_size = -{CACHE_KIB}")

    def _migrate(self) -> None:
        with self._transaction(write=True) as c:
            c.execute(
                "CREATE TABLE IF NOT EXISTS keel_schema ("
                " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL"
                ") STRICT"
            )
            current = c.execute("SELECT coalesce(max(version), 0) FROM keel_schema").fetchone()[0]
            if current > SCHEMA_VERSION:
                raise StoreError(
                    f"store {self.path} has schema version {current}, newer than this Keel "
                    f"supports ({SCHEMA_VERSION}); upgrade keel-tasks"
                )
            for migration in _MIGRATIONS[current:]:
                for statement in _statements(migration.sql):
                    c.execute(statement)
                c.execute(
                    "INSERT INTO keel_schema (version, name, applied_at) VALUES (?, ?, ?)",
                    (migration.version, migration.name, time.time()),
                )

    @property
    def schema_version(self) -> int:
        """The schema version recorded in the file."""
        with self._lock:
            return int(self._conn.execute("SELECT max(version) FROM keel_schema").fetchone()[0])

    @contextmanager
    def _transaction(self, *, write: bool, begun: bool = False) -> Iterator[sqlite3.Connection]:
        c = self._conn
        if not begun:
            c.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            yield c
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")

    def _run_locked(self, fn: Callable[[Any], T], write: bool, *, begun: bool = False) -> T:
        if self._closed:
            raise StoreError(f"store {self.path} is closed")
        try:
            with self._transaction(write=write, begun=begun) as c:
                return fn(_SqliteTx(c))
        except sqlite3.Error as exc:
            if self._conn.in_transaction:  # pragma: no cover - COMMIT itself failed
                self._conn.execute("ROLLBACK")
            raise StoreError(_describe(exc, str(self.path))) from exc

    def _run_waiting(self, fn: Callable[[Any], T], write: bool) -> T:
        with self._lock:
            # The connection normally never waits (busy_timeout 0, see _try_inline); here,
            # in a worker thread, it may: up to the configured busy timeout.
            self._conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            try:
                return self._run_locked(fn, write)
            finally:
                self._conn.execute("PRAGMA busy_timeout = 0")

    def _try_inline(self, fn: Callable[[Any], T], write: bool) -> tuple[bool, T | None]:
        """Run on the caller's thread if nothing has to wait: no other caller in this
        process, and no other process holding the write lock (busy_timeout is 0 here, so
        a held lock answers SQLITE_BUSY at once instead of blocking the event loop)."""
        if not self._lock.acquire(blocking=False):
            return False, None
        try:
            if self._closed:
                raise StoreError(f"store {self.path} is closed")
            try:
                self._conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            except sqlite3.OperationalError:
                return False, None  # another process is writing: wait in a thread instead
            return True, self._run_locked(fn, write, begun=True)
        finally:
            self._lock.release()

    async def _run(self, fn: Callable[[Any], T], *, write: bool) -> T:
        # Most operations take well under a millisecond, far less than a thread hop costs,
        # so they run inline. Anything that would wait (another process's write lock, or
        # another caller of this store) waits in a worker thread instead, never on the loop.
        done, value = self._try_inline(fn, write)
        if done:
            return value  # type: ignore[return-value]  # set whenever done is True
        return await anyio.to_thread.run_sync(self._run_waiting, fn, write)

    def integrity_check(self) -> str:
        """``PRAGMA integrity_check``: ``"ok"`` for a sound file."""
        with self._lock:
            return str(self._conn.execute("PRAGMA integrity_check").fetchone()[0])

    async def close(self) -> None:
        self.close_sync()

    def close_sync(self) -> None:
        """Close the connection. Safe to call twice."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()


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
