"""Planning: a group of writes worked out against a read snapshot, before the write lock.

SQLite admits one writer at a time, so whatever a writer computes while it holds the
lock (loading rows, applying the transition rules, encoding JSON) is time every other
process waits. A :class:`Plan` does that work against a read snapshot, which takes no
lock, and keeps what it would write. Under the lock, :meth:`Planner.apply` checks that
every row the plan read is still exactly as it was (one ``SELECT``) and then only
executes the recorded statements. If a row changed (another process wrote it in
between), the plan is not used and the writes run as they would without one.

A plan only pays when other processes wait for the lock, so by default
(:attr:`PlanMode.AUTO`) a store plans only while another connection has committed to the
file within its last ``OTHERS_WINDOW`` groups. The state of that decision (and of claim
contention) lives on the :class:`Planner`, one per store.

Which ops can be planned, and how, is what they declare (:class:`~keel.store.base.Picks`):
ops on named tasks are planned together, each claim on its own, sweeps never.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from keel.model import Task
from keel.store.base import MAX_CLAIM_BATCH, Op, Picks
from keel.store.group_commit import Outcome
from keel.store.protocol import Clock
from keel.store.rows import task_to_row
from keel.store.sqlite.tx import EventRow, Q, SqliteTx

__all__ = [
    "CLAIMS_CONTENDED",
    "CLAIM_SPARE",
    "OTHERS_WINDOW",
    "PLAN_MAX_AGE",
    "Applied",
    "Part",
    "Plan",
    "PlanMode",
    "Planner",
]

log = logging.getLogger("keel.store.sqlite")

OTHERS_WINDOW = 128
"""Groups planned after another process's commit was last seen (see _make_plan)."""
PLAN_MAX_AGE = 0.05
"""Seconds (by the store's clock) a plan may wait for the write lock and still be used:
the times it recorded (leases, updated_at, history) are at most this much early."""
CLAIM_SPARE = 1
"""Under contention, a planned claim reads this many times more ready tasks than it
wants and works out only the last ones, expecting another process to take the first (see
Part.head): once a planned claim has lost a task to another process within the last
CLAIMS_CONTENDED."""
CLAIMS_CONTENDED = 32
"""Planned claims that read spares after one lost a task to another process."""


class PlanMode(StrEnum):
    """When a store plans its groups of writes (the ``?plan=`` of a ``sqlite:`` URL)."""

    AUTO = "auto"
    """While other processes write the same file (the default)."""
    OFF = "off"
    """Never: every group is worked out under the write lock."""
    ALWAYS = "always"
    """Every group, even with no other writer: for tests, which must cover plans."""


class _Unplannable(Exception):
    """Raised by a :class:`_PlanTx` primitive when a write cannot be planned."""


class Statement(NamedTuple):
    """A planned write."""

    sql: str
    params: dict[str, Any]
    one_row: bool
    """It must change exactly one row (a conditional update)."""
    task_id: str


class _Claimed:
    """One task of a planned claim, and what claiming it writes."""

    __slots__ = ("events", "statements", "task")

    def __init__(self, task: Task) -> None:
        self.task = task
        self.statements: list[Statement] = []
        self.events: list[EventRow] = []


