"""The SQLite change feed: the ``task_changes`` log, read when another connection commits.

Triggers (migration 0002) append a task's id to ``task_changes`` in the transaction that
writes its row, so the log holds committed changes only, numbered in commit order. One
daemon thread per store, started by its first listener, owns a read-only connection and
asks it ``PRAGMA data_version`` every :data:`TICK`: that counter changes when any *other*
connection (this process's writer included) commits, and reading it touches no table
(it is answered from the WAL index in shared memory, a few microseconds). Only then
does the thread read the log past its last position, through the primary key.

Why this and not something else: a file or socket signal would need every writer (other
Keel versions, ``sqlite3`` in a shell) to send it, and would be lost by a writer killed
between COMMIT and the signal; ``data_version`` sees every commit of every process on
the machine, and the log says exactly which tasks changed without re-reading any task.
Latency is at most one tick plus one indexed read; cost while idle is one pragma per
tick per process, whatever the number of listeners.

If the log was pruned past the thread's position (it fell more than 10,000 changes
behind) or the read fails, listeners are told to re-read everything (``task_ids=None``).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

from keel.store.changes import ChangeHub

__all__ = ["ChangeLogReader"]

log = logging.getLogger("keel.store.sqlite")

TICK = 0.005  # seconds between two looks at PRAGMA data_version
BATCH = 5000  # log entries read at most per query


class ChangeLogReader:
    """The thread that feeds a store's :class:`ChangeHub` from its change log."""

    def __init__(self, path: Path, hub: ChangeHub) -> None:
        self._path = path
        self._hub = hub
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ready = threading.Event()
        """Set once the thread knows the log's current end (tests wait on it)."""

    def start(self) -> int:
        """Note the log's current end (returned), then follow it in a daemon thread.

        Raises:
            sqlite3.Error: the file cannot be read.
        """
        conn = sqlite3.connect(
            f"{self._path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False
        )
        position = self._end(conn)
        self._thread = threading.Thread(
            target=self._run, args=(conn, position), name="keel-sqlite-changes", daemon=True
        )
        self._thread.start()
        return position

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @staticmethod
    def _end(conn: sqlite3.Connection) -> int:
        row = conn.execute("SELECT coalesce(max(seq), 0) FROM task_changes").fetchone()
        return int(row[0])

    def _run(self, conn: sqlite3.Connection, position: int) -> None:
        version = -1
        self.ready.set()
        try:
            while not self._stop.wait(TICK):
                try:
                    now = conn.execute("PRAGMA data_version").fetchone()[0]
                    if now == version:
                        continue
                    version = now
                    position = self._read(conn, position)
                except sqlite3.Error as exc:
                    log.info("change log not readable (%s); listeners re-read", exc)
                    self._hub.resync()
        finally:
            conn.close()

    def _read(self, conn: sqlite3.Connection, position: int) -> int:
        """Publish the log past ``position``; the new position."""
        while True:
            rows = conn.execute(
                "SELECT seq, task_id FROM task_changes WHERE seq > ? ORDER BY seq LIMIT ?",
                (position, BATCH),
            ).fetchall()
            if not rows:
                return position
            if rows[0][0] != position + 1:
                # Pruned past us (or a log that started over): we cannot say what changed.
                self._hub.resync()
            self._hub.publish({task_id for _, task_id in rows}, rows[-1][0])
            position = rows[-1][0]
            if len(rows) < BATCH:
                return position
