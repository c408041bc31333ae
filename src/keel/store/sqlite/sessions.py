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
machine stopped) and whose log is gone: :class:`~keel.errors.WalLost`, naming who.
Alive means the same pid *and* the same boot and start time (:func:`process_identity`),
so a pid reused after a crash is not taken for the crashed process. Rows of processes
that died while the log survived are removed at the next open (their commits were
recovered from the log).

A row of another process of this host that is alive, with the log missing, is a log
deleted under a running process, or ``keel.db`` copied alone while it ran (``WalLost``
with ``running``): that process's open
connection means a log exists, since SQLite removes it only when the last connection
closes, and a connection records its row only once it has the log, under
:func:`opening`, and removes it before closing. That process still has the deleted log
open and writes to it; a clean stop folds it into the file, so nothing is lost unless
another process opens the store meanwhile (it would see the file without those writes,
start a log of its own, and have it deleted by that process's close). The deletion is
caught at the next open, not by the running process itself (its commits go on
succeeding into the deleted file until it stops). This process's own rows are not
counted: a connection of this process that closed without removing its row (the
removal failed: a full disk) leaves one while the process lives. Another process's such
row is refused until that process exits (or ``?lost_wal=accept``): the one case taken
for a deletion wrongly, and it is logged where it happens ("cannot remove this
connection's record").

Opens are serialized (:func:`opening`, a lock of the store's folder), so that two
processes opening at once cannot each take the other's new log for the old one.

``?lost_wal=accept`` in the store URL opens such a store anyway: the stale rows are
removed and the store goes on with what the file holds.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import sqlite3
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

from keel.errors import WalLost

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: opens are not serialized
    fcntl = None  # type: ignore[assignment]

__all__ = ["LostWal", "Session", "opening", "process_identity", "wal_present"]


class LostWal(StrEnum):
    """What to do with a store whose log was lost after a crash (the URL's ``lost_wal``)."""

    REFUSE = "refuse"
    ACCEPT = "accept"


def wal_present(path: Path) -> bool:
    """Whether ``path``'s write-ahead log is beside it (asked before connecting: the
    connection creates one)."""
    return Path(f"{path}-wal").exists()


@contextlib.contextmanager
def opening(path: Path, *, alone: bool = False) -> Iterator[None]:
    """Opens of ``path`` one at a time, across processes: "was the log there?" must be
    asked before another opener's connection makes a new one, and answered together with
    reading and tidying the recorded connections. The lock is an exclusive ``flock`` of
    the folder (not of the database file: closing another descriptor of it would drop
    SQLite's own locks in this process; not of a file of its own, which would outlive
    the store), held for milliseconds, or as long as a busy write lock makes the open
    wait (``busy_timeout`` bounds that). ``alone``: a file no other process can know of
    yet (a new store's draft): nothing to serialize."""
    if alone or fcntl is None:
        yield
        return
    try:
        folder = os.open(path.parent, os.O_RDONLY)
    except OSError:  # SQLite's own open then says what is wrong
        yield
        return
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        yield
    finally:
        os.close(folder)  # releases the lock


def process_identity(pid: int) -> str:
    """What tells process ``pid`` from an earlier one that had the same pid: the boot and
    its start time, where the system says (Linux's ``/proc``), else ``""`` (the pid alone
    then). A pid reused after a crash (a container's process is often pid 1 every time)
    is then not taken for the process that crashed."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (command) "
    return f"{boot}/{fields[19]}"  # field 22 of stat: start time, in ticks since boot


def _alive(pid: int, identity: str) -> bool:
    """Whether the process that recorded ``pid`` and ``identity`` still runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        pass
    return not identity or process_identity(pid) == identity


class Session:
    """This connection's row in ``keel_sessions``."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(8)
        self.host = socket.gethostname()
        self.identity = process_identity(os.getpid())

    def begin(
        self, sql: sqlite3.Connection, path: Path, *, wal_was_present: bool, lost_wal: LostWal
    ) -> None:
        """Check for a lost log, then record this connection, in the file itself.

        Raises:
            WalLost: the log is missing and a connection that never closed is recorded
                (unless ``lost_wal`` is ``"accept"``).
        """
        rows = sql.execute("SELECT * FROM keel_sessions").fetchall()
        gone = [row for row in rows if self._is_gone(row)]
        if not wal_was_present and lost_wal is not LostWal.ACCEPT:
            gone_tokens = {row["token"] for row in gone}
            running = [
                r for r in rows if r["token"] not in gone_tokens and int(r["pid"]) != os.getpid()
            ]
            if running:
                raise WalLost(str(path), [_describe(row) for row in running], running=True)
            if gone:
                raise WalLost(str(path), [_describe(row) for row in gone])
        sql.execute("BEGIN IMMEDIATE")
        try:
            tokens = [(row["token"],) for row in gone]
            sql.executemany("DELETE FROM keel_sessions WHERE token = ?", tokens)
            sql.execute(
                "INSERT INTO keel_sessions (token, pid, identity, host, opened_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (self.token, os.getpid(), self.identity, self.host, time.time()),
            )
        except BaseException:
            sql.execute("ROLLBACK")
            raise
        sql.execute("COMMIT")
        # Into the database file now, not at the next checkpoint: it is the file without
        # its log that must say so. Passive: it never waits for another connection.
        sql.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def _is_gone(self, row: sqlite3.Row) -> bool:
        """Whether a recorded connection's process is gone (another host's: unknowable,
        counted as gone; SQLite's locks do not span hosts, so it cannot have it open)."""
        return row["host"] != self.host or not _alive(int(row["pid"]), str(row["identity"]))

    def _gone(self, sql: sqlite3.Connection) -> list[sqlite3.Row]:
        """Recorded connections whose process is gone."""
        rows = sql.execute("SELECT * FROM keel_sessions").fetchall()
        return [row for row in rows if self._is_gone(row)]

    def end(self, sql: sqlite3.Connection) -> None:
        """Remove this connection's row, and those of processes that are gone (before the
        close folds the log in). A process that exited without closing the store (a
        ``keel serve`` whose port was taken, say) lost nothing while the log is here: the
        fold takes its commits into the file, and a row of it left there would have the
        next open refuse the store once the log is deleted by a clean close."""
        tokens = [(self.token,), *((row["token"],) for row in self._gone(sql))]
        sql.execute("BEGIN IMMEDIATE")
        try:
            sql.executemany("DELETE FROM keel_sessions WHERE token = ?", tokens)
        except BaseException:
            sql.execute("ROLLBACK")
            raise
        sql.execute("COMMIT")


def _describe(row: sqlite3.Row) -> str:
    opened = datetime.fromtimestamp(float(row["opened_at"]), UTC).strftime("%Y-%m-%d %H:%M:%S")
    return f"pid {row['pid']} on {row['host']}, opened {opened} UTC"