class Part:
    """Planned writes of a group: what they read, and what they would write and return."""

    __slots__ = (
        "claims",
        "events",
        "guards",
        "head",
        "limit",
        "outcomes",
        "position",
        "statements",
        "taken",
    )

    def __init__(self) -> None:
        self.guards: dict[str, tuple[Any, ...] | None] = {}
        """task id -> its row as the plan read it (None: it did not exist)."""
        self.statements: list[Statement] = []
        self.events: list[EventRow] = []
        self.outcomes: dict[int, Outcome] = {}
        """Position in the group -> what that write returns or raises."""
        self.claims: list[_Claimed] | None = None
        """A claim, task by task, in order: under the lock, the first ``limit`` whose rows
        are unchanged are claimed, so a claim that lost some tasks to another process
        takes the next ones."""
        self.head: list[str] = []
        """Under contention, the plan read ``CLAIM_SPARE`` times more ready tasks than it
        needs, and worked out only the last ``limit`` (``claims``): the ones before them
        (their ids here, their rows in ``guards``) usually go to the other process
        meanwhile. If some are still free under the lock, the claim takes as many of the
        planned ones as are left over (``taken``) and claims the rest there, which takes
        the free ones: a claim takes the queue in order."""
        self.taken: list[Task] | None = None
        """Tasks claimed as planned, when the claim goes on under the lock for the rest."""
        self.limit = 0
        self.position = -1  # of the claim in the group, when ``claims`` is set


class Plan:
    """A group of writes worked out from a snapshot, before the write lock is taken.

    SQLite admits one writer at a time, so whatever a writer computes while it holds the
    lock (loading rows, applying the transition rules, encoding JSON) is time every other
    process waits. A plan does that work against a read snapshot, which takes no lock,
    and keeps what it would write. Under the lock, :meth:`Planner.apply`
    checks that every row the plan read is still exactly as it was (one ``SELECT``) and
    then only executes the recorded statements. If a row changed (another process wrote
    it in between), the plan is not used and the writes run as they would without one.

    ``first`` holds the writes that name their tasks (create, complete, cancel …).
    Claims, which pick their tasks by a condition, come ``later``, each planned on its own
    and checked on its own: two processes claiming at once often want the same tasks, and
    a claim that lost them must not undo the rest of the group. A claim whose plan fails
    runs under the lock; so does every other write that scans (expired leases, purges).
    The writes of one group are all in flight together, so any order among them is valid.
    """

    __slots__ = ("first", "keys", "later", "made_at", "tasks")

    def __init__(self, made_at: float) -> None:
        self.made_at = made_at
        """The store's clock when the plan was made (see PLAN_MAX_AGE)."""
        self.first = Part()
        self.later: list[tuple[int, Part | None]] = []
        """(position in the group, its own plan or None to run it under the lock)."""
        self.keys: dict[tuple[str, str], str | None] = {}
        """(owner, idempotency key) -> the task id bound to it, as read or inserted."""
        self.tasks: dict[str, Task] = {}
        """Tasks the plan inserts or updates, as they will be: later writes read these."""


