"""A store whose write-ahead log was lost after a crash is refused, not silently rolled
back (keel.store.sqlite.sessions): a real process is SIGKILLed while it holds the store
open with acknowledged tasks in the log, then the log is deleted."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from keel import ConfigurationError, StoreError
from keel.errors import WalLost
from keel.store import SqliteStore, open_store
from keel.store.sqlite.sessions import process_identity
from store_files import wal_size

pytestmark = pytest.mark.anyio

HOLDER = """
import asyncio, sys
from keel.store import SqliteStore

async def main():
    store = SqliteStore(sys.argv[1])
    ids = [(await store.create(name="job")).task_id for _ in range(20)]
    print(" ".join(ids), flush=True)
    sys.stdin.read()  # holds the store open until killed

asyncio.run(main())
"""


@contextmanager
def holding(script: str, db: Path) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """A process running ``script`` on ``db``, once it has printed the ids of the 20
    tasks it created; killed at the end if it still runs."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ids = proc.stdout.readline().split()
        assert len(ids) == 20, "the holder did not create its tasks"
        yield proc, ids
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


@contextmanager
def killed_holder(db: Path) -> Iterator[tuple[int, list[str]]]:
    """A process that opens ``db``, creates 20 tasks (each acknowledged: committed and
    fsynced), prints their ids and is SIGKILLed; its pid and the ids."""
    with holding(HOLDER, db) as (proc, ids):
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        yield proc.pid, ids


def _keel(*args: str) -> subprocess.CompletedProcess[str]:
    """The ``keel`` command of this environment, in a process of its own."""
    keel = Path(sys.executable).parent / "keel"
    return subprocess.run([keel, *args], check=False, capture_output=True, text=True, timeout=60)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _lose_wal(db: Path) -> None:
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)


async def test_a_store_whose_wal_was_deleted_after_a_crash_is_refused(tmp_path: Path) -> None:
    """The crash left the tasks in the log; with the log deleted, opening is refused with
    WalLost naming the process that never closed it, the file is left as it was, and the
    CLI says so in one line; ``?lost_wal=accept`` opens what the file holds."""
    db = tmp_path / "keel.db"
    SqliteStore(db).close_sync()
    with killed_holder(db) as (pid, ids):
        assert wal_size(db), "the acknowledged tasks are in the log"
        _lose_wal(db)
        before = _digest(db)
        with pytest.raises(WalLost) as refused:
            SqliteStore(db)
        assert f"pid {pid} on " in str(refused.value)
        assert f"{db}-wal is missing" in str(refused.value)
        assert isinstance(refused.value, StoreError)
        assert _digest(db) == before
        assert wal_size(db) is None, "the refused open left no log behind"
        with pytest.raises(WalLost):
            SqliteStore(db)  # nor does a second try take an empty log for a survivor

        result = _keel("tasks", "list", "--store", str(db))
        assert result.returncode == 1, (result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
        [line] = result.stderr.splitlines()
        assert line.startswith(f"keel: error: store {db} was not closed cleanly")
        assert "?lost_wal=accept" in line

        accepted = open_store(f"sqlite:///{db}?lost_wal=accept")
        try:
            assert not {t.task_id for t in await accepted.list()} & set(ids)
        finally:
            await accepted.close()
        SqliteStore(db).close_sync()  # accepted once: opens as any store from now on


async def test_a_crash_with_its_wal_kept_recovers_every_task(tmp_path: Path) -> None:
    """The usual crash: the log is still there, the next open recovers every acknowledged
    task from it and forgets the dead process; after a clean close (the log deleted by
    SQLite) the store opens without complaint."""
    db = tmp_path / "keel.db"
    with killed_holder(db) as (_, ids):
        store = SqliteStore(db)
        try:
            assert set(ids) <= {t.task_id for t in await store.list()}
        finally:
            await store.close()
        assert wal_size(db) is None
        SqliteStore(db).close_sync()


async def test_a_backup_made_while_another_process_holds_the_store_opens(
    tmp_path: Path,
) -> None:
    """``store.backup`` copies the file while another process has it open: the copy
    records no open connection, so it opens after that process died."""
    db = tmp_path / "keel.db"
    copy = tmp_path / "copy.db"
    with killed_holder(db) as (_, ids):
        store = SqliteStore(db)
        try:
            store.backup(copy)
        finally:
            await store.close()
    restored = SqliteStore(copy)
    try:
        assert set(ids) <= {t.task_id for t in await restored.list()}
    finally:
        await restored.close()


# As HOLDER, then on a line of stdin: 5 more tasks, the store closed cleanly, their ids.
LIVE_HOLDER = """
import asyncio, sys
from keel.store import SqliteStore

async def main():
    store = SqliteStore(sys.argv[1])
    ids = [(await store.create(name="job")).task_id for _ in range(20)]
    print(" ".join(ids), flush=True)
    sys.stdin.readline()  # the log is deleted meanwhile
    ids = [(await store.create(name="job")).task_id for _ in range(5)]
    await store.close()
    print(" ".join(ids), flush=True)

asyncio.run(main())
"""


async def test_a_wal_deleted_under_a_running_process_is_refused(tmp_path: Path) -> None:
    """Another process has the store open, with acknowledged tasks in its log, and the
    log is deleted under it: opening the store is refused (WalLost, ``running``, naming
    that process and telling to stop it cleanly), the file left as it was. That process
    goes on writing to the deleted log, and its clean close folds every task into the
    file, as the error says."""
    db = tmp_path / "keel.db"
    SqliteStore(db).close_sync()
    with holding(LIVE_HOLDER, db) as (holder, first):
        _lose_wal(db)
        before = _digest(db)
        with pytest.raises(WalLost) as refused:
            SqliteStore(db)
        assert refused.value.running
        assert f"pid {holder.pid} on " in str(refused.value)
        assert "stop that process cleanly (SIGTERM" in str(refused.value)
        assert _digest(db) == before
        assert wal_size(db) is None, "the refused open left no log behind"
        assert holder.stdin is not None
        assert holder.stdout is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        then = holder.stdout.readline().split()
        assert holder.wait(timeout=30) == 0
    store = SqliteStore(db)
    try:
        assert {t.task_id for t in await store.list(limit=100)} == {*first, *then}
    finally:
        await store.close()


def test_lost_wal_takes_refuse_or_accept(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="lost_wal must be 'refuse' or 'accept'"):
        open_store(f"sqlite:///{tmp_path}/k.db?lost_wal=maybe")


def _record_stale(db: Path, pid: int, identity: str) -> None:
    """A row as a process that crashed would have left it, written into ``db`` itself."""
    SqliteStore(db).close_sync()
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO keel_sessions (token, pid, identity, host, opened_at)"
            " VALUES (?, ?, ?, ?, ?)",
            ("stale", pid, identity, socket.gethostname(), 0.0),
        )
    conn.close()
    assert wal_size(db) is None


