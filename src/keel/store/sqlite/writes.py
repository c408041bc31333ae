"""How a SQLite store runs a group of writes: one ``BEGIN IMMEDIATE`` transaction.

:class:`Writer` is the store's :class:`~keel.store.group_commit.GroupRunner`. On the
event loop it runs a group only if that needs no waiting: ``busy_timeout`` is 0 there,
so another process holding the write lock answers SQLITE_BUSY at once, and the group is
handed to a worker thread that may wait for the lock (up to the busy timeout) without
blocking the loop. Either way a group is planned first when planning pays (see
:mod:`keel.store.sqlite.planning`), and under the lock only what the plan could not
settle runs.

A group run on the loop that wrote anything is not committed there: its ``COMMIT``
(with ``synchronous=full``, the fsync that makes it durable, milliseconds on a busy disk)
runs in the store's writer thread, which holds the connection until it is done, and the
group's callers hear of their writes only then. Meanwhile the loop goes on: it answers
reads (on their own connection, :mod:`.reads`), writes responses, and queues the next
group, which runs as soon as this commit is done (so the groups grow with the load).

A refused write raises before it writes anything (the rules are checked first), so the
others commit beside it. Should a write fail after writing (a SQLite error mid-way), the
group is rolled back and :class:`~keel.store.group_commit.Regroup` runs each write on its
own, so that only the failing one fails.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from keel.store.base import Op
from keel.store.group_commit import Outcome, Ran, Regroup, Wait
from keel.store.sqlite.connection import Connection
from keel.store.sqlite.planning import Plan, Planner
from keel.store.sqlite.tx import EventRow, Fill, Q, SqliteTx

__all__ = ["Writer"]


@dataclass(frozen=True, slots=True)
class _Planned:
    """A group planned on the event loop that found the write lock taken."""

    plan: Plan | None


@dataclass(frozen=True, slots=True)
class _Commit:
    """A group that ran on the event loop and wrote: only its COMMIT (the fsync) is
    left, done in a thread; the connection's lock is held until then."""

    outcomes: list[Outcome]


class Writer:
    """Runs a store's groups of writes (see the module docstring)."""

    def __init__(self, db: Connection, planner: Planner) -> None:
        self._db = db
        self._planner = planner

    def closed(self) -> Exception:
        return self._db.fail_closed()

    def start(self, ops: Sequence[Op[Any]]) -> list[Outcome] | Wait:
        """On the event loop: run the group now, unless the lock must be waited for; a
        group that wrote is committed in a thread (the loop goes on meanwhile)."""
        db = self._db
        if not db.lock.acquire(blocking=False):
            return Wait()  # a group runs in a thread: this one waits for it there
        committing = False
        try:
            if db.closed:
                return [Outcome.failed(self.closed())] * len(ops)
            plan = self._planner.plan(ops)
            try:
                db.begin(True)
            except sqlite3.OperationalError:
                # Another process holds the write lock: wait in a thread, and plan the
                # next groups too.
                self._planner.lock_was_taken()
                return Wait(_Planned(plan))
            ran = self._run_locked(ops, plan, defer_commit=True)
            if isinstance(ran, list):
                return ran
            committing = True  # the lock goes with the transaction to the thread
            return Wait(ran, committing=True, abandon=self._abandon)
        finally:
            if not committing:
                db.lock.release()

    def finish(self, ops: Sequence[Op[Any]], handoff: Any) -> Ran:
        """In a worker thread: commit a group that ran on the loop, or wait for the lock,
        then run the group."""
        if isinstance(handoff, _Commit):
            return Ran(self._commit(handoff))
        db = self._db
        with db.lock:
            db.check_open()
            plan = handoff.plan if isinstance(handoff, _Planned) else self._planner.plan(ops)
            try:
                db.begin_write_waiting()
            except sqlite3.Error as exc:
                return Ran([Outcome.failed(db.fail(exc))] * len(ops))
            ran = self._run_locked(ops, plan)
            assert isinstance(ran, list)
            return Ran(ran)

    def _commit(self, pending: _Commit) -> list[Outcome]:
        """COMMIT the transaction :meth:`start` left open, then let the connection go."""
        db = self._db
        try:
            db.sql.execute("COMMIT")
        except sqlite3.Error as exc:
            # Not stored (I/O, disk full …): every write of the group fails with it.
            db.rollback()
            failed = Outcome.failed(db.fail(exc))
            return [failed if o.ok else o for o in pending.outcomes]
        except BaseException:
            db.rollback()
            raise
        finally:
            db.lock.release()
        return pending.outcomes

    def _abandon(self) -> None:
        """Roll back a group whose commit could not be handed to a thread."""
        try:
            self._db.rollback()
        finally:
            self._db.lock.release()

    def _run_locked(
        self, ops: Sequence[Op[Any]], plan: Plan | None, *, defer_commit: bool = False
    ) -> list[Outcome] | _Commit:
        """Run a group in the transaction begun under the lock, and commit it; with
        ``defer_commit``, a group that wrote is left uncommitted, as a :class:`_Commit`.

        Raises:
            Regroup: a write of several failed after writing; the group was rolled back.
        """
        db = self._db
        outcomes: dict[int, Outcome] = {}
        failure: Exception | None = None
        changes = db.sql.total_changes
        try:
            applied = self._planner.apply(plan, len(ops))
            outcomes.update(applied.outcomes)
            events = applied.events
            for i in applied.live:
                failure = self._run_one(ops, i, applied.taken.get(i), events, outcomes)
                if failure is not None:
                    break
            else:
                if events:
                    db.sql.executemany(Q["insert_event_row"], events)
                if defer_commit and db.sql.total_changes != changes:
                    return _Commit([outcomes[i] for i in range(len(ops))])
                # In a thread, or on the loop when nothing was written (an empty claim,
                # which no fsync follows).
                db.sql.execute("COMMIT")
        except sqlite3.Error as exc:
            # The transaction itself failed (I/O, disk full …): nothing of it is stored.
            db.rollback()
            failed = Outcome.failed(db.fail(exc))
            return [o if (o := outcomes.get(i)) is not None and not o.ok else failed
                    for i in range(len(ops))]  # fmt: skip
        except BaseException:
            db.rollback()
            raise
        if failure is not None:  # a write failed after writing: undo the whole group
            db.rollback()
            if len(ops) > 1:
                raise Regroup from failure
            return [self._outcome_of(failure)]
        assert len(outcomes) == len(ops), "every write of the group has an outcome"
        return [outcomes[i] for i in range(len(ops))]

    def _run_one(
        self,
        ops: Sequence[Op[Any]],
        i: int,
        taken: list[Any] | None,
        events: list[EventRow],
        outcomes: dict[int, Outcome],
    ) -> Exception | None:
        """Run write ``i`` under the lock into ``outcomes``; the exception if it failed
        after writing (the group must be undone)."""
        c = self._db.sql
        tx = SqliteTx(c, events) if taken is None else Fill(c, events, len(taken))
        try:
            value = ops[i].run(tx)
            if taken is not None:  # earliest ready_at first (ties: the live ones)
                value = sorted(value + taken, key=lambda t: t.ready_at)
        except Exception as exc:
            if tx.wrote or isinstance(exc, sqlite3.Error):
                return exc
            outcomes[i] = Outcome.failed(exc)
        else:
            outcomes[i] = Outcome(value)
            events.extend(tx.events_out)
        return None

    def _outcome_of(self, exc: Exception) -> Outcome:
        if isinstance(exc, sqlite3.Error):
            return Outcome.failed(self._db.fail(exc))
        return Outcome.failed(exc)
