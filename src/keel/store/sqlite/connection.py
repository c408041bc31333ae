"""The store's one SQLite connection: opened, configured, migrated, and locked.

* WAL journal, so readers never block the writer and the writer never blocks readers.
* ``synchronous=FULL`` by default: a commit is fsynced before it is acknowledged.
* ``busy_timeout`` is 0 while the connection is used on the event loop (another
  process's lock answers SQLITE_BUSY at once, and the work moves to a thread), and set
  only around work in a thread that may wait (:meth:`Connection.waiting`).
* Schema versions are the migrations in ``migrations/``; a file newer than this Keel is
  refused.
* A missing file is created whole or not at all (built beside it, then linked into
  place), so an existing file that is empty or has no SQLite header is not a store being
  created: it is refused (:class:`~keel.errors.NotAStore`), not taken for an empty
  store. (An empty file whose write lock another process holds is one being made the
  old way, by an older Keel or by sqlite3: that one is opened, waiting for the lock.)
* Closing folds the WAL into the file (``wal_checkpoint(TRUNCATE)``): after a clean
  stop, the database file alone holds every task.

A :class:`threading.Lock` serialises the connection between the event loop and worker
threads: whoever holds it owns the connection and its open transaction.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import logging
import os
import random
import secrets
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path

from keel.errors import NotAStore, StoreError
from keel.store.sqlfiles import load_migrations
from keel.store.sqlite.faults import fault_of, is_busy, translate
from keel.store.sqlite.sessions import LostWal, Session, opening, wal_present

__all__ = [
    "CACHE_KIB",
    "DEFAULT_BUSY_TIMEOUT",
    "SCHEMA_VERSION",
    "SQLITE_HEADER",
    "WAL_LIMIT_BYTES",
    "Connection",
    "Synchronous",
    "check_file",
    "remove_files",
]

log = logging.getLogger("keel.store.sqlite")

_MIGRATIONS = load_migrations("keel.store.sqlite.migrations")

_OPEN: weakref.WeakSet[Connection] = weakref.WeakSet()
"""Connections recorded in their file (see :mod:`.sessions`) and not closed yet."""


@atexit.register
def _close_at_exit() -> None:
    """A process that exits without closing its stores (an error on the way out, say)
    closes them here, as SQLite would close their files anyway: the record of each
    connection goes with it, and the log is folded in. Otherwise SQLite's own close
    would delete the log and leave the record, and the next open would take that for a
    crash whose log was lost."""
    for conn in list(_OPEN):
        # A daemon thread may be stuck holding the lock: exit anyway (the log then stays).
        if conn.lock.acquire(timeout=2):
            conn.lock.release()
            conn.close()


SCHEMA_VERSION = _MIGRATIONS[-1].version
"""The schema version this Keel writes and reads."""

DEFAULT_BUSY_TIMEOUT = 30.0  # seconds a writer waits for another process's lock
CACHE_KIB = 64 * 1024  # page cache per connection, KiB
WAL_LIMIT_BYTES = 64 * 1024 * 1024  # a WAL larger than this is truncated after checkpoints

SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database
_DAMAGED = frozenset({"SQLITE_CORRUPT", "SQLITE_NOTADB"})  # what a failed check raises
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK})

_JITTER = random.Random()  # noqa: S311 - spreads lock polls; nothing secret about it


class Synchronous(StrEnum):
    """How hard a commit is pushed to disk before it is acknowledged."""

    FULL = "full"
    """fsync on every commit: survives process crashes and power loss (the default)."""
    NORMAL = "normal"
    """fsync at checkpoints only: survives process crashes; power loss may lose recent commits."""


class Connection:
    """The open connection of one store, with the lock that serialises its use.

    Args:
        new: ``path`` is a draft this module is creating (see :func:`_create`), not a
            store to check or create.

    Raises:
        NotAStore: an existing file that is empty or not a SQLite database.
        StoreError: the file cannot be opened as a Keel store, or its schema is newer than
            this Keel understands.
    """

    def __init__(
        self,
        path: Path,
        *,
        synchronous: Synchronous,
        busy_timeout: float,
        new: bool = False,
        lost_wal: LostWal = LostWal.REFUSE,
    ) -> None:
        self.path = path
        self.busy_ms = int(busy_timeout * 1000)
        self.lock = threading.Lock()
        self.closed = False
        self.session: Session | None = None
        self._companions: list[Callable[[], None]] = []
        try:
            if not new and not path.exists():
                _create(path, synchronous, busy_timeout)
            if not new:
                check_file(path)
            with opening(path, alone=new):
                self._open(synchronous, busy_timeout, new=new, lost_wal=lost_wal)
        except OSError as exc:  # its folder cannot be made, a name too long …
            raise StoreError(f"cannot open store {path}: {exc.strerror or exc}") from exc

    def _open(
        self, synchronous: Synchronous, busy_timeout: float, *, new: bool, lost_wal: LostWal
    ) -> None:
        """Connect, configure, migrate and record the connection (under :func:`opening`:
        whether the log was there is asked before anyone else connects meanwhile)."""
        wal_was_present = wal_present(self.path)
        try:
            self.sql = sqlite3.connect(
                self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise translate(exc, self.path) from exc
        self.sql.row_factory = sqlite3.Row
        try:
            self._configure(synchronous, busy_timeout)
            self._migrate()
            if not new:
                self._begin_session(wal_was_present, lost_wal)
            self.sql.execute("PRAGMA busy_timeout = 0")
        except sqlite3.Error as exc:
            self._abandon(wal_was_present)
            raise translate(exc, self.path) from exc
        except BaseException:
            self._abandon(wal_was_present)
            raise

    def _abandon(self, wal_was_present: bool) -> None:
        """Close a connection whose open failed; if it made the log (there was none), take
        that empty log away again: a refused store must be left as it was, and the next
        open must not take this empty log for one that survived a crash."""
        self.sql.close()
        wal = Path(f"{self.path}-wal")
        if not wal_was_present and wal.exists() and wal.stat().st_size == 0:
            wal.unlink(missing_ok=True)
            Path(f"{self.path}-shm").unlink(missing_ok=True)

    def _begin_session(self, wal_was_present: bool, lost_wal: LostWal) -> None:
        """Record this connection (see :mod:`.sessions`), refusing a store whose log was
        lost after a crash. A store that cannot take the row (its disk full) is still
        opened, unrecorded: reading it must stay possible."""
        session = Session()
        try:
            session.begin(self.sql, self.path, wal_was_present=wal_was_present, lost_wal=lost_wal)
        except sqlite3.Error as exc:
            log.warning("store %s: cannot record this connection: %s", self.path, self.fail(exc))
            return
        self.session = session
        _OPEN.add(self)

    def __del__(self) -> None:
        # Dropped unclosed: close as the at-exit hook would (see _close_at_exit).
        if getattr(self, "session", None) is not None and not getattr(self, "closed", True):
            with contextlib.suppress(Exception):  # nothing may escape a finalizer
                self.close()

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

    def check(self, pragma: str) -> list[str]:
        """What ``PRAGMA quick_check`` or ``PRAGMA integrity_check`` reports: ``["ok"]``
        for a sound file, else SQLite's description of each problem (a page so damaged
        that the check itself stops is one problem too)."""
        assert pragma in {"quick_check", "integrity_check"}
        with self.waiting() as conn:
            rows: list[str] = []
            try:
                rows.extend(str(row[0]) for row in conn.execute(f"PRAGMA {pragma}"))
            except sqlite3.Error as exc:
                fault = fault_of(exc)
                if fault is None or fault.name not in _DAMAGED:
                    raise self.fail(exc) from exc
                rows.append(str(exc))
        # A row may hold several problems, one a line, under a "*** in database … ***" title.
        return [line for row in rows for line in row.splitlines() if not line.startswith("***")]

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

    def close_first(self, close: Callable[[], None]) -> None:
        """Have :meth:`close` call ``close`` first: another connection of this store (see
        :mod:`.reads`), which must be gone for the log to be folded in and deleted."""
        self._companions.append(close)

    def close(self) -> None:
        """Close the companions, fold the WAL into the file, then close the connection.
        Safe to call twice."""
        with self.lock:
            if not self.closed:
                self.closed = True
                try:
                    for close in self._companions:
                        close()
                    self._fold_wal()
                finally:
                    self.sql.close()

    def _end_session(self) -> None:
        """Remove this connection's row, waiting for the write lock as a write does."""
        if self.session is None:
            return
        try:
            self.rollback()
            self.sql.execute(f"PRAGMA busy_timeout = {self.busy_ms}")
            self.session.end(self.sql)
            self.sql.execute("PRAGMA busy_timeout = 0")
        except sqlite3.Error as exc:
            log.warning(
                "store %s: cannot remove this connection's record: %s", self.path, self.fail(exc)
            )

    def _fold_wal(self) -> None:
        """``wal_checkpoint(TRUNCATE)``: every committed row into the database file and
        the WAL emptied, so that the file alone is the whole store.

        It never waits (``busy_timeout`` is 0 here): a checkpoint that waits for another
        process's reader blocks every writer meanwhile, and a ``keel tasks list`` must not
        stall a server's writes. If another process is writing or reading an older
        snapshot just then, the last connection to close folds the WAL in instead (SQLite
        does so on its own), and this one only says so.
        """
        self._end_session()
        try:
            self.rollback()
            busy = self.sql.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        except sqlite3.Error as exc:
            log.warning("could not fold the WAL in on close: %s", self.fail(exc))
            return
        if busy:
            log.info("store %s: WAL still in use by another connection on close", self.path)


