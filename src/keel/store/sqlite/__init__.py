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
* Writes made together are committed in groups (:mod:`keel.store.group_commit`): one
  commit, one fsync, acknowledges the whole group, and nobody is told "done" before it.
  The commit runs in the store's writer thread, so the event loop is not blocked on the
  disk; reads use a read-only connection of their own (:mod:`.reads`).
* While other processes write the same file, each group of writes is worked out against
  a read snapshot before the write lock is taken, and only checked and executed under it
  (:mod:`.planning`, ``?plan=auto|off`` in the URL), so that the lock is held for SQL and
  the commit, not for Python.

The package, one module per concern: :mod:`.connection` (open, pragmas, migrations, lock
waits), :mod:`.tx` (the row primitives), :mod:`.planning`, :mod:`.writes` (a group in one
transaction), :mod:`.reads` (the read connection) and :mod:`.faults`, where ``sqlite3``
errors become :mod:`keel.errors` and nowhere else. Work runs in a thread whenever it may
wait, so that waiting for the disk or for another process's lock never blocks the event
loop.
"""

from __future__ import annotations

import asyncio
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import anyio.to_thread

from keel.errors import ConfigurationError, StoreDamaged, StoreError, StoreUnavailable
from keel.model import Limits
from keel.store.base import Op, TxStore
from keel.store.group_commit import Lane, run_alone
from keel.store.protocol import Clock
from keel.store.sqlite.changes import ChangeLogReader
from keel.store.sqlite.connection import (
    DEFAULT_BUSY_TIMEOUT,
    SCHEMA_VERSION,
    Connection,
    Synchronous,
)
from keel.store.sqlite.faults import translate
from keel.store.sqlite.planning import CLAIMS_CONTENDED, PlanMode, Planner
from keel.store.sqlite.reads import Busy, Reader
from keel.store.sqlite.sessions import LostWal
from keel.store.sqlite.writes import Writer

__all__ = [
    "CLAIMS_CONTENDED",
    "DEFAULT_BUSY_TIMEOUT",
    "SCHEMA_VERSION",
    "PlanMode",
    "SqliteStore",
    "Synchronous",
]

T = TypeVar("T")


def _choice(
    kind: type[Synchronous] | type[PlanMode] | type[LostWal], value: object, what: str
) -> str:
    """``value`` checked against the members of ``kind``.

    Raises:
        ConfigurationError: it is none of them.
    """
    text = str(value).lower()
    names = [m.value for m in kind]
    if text not in names:
        raise ConfigurationError(
            f"{what} must be {' or '.join(repr(n) for n in names)}, not {value!r}"
        )
    return text


FRESH_WAIT = 0.05
"""Seconds a read of a task waits at most for a write of it queued in this process (see
:meth:`Lane.written`), before it reads what is committed."""


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # pragma: no cover - not on asyncio (e.g. trio)
        return None


class SqliteStore(TxStore):
    """A :class:`keel.store.Store` in one SQLite file.

    Args:
        path: the database file; its folder is created if missing.
        synchronous: ``full`` (default, survives power loss) or ``normal`` (faster; see
            :class:`Synchronous`).
        busy_timeout: seconds a write waits for another process's transaction.
        plan: ``auto`` (default: plan groups of writes while other processes write the
            file), ``off``, or ``always`` (tests); see :class:`PlanMode`.
        clock: seconds since the epoch (injected in tests).
        timeout: seconds a write waits for its answer at most, queued behind others
            included (:class:`StoreUnavailable` after it); None: as long as they take.

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
        plan: PlanMode | str = PlanMode.AUTO,
        lost_wal: LostWal | str = LostWal.REFUSE,
        clock: Clock | None = None,
        limits: Limits | None = None,
        timeout: float | None = None,
    ) -> None:
        super().__init__(clock=clock, limits=limits)
        self.timeout = timeout
        self.synchronous = Synchronous(_choice(Synchronous, synchronous, "synchronous"))
        mode = PlanMode(_choice(PlanMode, plan, "plan"))
        self.path = Path(path)
        self._db = Connection(
            self.path,
            synchronous=self.synchronous,
            busy_timeout=busy_timeout,
            lost_wal=LostWal(_choice(LostWal, lost_wal, "lost_wal")),
        )
        self.planner = Planner(self._db.sql, self._now, mode)
        """How this store plans its groups of writes (see :mod:`.planning`)."""
        try:
            self.planner.watch()  # from now on, a change of data_version is another writer
        except sqlite3.Error as exc:
            self._db.close()
            raise self._db.fail(exc) from exc
        self._writer = Writer(self._db, self.planner)
        try:
            self._reader = Reader(self._db)
        except StoreError:
            self._db.close()
            raise
        self._commits = ThreadPoolExecutor(max_workers=1, thread_name_prefix="keel-sqlite-writer")
        """The writer thread: where groups commit (and wait for another process's lock)."""
        self._change_log = ChangeLogReader(self.path, self.change_hub)
        self._lane: Lane | None = None
        """Group commit on the event loop that writes now (one loop at a time)."""

    @property
    def schema_version(self) -> int:
        """The schema version recorded in the file."""
        return self._db.schema_version()

    # --- execution -------------------------------------------------------------------
    #
    # Writes are committed in groups by the lane of the event loop they are made on (see
    # keel.store.group_commit and .writes), each group's COMMIT in the writer thread.
    # Reads run inline on a connection of their own (.reads), in a deferred transaction,
    # which WAL never makes wait on writers.

    async def _run(self, op: Op[T], *, write: bool) -> T:
        if not write:
            return await self._read(op)
        loop = _running_loop()
        lane = self._lane
        if loop is not None and (lane is None or (lane.loop is not loop and lane.idle)):
            # A new lane: nothing is queued on the old loop's.
            lane = self._lane = Lane(
                loop, self._writer, executor=self._commits, timeout=self.timeout, late=self._late
            )
        if lane is None or lane.loop is not loop:
            # Group commit serves one event loop at a time; others get a transaction each.
            return await anyio.to_thread.run_sync(lambda: run_alone(self._writer, op))
        self._db.check_open()
        return await lane.submit(op)  # type: ignore[no-any-return]

    def _writes_queued(self) -> bool:
        # Queued, or being committed: a look now could not see them, and a claim queued
        # now runs after their commit.
        lane = self._lane
        return lane is not None and (lane.queued or lane.flushing) and lane.loop is _running_loop()

    def _late(self) -> StoreUnavailable:
        """The answer of a write that waited the whole timeout."""
        return StoreUnavailable(
            str(self.path),
            f"no answer within {self.timeout:g} s (another process holds the write lock?)",
        )

    async def _read(self, op: Op[T]) -> T:
        lane = self._lane
        if lane is not None and lane.loop is _running_loop():
            # Writes on their way that this read should see, once they are committed and
            # their callers know it.
            await lane.written(op.touches, queued_for=FRESH_WAIT)
        done = self._reader.run(op)
        if not isinstance(done, Busy):
            return done
        # Rare in WAL (another process recovering the WAL, say): wait in a thread rather
        # than on the event loop.
        return await anyio.to_thread.run_sync(lambda: self._reader.run_waiting(op))

    # --- administration ----------------------------------------------------------------

    def checkpoint(self) -> None:
        """Copy the WAL into the database file and truncate it (``wal_checkpoint(TRUNCATE)``).

        SQLite checkpoints on its own as the WAL grows; this is for a quiet moment, such
        as after a bulk import, so that readers do not search a long WAL.
        """
        with self._db.waiting() as conn:
            try:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            except sqlite3.Error as exc:
                raise self._db.fail(exc) from exc

    def integrity_check(self) -> str:
        """``PRAGMA integrity_check``: ``"ok"`` for a sound file, else its first problem."""
        return self._db.check("integrity_check")[0]

    def verify(self, *, thorough: bool = False) -> None:
        """Check the file: ``PRAGMA quick_check`` (a few seconds per GB: before serving),
        or with ``thorough`` the full ``PRAGMA integrity_check`` (indexes too).

        Raises:
            StoreDamaged: the check found problems (they are listed).
            StoreError: the file could not be read to the end.
        """
        pragma = "integrity_check" if thorough else "quick_check"
        problems = self._db.check(pragma)
        if problems != ["ok"]:
            raise StoreDamaged(str(self.path), pragma.replace("_", " "), problems)

    def backup(self, target: Path) -> None:
        """Write a consistent copy of the store into the new file ``target``: SQLite's
        online backup in one step, so the copy is one snapshot of every committed row
        while other processes keep writing. Runs in a thread (it reads the whole file).

        Raises:
            StoreError: the store cannot be read or ``target`` written.
        """
        with self._db.waiting() as conn:
            try:
                copy = sqlite3.connect(target, isolation_level=None)
            except sqlite3.Error as exc:
                raise translate(exc, target) from exc
            try:
                conn.backup(copy)
                # The copy is closed, whoever has the original open (see .sessions).
                copy.execute("DELETE FROM keel_sessions")
            except sqlite3.Error as exc:
                raise self._db.fail(exc) from exc
            finally:
                copy.close()

    async def close(self) -> None:
        # Let queued writes commit first: a caller awaiting one must get its answer.
        if self._lane is not None:
            await self._lane.drain()
        self.close_sync()

    def _start_changes(self) -> int | None:
        try:
            return self._change_log.start()
        except sqlite3.Error as exc:
            raise self._db.fail(exc) from exc

    def close_sync(self) -> None:
        """Close the connections. Safe to call twice."""
        self._change_log.close()
        self._db.close()  # the reader first; after a commit under way in the writer thread
        self._commits.shutdown(wait=False)
