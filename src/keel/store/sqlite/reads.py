"""Reads on a connection of their own, so that no read waits for a write's commit.

A group of writes is committed in the store's writer thread (see :mod:`.writes`), which
holds the writer connection through the fsync. Reads use a second, read-only connection
to the same file: WAL lets it read the last committed state while that commit is under
way, so a ``tasks/get`` answered on the event loop never waits for the disk. A read runs
inline, in a deferred transaction (``busy_timeout`` 0); should SQLite answer SQLITE_BUSY
(rare in WAL: another process recovering the log, say), it runs again in a thread, where
waiting is allowed. The connection is read-only (``mode=ro``): it never writes, and never
checkpoints or deletes the log when it closes.
"""

from __future__ import annotations

import sqlite3
import threading
from typing import Final, TypeVar

from keel.store.base import Op
from keel.store.sqlite.connection import CACHE_KIB, Connection
from keel.store.sqlite.faults import is_busy
from keel.store.sqlite.tx import SqliteTx

__all__ = ["BUSY", "Busy", "Reader"]

T = TypeVar("T")


class Busy:
    """What :meth:`Reader.run` returns when the read must wait: run it waiting."""


BUSY: Final = Busy()


class Reader:
    """The read-only connection beside ``db`` (the store's own, which it follows: closed
    when that is), with the lock that serialises its use.

    Raises:
        StoreError: the file cannot be opened.
    """

    def __init__(self, db: Connection) -> None:
        self._db = db
        self.lock = threading.Lock()
        self.closed = False
        try:
            self.sql = sqlite3.connect(
                f"{db.path.resolve().as_uri()}?mode=ro",
                uri=True,
                timeout=0,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise db.fail(exc) from exc
        db.close_first(self.close)
        self.sql.row_factory = sqlite3.Row
        try:
            self.sql.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        except sqlite3.Error as exc:
            self.close()
            raise db.fail(exc) from exc

    def run(self, op: Op[T]) -> T | Busy:
        """Run ``op`` now, without waiting (on the event loop); :data:`BUSY` if the
        connection is in use or SQLite would have to wait.

        Raises:
            StoreError: the store is closed, or the read failed.
        """
        if not self.lock.acquire(blocking=False):
            return BUSY  # a waiting read holds it, in a thread
        try:
            self._check_open()
            try:
                self.sql.execute("BEGIN")
                return op.run(SqliteTx(self.sql))
            except sqlite3.Error as exc:
                if not is_busy(exc):
                    raise self._db.fail(exc) from exc
                return BUSY
            finally:
                self._end()
        finally:
            self.lock.release()

    def run_waiting(self, op: Op[T]) -> T:
        """Run ``op`` in a worker thread, waiting for locks up to the busy timeout.

        Raises:
            StoreError: the store is closed, or the read failed.
        """
        with self.lock:
            self._check_open()
            conn = self.sql
            try:
                conn.execute(f"PRAGMA busy_timeout = {self._db.busy_ms}")
                try:
                    conn.execute("BEGIN")
                    return op.run(SqliteTx(conn))
                finally:
                    self._end()
                    conn.execute("PRAGMA busy_timeout = 0")
            except sqlite3.Error as exc:
                raise self._db.fail(exc) from exc

    def _end(self) -> None:
        """End the read transaction (there is nothing to commit)."""
        if self.sql.in_transaction:
            self.sql.execute("ROLLBACK")

    def _check_open(self) -> None:
        if self.closed:
            raise self._db.fail_closed()
        self._db.check_open()

    def close(self) -> None:
        """Close the connection. Safe to call twice."""
        with self.lock:
            if not self.closed:
                self.closed = True
                self.sql.close()