class _PlanTx(SqliteTx):
    """A :class:`SqliteTx` that reads a snapshot and records its writes in a plan."""

    def __init__(
        self, conn: sqlite3.Connection, plan: Plan, part: Part, *, scans: bool, spare: bool
    ) -> None:
        super().__init__(conn)
        self.plan = plan
        self.part = part
        self.scans = scans  # False: a claim is deferred to the plan's later parts
        self.spare = spare  # read spare ready tasks (other processes have been claiming)
        self.statements: list[Statement] = []
        self.scanned: tuple[int, list[str]] | None = None
        """A claim's limit and the ids of the ready tasks it read, in order."""

    def _guarded(self, row: Any, task_id: str) -> Task | None:
        self.part.guards.setdefault(task_id, None if row is None else tuple(row))
        return None if row is None else self._kept(row)

    def load(self, task_id: str) -> Task | None:
        if task_id in self.plan.tasks:  # written earlier in this group
            return self.plan.tasks[task_id]
        row = self._c.execute(Q["get_task"], {"task_id": task_id}).fetchone()
        return self._guarded(row, task_id)

    def load_by_key(self, owner: str, key: str) -> Task | None:
        if (owner, key) in self.plan.keys:
            bound = self.plan.keys[owner, key]
            return None if bound is None else self.load(bound)
        row = self._c.execute(
            Q["get_task_by_key"], {"owner": owner, "idempotency_key": key}
        ).fetchone()
        # Not bound yet: should another process bind it before the plan runs, the unique
        # index refuses the plan's insert and the group runs without the plan.
        self.plan.keys[owner, key] = None if row is None else row["task_id"]
        if row is None:
            return None
        if row["task_id"] in self.plan.tasks:  # bound to a task written earlier in the group
            return self.plan.tasks[row["task_id"]]
        return self._guarded(row, row["task_id"])

    def ready(self, names: Collection[str], now: float, limit: int) -> list[Task]:
        if not self.scans or self.scanned is not None:
            raise _Unplannable
        wanted = limit + min(limit * CLAIM_SPARE, MAX_CLAIM_BATCH) if self.spare else limit
        rows = self._c.execute(
            Q["ready_tasks"], {"names": json.dumps(list(names)), "now": now, "limit": wanted}
        ).fetchall()
        if any(r["task_id"] in self.plan.tasks for r in rows):
            raise _Unplannable  # a task this group already changed: claim under the lock
        head, rows = rows[: max(0, len(rows) - limit)], rows[max(0, len(rows) - limit) :]
        for r in head:  # checked under the lock, worked out only if still free (Part.head)
            self.part.guards.setdefault(r["task_id"], tuple(r))
            self.part.head.append(r["task_id"])
        self.scanned = (limit, [r["task_id"] for r in rows])
        return [t for r in rows if (t := self._guarded(r, r["task_id"])) is not None]

    def insert(self, task: Task) -> None:
        self.wrote = True
        self.statements.append(Statement(Q["insert_task"], task_to_row(task), False, task.task_id))
        self.plan.tasks[task.task_id] = task
        if task.idempotency_key is not None:
            self.plan.keys[task.owner, task.idempotency_key] = task.task_id

    def update(self, old: Task, new: Task) -> None:
        self.wrote = True
        statement = self._update_statement(old, new)
        if statement is not None:
            self.statements.append(Statement(*statement, True, old.task_id))
        self.plan.tasks[old.task_id] = new

    def put_step(self, task_id: str, step: str, value_json: str, at: float) -> None:
        self.wrote = True
        params = {"task_id": task_id, "name": step, "value": value_json, "created_at": at}
        self.statements.append(Statement(Q["put_step"], params, False, task_id))

    def _unplannable(self, *_: Any, **__: Any) -> Any:
        raise _Unplannable

    expired = stale = purgeable = delete = _unplannable
    get_steps = events = status_of = page = _unplannable


def _by_task(
    ids: list[str], value: Any, statements: list[Statement], events: list[EventRow]
) -> list[_Claimed] | None:
    """A planned claim split task by task, or None if it does not split that way (it
    returned something other than the tasks it read, or wrote to another task)."""
    if not isinstance(value, list) or not all(isinstance(t, Task) for t in value):
        return None
    returned = [t.task_id for t in value]
    chosen = set(returned)
    if [i for i in ids if i in chosen] != returned:  # some of the tasks read, in order
        return None
    claimed = {t.task_id: _Claimed(t) for t in value}
    for statement in statements:
        if statement.task_id not in claimed:
            return None
        claimed[statement.task_id].statements.append(statement)
    for event in events:
        if event[0] not in claimed:
            return None
        claimed[event[0]].events.append(event)
    return list(claimed.values())


@dataclass(slots=True)
class Applied:
    """What :meth:`Planner.apply` executed of a plan, and what is left to run."""

    live: list[int]
    """Positions of the ops to run under the lock (all of them without a usable plan)."""
    outcomes: dict[int, Outcome] = field(default_factory=dict)
    """Position -> outcome of each op executed as planned."""
    events: list[EventRow] = field(default_factory=list)
    """History entries of what was executed, to insert before COMMIT."""
    taken: dict[int, list[Task]] = field(default_factory=dict)
    """Claims that took planned tasks and go on under the lock (see ``Part.taken``)."""


