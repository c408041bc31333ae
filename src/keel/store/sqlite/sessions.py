"""A store whose write-ahead log was lost after a crash is refused, not silently rolled back.

In WAL mode the newest commits live in ``keel.db-wal`` until a checkpoint copies them
into ``keel.db``. SQLite deletes the log when the last connection closes cleanly, and
keeps it after a crash so that the next open recovers from it. A log deleted after a
crash (or a ``keel.db`` copied without it) therefore looks exactly like a store closed
cleanly, and SQLite opens it without a word, without the acknowledged commits that were
only in the log (an adversarial run lost 137 completions this way).

Keel tells the two apart with a row per open connection in ``keel_sessions`` (migration
0005): written when the connection opens and copied into the database file at once (a
passive checkpoint), deleted when it closes. While any connection is open the log
exists, so when a store is opened and its log is missing, no one else has it open; a
row in the file then is a connection that never closed (its process killed, or the
machine stopped) and whose log is gone: :class:`~keel.errors.WalLost`, naming who. Rows
of processes of this host that are alive are not counted (one may be opening just
now); rows of processes that died while the log survived are removed at the next open
(their commits were recovered from the log).

``?lost_wal=accept`` in the store URL opens such a store anyway: the stale rows are
removed and the store goes on with what the file holds.
"""

from __future__ import annotations

import os
import secrets
import socket
import sqlite3
import time
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

from keel.errors import WalLost

__all__ = ["LostWal", "Session", "wal_present"]


class LostWal(StrEnum):
    """What to do with a store whose log was lost after a crash (the URL's ``lost_wal``)."""

    REFUSE = "refuse"
    ACCEPT = "accept"


def wal_present(path: Path) -> bool:
    """Whether ``path``'s write-ahead log is beside it (asked before connecting: the
    connection creates one)."""
    return Path(f"{path}-wal").exists()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


class Session:
    """This connection's row in ``keel_sessions``."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(8)
        self.host = socket.gethostname()

    def begin(
        self, sql: sqlite3.Connection, path: Path, *, wal_was_present: bool, lost_wal: LostWal
    ) -> None:
        """Check for a lost log, then record this connection, in the file itself.

        Raises:
            WalLost: the log is missing and a connection that never closed is recorded
                (unless ``lost_wal`` is ``"accept"``).
        """
        gone = self._gone(sql)
        if gone and not wal_was_present and lost_wal is not LostWal.ACCEPT:
            raise WalLost(str(path), [_describe(row) for row in gone])
        sql.execute("BEGIN IMMEDIATE")
        try:
            tokens = [(row["token"],) for row in gone]
            sql.executemany("DELETE FROM keel_sessions WHERE token = ?", tokens)
            sql.execute(
                "INSERT INTO keel_sessions (token, pid, host, opened_at) VALUES (?, ?, ?, ?)",
                (self.token, os.getpid(), self.host, time.time()),
            )
        except BaseException:
            sql.execute("ROLLBACK")
            raise
        sql.execute("COMMIT")
        # Into the database file now, not at the next checkpoint: it is the file without
        # its log that must say so. Passive: it never waits for another connection.
        sql.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def _gone(self, sql: sqlite3.Connection) -> list[sqlite3.Row]:
        """Recorded connections whose process is gone (another host's: unknowable,
        counted as gone; SQLite's locks do not span hosts, so it cannot have it open)."""
        rows = sql.execute("SELECT token, pid, host, opened_at FROM keel_sessions").fetchall()
        return [r for r in rows if r["host"] != self.host or not _alive(int(r["pid"]))]

    def end(self, sql: sqlite3.Connection) -> None:
        """Remove this connection's row (before the close folds the log in)."""
        sql.execute("DELETE FROM keel_sessions WHERE token = ?", (self.token,))


def _describe(row: sqlite3.Row) -> str:
    opened = datetime.fromtimestamp(float(row["opened_at"]), UTC).strftime("%Y-%m-%d %H:%M:%S")
    return f"pid {row['pid']} on {row['host']}, opened {opened} UTC"