def test_a_reused_pid_is_not_taken_for_the_process_that_crashed(tmp_path: Path) -> None:
    """A crashed process's pid now belongs to another process (a container's pid 1 every
    time, say; here this very process): its boot and start time differ, so the row is a
    crash's. With the log missing that is refused; with a log it is tidied away."""
    db = tmp_path / "keel.db"
    _record_stale(db, os.getpid(), "another-boot/1")
    with pytest.raises(WalLost, match=f"pid {os.getpid()} on "):
        SqliteStore(db)
    Path(f"{db}-wal").write_bytes(b"")  # as a crash that left its (empty) log would
    SqliteStore(db).close_sync()
    SqliteStore(db).close_sync()  # the stale row went with the first open


def test_this_process_recorded_under_its_own_identity_is_alive(tmp_path: Path) -> None:
    """A row of this very process, which has no connection open, is never a crash's:
    one of its connections closed without removing its row (the removal failed), which
    SQLite's close then followed by deleting the log."""
    db = tmp_path / "keel.db"
    _record_stale(db, os.getpid(), process_identity(os.getpid()))
    SqliteStore(db).close_sync()


LEAVER = """
import asyncio, sys
from keel.store import SqliteStore

async def main():
    store = SqliteStore(sys.argv[1])
    await store.create(name="job")
    raise SystemExit(1)  # on its way out without closing the store (a port taken, say)

asyncio.run(main())
"""


def test_a_process_that_exits_without_closing_leaves_a_store_that_opens(tmp_path: Path) -> None:
    """A process that exits (not killed) without closing its store: its connection is
    closed at exit like any other, record included, so the store opens afterwards
    (SQLite's own close at exit deletes the log; a record left behind would look like a
    crash whose log was lost)."""
    db = tmp_path / "keel.db"
    done = subprocess.run(
        [sys.executable, "-c", LEAVER, str(db)], check=False, capture_output=True, timeout=60
    )
    assert done.returncode == 1, done.stderr
    assert wal_size(db) is None
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        assert conn.execute("SELECT count(*) FROM keel_sessions").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM tasks").fetchone()[0] == 1
    conn.close()
    Path(f"{db}-wal").unlink(missing_ok=True)  # what the read-only look left
    Path(f"{db}-shm").unlink(missing_ok=True)
    SqliteStore(db).close_sync()