class Planner:
    """Plans a store's groups of writes and applies the plans; one per store.

    Args:
        conn: the store's connection; the caller holds its lock around every call.
        now: the store's clock (plans record times; see PLAN_MAX_AGE).
        mode: when to plan (see :class:`PlanMode`).
    """

    def __init__(self, conn: sqlite3.Connection, now: Clock, mode: PlanMode) -> None:
        self.mode = mode
        self.contended = 0
        """Planned claims left that read spares (see ``Part.head``)."""
        self._conn = conn
        self._now = now
        self._data_version = -1  # PRAGMA data_version when last read (see _others_write)
        self._groups = 0  # groups left to plan since another writer was seen

    def watch(self) -> None:
        """Start telling other writers' commits from this store's own (at open).

        Raises:
            sqlite3.Error: the file cannot be read.
        """
        if self.mode is PlanMode.AUTO:
            self._others_write()

    def lock_was_taken(self) -> None:
        """Another process held the write lock when this store wanted it: plan the next
        ``OTHERS_WINDOW`` groups."""
        self._groups = OTHERS_WINDOW

    def _others_write(self) -> bool:
        """Whether another connection committed within this store's last
        ``OTHERS_WINDOW`` groups."""
        version = self._conn.execute("PRAGMA data_version").fetchone()[0]
        if version != self._data_version:
            self._groups = 0 if self._data_version < 0 else OTHERS_WINDOW
            self._data_version = version
        elif self._groups:
            self._groups -= 1
        return self._groups > 0

    def _wanted(self) -> bool:
        if self.mode is PlanMode.AUTO:
            try:
                return self._others_write()
            except sqlite3.Error:
                return False
        return self.mode is PlanMode.ALWAYS

    def plan(self, ops: Sequence[Op[Any]]) -> Plan | None:
        """Work a group out against a read snapshot, without the write lock (see
        :class:`Plan`); None if there is nothing to plan or the plan cannot be made."""
        if not self._wanted():
            return None
        plan = Plan(self._now())
        try:
            self._conn.execute("BEGIN")
            try:
                for i, op in enumerate(ops):
                    named = op.picks is Picks.NAMED
                    if not named or not self._plan_one(op, i, plan, plan.first, scans=False):
                        plan.later.append((i, None))
                for n, (i, _) in enumerate(plan.later):
                    part = Part()
                    if ops[i].picks is Picks.READY and self._plan_one(
                        ops[i], i, plan, part, scans=True
                    ):
                        plan.later[n] = (i, part)
            finally:
                if self._conn.in_transaction:  # a read transaction has nothing to commit
                    self._conn.execute("ROLLBACK")
        except (sqlite3.Error, _Unplannable):
            return None
        except Exception:  # a plan is an optimisation: a bug in it must not lose writes
            log.exception("could not plan a group of writes; running it under the lock")
            return None
        if not plan.first.outcomes and all(part is None for _, part in plan.later):
            return None
        return plan

    def _plan_one(self, op: Op[Any], i: int, plan: Plan, part: Part, *, scans: bool) -> bool:
        """Plan write ``i`` into ``part``; False if it must run under the lock instead.

        Raises:
            _Unplannable: it failed half way; the group runs without a plan.
        """
        tx = _PlanTx(self._conn, plan, part, scans=scans, spare=self.contended > 0)
        try:
            value = op.run(tx)
        except _Unplannable:
            if tx.wrote:  # pragma: no cover - the primitives that scan come first
                raise
            return False
        except sqlite3.Error:
            raise _Unplannable from None
        except Exception as exc:
            if tx.wrote:  # failed after writing: leave it to the write path
                raise _Unplannable from None
            part.outcomes[i] = Outcome.failed(exc)  # refused: nothing to write
            return True
        part.outcomes[i] = Outcome(value)
        if tx.scanned is not None:
            limit, ids = tx.scanned
            part.claims = _by_task(ids, value, tx.statements, tx.events_out)
            if part.claims is None:  # pragma: no cover - not how claims are written
                return False
            part.limit, part.position = limit, i
        part.statements.extend(tx.statements)
        part.events.extend(tx.events_out)
        return True

    # --- under the write lock ----------------------------------------------------------

    def apply(self, plan: Plan | None, count: int) -> Applied:
        """Execute what still holds of ``plan`` for a group of ``count`` ops, with the write
        lock held and the transaction begun; the rest is left to run under the lock.

        A plan that waited more than ``PLAN_MAX_AGE`` for the lock is not used: its times
        are stale, so the group is worked out again.
        """
        everything = list(range(count))
        if plan is None or self._now() - plan.made_at > PLAN_MAX_AGE:
            return Applied(everything)
        applied = Applied([])
        if not self._use(plan.first, applied):
            return Applied(everything)
        applied.live = [i for i, part in plan.later if part is None or not self._use(part, applied)]
        return applied

    def _use(self, part: Part, applied: Applied) -> bool:
        if not self.holds(part):
            if part.taken is not None:
                applied.taken[part.position] = part.taken
                applied.events.extend(part.events)
            return False
        applied.outcomes.update(part.outcomes)
        applied.events.extend(part.events)
        return True

    def holds(self, part: Part) -> bool:
        """Execute the part's statements if every row it read is unchanged; False if
        another process wrote one meanwhile. Nothing is written then, except by a claim
        that goes on under the lock (``Part.taken``)."""
        c = self._conn
        if part.guards:
            ids = json.dumps(list(part.guards))
            try:
                rows = c.execute(Q["get_tasks"], {"task_ids": ids}).fetchall()
            except sqlite3.Error:
                return False  # run under the lock, which meets the error as it would anyway
            now = {r["task_id"]: tuple(r) for r in rows}
            if part.claims is not None:
                return self._claims_hold(part, now)
            if any(now.get(task_id) != row for task_id, row in part.guards.items()):
                return False
        return self._execute(part.statements)

    def _claims_hold(self, part: Part, now: dict[str, tuple[Any, ...]]) -> bool:
        """Claim the first tasks of a planned claim that nobody changed meanwhile.

        False if the claim goes on under the lock: for tasks of its head still free (the
        planned ones it takes are ``part.taken``), or from scratch when it is short of
        tasks others took.
        """
        assert part.claims is not None
        free = [tid for tid in part.head if now.get(tid) == part.guards[tid]]
        valid = [c for c in part.claims if now.get(c.task.task_id) == part.guards[c.task.task_id]]
        if len(free) < len(part.head) or len(valid) < len(part.claims):
            # Another process claims from the same tasks: read spares for a while.
            self.contended = CLAIMS_CONTENDED
        elif self.contended:
            self.contended -= 1
        free = free[: part.limit]
        chosen = valid[: part.limit - len(free)]
        if len(free) + len(chosen) < min(part.limit, len(part.head) + len(part.claims)):
            return False  # short of tasks others took: claim under the lock, which fills up
        if not self._execute([s for c in chosen for s in c.statements]):
            return False  # pragma: no cover - the guards make it impossible
        part.events = [e for c in chosen for e in c.events]
        if free:
            part.taken = [c.task for c in chosen]
            return False
        part.outcomes[part.position] = Outcome([c.task for c in chosen])
        return True

    def _execute(self, statements: Sequence[Statement]) -> bool:
        """Execute planned statements; False, with nothing written, if one is refused."""
        if not statements:
            return True
        c = self._conn
        c.execute("SAVEPOINT keel_plan")
        refused = False
        try:
            for statement in statements:
                if c.execute(statement.sql, statement.params).rowcount != 1 and statement.one_row:
                    refused = True  # pragma: no cover - the guards make it impossible
                    break
        except sqlite3.Error:
            # Another process bound the same idempotency key meanwhile, say; any other
            # error, the writes meet again under the lock without the plan.
            refused = True
        if refused:
            c.execute("ROLLBACK TO keel_plan")
        c.execute("RELEASE keel_plan")
        return not refused