def check_file(path: Path) -> None:
    """Refuse an existing file that is not a SQLite database (a missing one is fine: it
    becomes a new store).

    Raises:
        NotAStore: ``path`` is empty (zero bytes) and no other process is making it a
            database, a folder, or starts with anything but SQLite's header.
        OSError: it cannot be read.
        sqlite3.Error: SQLite cannot open it.
    """
    try:
        with path.open("rb") as file:
            header = file.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return
    except IsADirectoryError:
        raise NotAStore(str(path), "is a folder") from None
    if not header:
        if _write_locked(path):
            return
        raise NotAStore(str(path), "is an empty file (0 bytes)")
    if header != SQLITE_HEADER:
        raise NotAStore(str(path), "is not a SQLite database (it lacks SQLite's file header)")


def _write_locked(path: Path) -> bool:
    """Whether another connection holds the write lock of ``path`` now (asked without
    waiting). An empty file that another process holds is a database being made (by an
    older Keel, or sqlite3): it is opened as usual, waiting for that lock."""
    probe = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        return is_busy(exc)
    else:
        probe.execute("ROLLBACK")
        return False
    finally:
        probe.close()


def _create(path: Path, synchronous: Synchronous, busy_timeout: float) -> None:
    """Make a new store at ``path``, whole or not at all: built in a draft file beside it
    (WAL mode, every migration, the WAL folded in), then hard-linked into place, which
    fails if another process made it first (then that one is used). An existing file is
    therefore always a finished store, never one half made by another process: an empty
    one is refused instead of being taken for new.

    Raises:
        OSError: the folder cannot be made or written.
        StoreError: SQLite refused the draft.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{secrets.token_hex(4)}.new")
    try:
        Connection(draft, synchronous=synchronous, busy_timeout=busy_timeout, new=True).close()
        try:
            os.link(draft, path)
        except FileExistsError:
            pass  # another process created it first: open theirs
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS:
                raise
            if not path.exists():  # a file system without hard links: a rename will do
                os.replace(draft, path)
    finally:
        remove_files(draft)


def remove_files(path: Path) -> None:
    """Delete the database file ``path`` and its companions (``-wal``, ``-shm``,
    ``-journal``) where they exist: for drafts, never for a store."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


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
