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
* While other processes write the same file, each group of writes is worked out against
  a read snapshot before the write lock is taken, and only checked and executed under it
  (:class:`_Plan`), so that the lock is held for SQL and the commit, not for Python.

Work runs in a thread so that waiting for the disk or for another process's lock never
blocks the event loop. ``sqlite3`` errors become :mod:`keel.errors` here and nowhere else.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread

from keel.errors import ConfigurationError, StoreError
from keel.model import Event, JsonValue, Limits, Status, Task
from keel.store.base import (
    MAX_CLAIM_BATCH,
    TxStore,
    event_from_row,
    task_from_row,
    task_to_row,
)
from keel.store.protocol import Clock
from keel.store.sqlfiles import load_migrations, load_queries

__all__ = ["SCHEMA_VERSION", "SqliteStore", "Synchronous"]

T = TypeVar("T")

log = logging.getLogger("keel.store.sqlite")

_Q = load_queries(__name__)
_MIGRATIONS = load_migrations(f"{__name__}.migrations")
SCHEMA_VERSION = _MIGRATIONS[-1].version
"""The schema version this Keel writes and reads."""

OTHERS_WINDOW = 128
"""Groups planned after another process's commit was last seen (see _make_plan)."""
PLAN_MAX_AGE = 0.05
"""Seconds (by the store's clock) a plan may wait for the write lock and still be used:
the times it recorded (leases, updated_at, history) are at most this much early."""
CLAIM_SPARE = 1
"""Under contention, a planned claim reads this many times more ready tasks than it
wants and works out only the last ones, expecting another process to take the first (see
_Part.head): once a planned claim has lost a task to another process within the last
CLAIMS_CONTENDED."""
CLAIMS_CONTENDED = 32
"""Planned claims that read spares after one lost a task to another process."""
DEFAULT_BUSY_TIMEOUT = 30.0  # seconds a writer waits for another process's lock
CACHE_KIB = 64 * 1024  # page cache per connection, KiB
WAL_LIMIT_BYTES = 64 * 1024 * 1024  # a WAL larger than this is truncated after checkpoints


_Op = tuple[Callable[[Any], Any], "asyncio.Future[Any] | None"]
"""A queued write: its function, and the future its caller awaits."""
_EventRow = tuple[str, float, str | None, str, str, str]
"""A history entry as insert_event_row's parameters."""
_Outcome = tuple[bool, Any]
"""(True, value) or (False, exception)."""


def _unwrap(outcome: _Outcome) -> Any:
    ok, value = outcome
    if ok:
        return value
    raise value


def _deliver(batch: Sequence[_Op], outcomes: Sequence[_Outcome]) -> None:
    for (_, future), (ok, value) in zip(batch, outcomes, strict=True):
        if future is None or future.done():
            continue  # the caller gave up waiting; the write itself stands
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


class Synchronous(StrEnum):
    """How hard a commit is pushed to disk before it is acknowledged."""

    FULL = "full"
    """fsync on every commit: survives process crashes and power loss (the default)."""
    NORMAL = "normal"
    """fsync at checkpoints only: survives process crashes; power loss may lose recent commits."""


class _SqliteTx:
    def __init__(self, conn: sqlite3.Connection, pending: list[_EventRow] | None = None) -> None:
        self._c = conn
        self.wrote = False
        self.events_out: list[_EventRow] = []
        # History entries of earlier writes of the same group, not inserted yet.
        self.pending = pending
        # The rows this transaction read, so that an update re-encodes only what changed.
        self._read: dict[str, tuple[Task, sqlite3.Row]] = {}

    def _kept(self, row: Any) -> Task:
        """The row as a task, kept for the diff of a later update of it."""
        task = task_from_row(row)
        self._read[task.task_id] = (task, row)
        return task

    def _one(self, query: str, params: dict[str, Any]) -> Task | None:
        row = self._c.execute(_Q[query], params).fetchone()
        return None if row is None else self._kept(row)

    def _all(self, query: str, params: dict[str, Any]) -> list[Task]:
        return [self._kept(row) for row in self._c.execute(_Q[query], params)]

    def load(self, task_id: str) -> Task | None:
        return self._one("get_task", {"task_id": task_id})

    def load_by_key(self, owner: str, key: str) -> Task | None:
        return self._one("get_task_by_key", {"owner": owner, "idempotency_key": key})

    def insert(self, task: Task) -> None:
        self.wrote = True
        self._c.execute(_Q["insert_task"], task_to_row(task))

    def _update_statement(self, old: Task, new: Task) -> tuple[str, dict[str, Any]] | None:
        """The conditional UPDATE that turns ``old`` into ``new``: changed columns only."""
        read = self._read.get(old.task_id)
        previous = read if read and read[0] is old else None
        row = task_to_row(new, mutable_only=True, previous=previous)
        if previous is not None:
            stored = previous[1]
            row = {k: v for k, v in row.items() if v != stored[k] or type(v) is not type(stored[k])}
        columns = tuple(row)
        if not columns:
            return None
        row.update(task_id=old.task_id, old_status=old.status.value, old_fence=old.fence)
        return _update_sql(columns), row

    def update(self, old: Task, new: Task) -> None:
        self.wrote = True
        statement = self._update_statement(old, new)
        if statement is not None and self._c.execute(*statement).rowcount != 1:
            # Cannot happen under BEGIN IMMEDIATE; if it does, refuse rather than guess.
            raise StoreError(f"task {old.task_id} changed under a write; nothing was written")

    def append(self, event: Event) -> None:
        # Held back and inserted with the rest of the group in one executemany just
        # before COMMIT (see flush_events): same transaction, a fraction of the cost.
        self.wrote = True
        self.events_out.append(
            (
                event.task_id,
                event.at,
                None if event.from_status is None else event.from_status.value,
                event.to_status.value,
                event.reason,
                event.actor,
            )
        )

    def flush_events(self) -> None:
        """Insert the history entries held back so far (before a delete, and at COMMIT)."""
        if self.pending is not None and self.pending:
            self._c.executemany(_Q["insert_event_row"], self.pending)
            self.pending.clear()
        if self.events_out:
            self._c.executemany(_Q["insert_event_row"], self.events_out)
            self.events_out.clear()

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
        self.wrote = True
        self.flush_events()  # entries of tasks deleted below must exist to be deleted
        if task_ids:
            self._c.execute(_Q["delete_tasks"], {"task_ids": json.dumps(list(task_ids))})

    def put_step(self, task_id: str, step: str, value_json: str, at: float) -> None:
        self.wrote = True
        self._c.execute(
            _Q["put_step"],
            {"task_id": task_id, "name": step, "value": value_json, "created_at": at},
        )

    def get_steps(self, task_id: str) -> dict[str, JsonValue]:
        rows = self._c.execute(_Q["get_steps"], {"task_id": task_id})
        return {r["name"]: json.loads(r["value"]) for r in rows}

    def events(self, task_id: str) -> list[Event]:
        rows = self._c.execute(_Q["get_events"], {"task_id": task_id})
        return [event_from_row(r) for r in rows]

    def status_of(self, task_ids: Sequence[str]) -> dict[str, tuple[Status, int]]:
        rows = self._c.execute(_Q["task_statuses"], {"task_ids": json.dumps(list(task_ids))})
        return {r["task_id"]: (Status(r["status"]), r["fence"]) for r in rows}

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


@functools.lru_cache(maxsize=256)
def _update_sql(columns: tuple[str, ...]) -> str:
    assignments = ", ".join(f"{c} = :{c}" for c in columns)
    return _Q["update_task"].replace("{assignments}", assignments)


class _Unplannable(Exception):
    """Raised by a :class:`_PlanTx` primitive when a write cannot be planned."""


class _RetryEach(Exception):
    """A group failed after writing, on a thread that must not wait for the lock: retry
    its writes one by one where waiting is allowed."""


_Statement = tuple[str, dict[str, Any], bool, str]
"""A planned write: SQL, parameters, whether it must change exactly one row, its task."""


class _Claimed:
    """One task of a planned claim, and what claiming it writes."""

    __slots__ = ("events", "statements", "task")

    def __init__(self, task: Task) -> None:
        self.task = task
        self.statements: list[_Statement] = []
        self.events: list[_EventRow] = []


class _Part:
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
        self.statements: list[_Statement] = []
        self.events: list[_EventRow] = []
        self.outcomes: dict[int, _Outcome] = {}
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


class _Plan:
    """A group of writes worked out from a snapshot, before the write lock is taken.

    SQLite admits one writer at a time, so whatever a writer computes while it holds the
    lock (loading rows, applying the transition rules, encoding JSON) is time every other
    process waits. A plan does that work against a read snapshot, which takes no lock,
    and keeps what it would write. Under the lock, :meth:`SqliteStore._batch_locked`
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
        self.first = _Part()
        self.later: list[tuple[int, _Part | None]] = []
        """(position in the group, its own plan or None to run it under the lock)."""
        self.keys: dict[tuple[str, str], str | None] = {}
        """(owner, idempotency key) -> the task id bound to it, as read or inserted."""
        self.tasks: dict[str, Task] = {}
        """Tasks the plan inserts or updates, as they will be: later writes read these."""


class _PlanTx(_SqliteTx):
    """A :class:`_SqliteTx` that reads a snapshot and records its writes in a plan."""

    def __init__(
        self, conn: sqlite3.Connection, plan: _Plan, part: _Part, *, scans: bool, spare: bool
    ) -> None:
        super().__init__(conn)
        self.plan = plan
        self.part = part
        self.scans = scans  # False: a claim is deferred to the plan's later parts
        self.spare = spare  # read spare ready tasks (other processes have been claiming)
        self.statements: list[_Statement] = []
        self.scanned: tuple[int, list[str]] | None = None
        """A claim's limit and the ids of the ready tasks it read, in order."""

    def _guarded(self, row: Any, task_id: str) -> Task | None:
        self.part.guards.setdefault(task_id, None if row is None else tuple(row))
        return None if row is None else self._kept(row)

    def load(self, task_id: str) -> Task | None:
        if task_id in self.plan.tasks:  # written earlier in this group
            return self.plan.tasks[task_id]
        row = self._c.execute(_Q["get_task"], {"task_id": task_id}).fetchone()
        return self._guarded(row, task_id)

    def load_by_key(self, owner: str, key: str) -> Task | None:
        if (owner, key) in self.plan.keys:
            bound = self.plan.keys[owner, key]
            return None if bound is None else self.load(bound)
        row = self._c.execute(
            _Q["get_task_by_key"], {"owner": owner, "idempotency_key": key}
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
            _Q["ready_tasks"], {"names": json.dumps(list(names)), "now": now, "limit": wanted}
        ).fetchall()
        if any(r["task_id"] in self.plan.tasks for r in rows):
            raise _Unplannable  # a task this group already changed: claim under the lock
        head, rows = rows[: max(0, len(rows) - limit)], rows[max(0, len(rows) - limit) :]
        for r in head:  # checked under the lock, worked out only if still free (_Part.head)
            self.part.guards.setdefault(r["task_id"], tuple(r))
            self.part.head.append(r["task_id"])
        self.scanned = (limit, [r["task_id"] for r in rows])
        return [t for r in rows if (t := self._guarded(r, r["task_id"])) is not None]

    def insert(self, task: Task) -> None:
        self.wrote = True
        self.statements.append((_Q["insert_task"], task_to_row(task), False, task.task_id))
        self.plan.tasks[task.task_id] = task
        if task.idempotency_key is not None:
            self.plan.keys[task.owner, task.idempotency_key] = task.task_id

    def update(self, old: Task, new: Task) -> None:
        self.wrote = True
        statement = self._update_statement(old, new)
        if statement is not None:
            self.statements.append((*statement, True, old.task_id))
        self.plan.tasks[old.task_id] = new

    def put_step(self, task_id: str, step: str, value_json: str, at: float) -> None:
        self.wrote = True
        params = {"task_id": task_id, "name": step, "value": value_json, "created_at": at}
        self.statements.append((_Q["put_step"], params, False, task_id))

    def _unplannable(self, *_: Any, **__: Any) -> Any:
        raise _Unplannable

    expired = stale = purgeable = delete = _unplannable
    get_steps = events = status_of = page = _unplannable


class _Fill(_SqliteTx):
    """Under the lock, the rest of a planned claim that took ``taken`` tasks as planned
    (see ``_Part.taken``): it reads as many fewer ready tasks. Those it took are no longer
    ready, so it finds the ones before them that are still free."""

    def __init__(self, conn: sqlite3.Connection, pending: list[_EventRow], taken: int) -> None:
        super().__init__(conn, pending)
        self.taken = taken
        # The tasks it took as planned are written already: should the rest fail, the
        # group must be undone, not commit them as if the claim had been refused.
        self.wrote = True

    def ready(self, names: Collection[str], now: float, limit: int) -> list[Task]:
        return super().ready(names, now, limit - self.taken) if limit > self.taken else []


def _by_task(
    ids: list[str], value: Any, statements: list[_Statement], events: list[_EventRow]
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
        if statement[3] not in claimed:
            return None
        claimed[statement[3]].statements.append(statement)
    for event in events:
        if event[0] not in claimed:
            return None
        claimed[event[0]].events.append(event)
    return list(claimed.values())


_JITTER = random.Random()  # noqa: S311 - spreads lock polls; nothing secret about it


def _is_busy(exc: sqlite3.Error) -> bool:
    text = str(exc)
    return "locked" in text or "busy" in text


def _describe(exc: sqlite3.Error, path: str) -> str:
    text = str(exc)
    if _is_busy(exc):
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
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: list[_Op] = []
        self._flush_scheduled = False
        self._flushing = False
        self._inflight: set[asyncio.Future[Any]] = set()
        self._claims_contended = 0  # planned claims left that read spares (see _Part.claims)
        self._data_version = -1  # PRAGMA data_version when last read (see _others_write)
        self._plan_groups = 0  # groups left to plan since another writer was seen
        self._always_plan = False  # the tests' switch: plan every group (see _make_plan)
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
            self._others_write()  # from now on, a change of data_version is another writer
        except sqlite3.Error as exc:
            self._conn.close()
            raise StoreError(_describe(exc, str(self.path))) from exc
        except BaseException:
            self._conn.close()
            raise

    def _configure(self, busy_timeout: float) -> None:
        c = self._conn
        c.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        mode = self._switch_to_wal(busy_timeout)
        if str(mode).lower() != "wal":  # pragma: no cover - e.g. a read-only medium
            raise StoreError(f"store {self.path} cannot use WAL journaling (got {mode})")
        c.execute(f"PRAGMA synchronous = {self.synchronous.value.upper()}")
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
                return str(self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or time.monotonic() > deadline:
                    raise
            time.sleep(pause)  # waiting for another process's lock, not for a result
            pause = min(pause * 2, 0.05)

    def _current_version(self) -> int:
        exists = self._conn.execute(
            "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'keel_schema'"
        ).fetchone()
        if not exists:
            return 0
        row = self._conn.execute("SELECT coalesce(max(version), 0) FROM keel_schema").fetchone()
        return int(row[0])

    def _migrate(self) -> None:
        # A read first: an up-to-date store (every open but the first) never queues for
        # the write lock behind a busy writer just to learn that there is nothing to do.
        current = self._current_version()
        _check_version(self.path, current)
        if current == SCHEMA_VERSION:
            return
        c = self._conn
        self._begin(True)
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
            self._rollback()
            raise
        c.execute("COMMIT")

    @property
    def schema_version(self) -> int:
        """The schema version recorded in the file."""
        with self._lock:
            return int(self._conn.execute("SELECT max(version) FROM keel_schema").fetchone()[0])

    # --- execution -------------------------------------------------------------------
    #
    # Writes are committed in groups. A write queues its function and waits; the first
    # write of a loop iteration schedules a flush, and the flush runs everything queued by
    # then in ONE transaction. A refused write raises before it writes anything (the rules
    # are checked first), so the others commit beside it; one that fails after writing
    # sends the group back to run one transaction per write (see _batch_locked). One
    # commit (one fsync with synchronous=FULL) acknowledges the whole group, and nobody is
    # told "done" before that commit.
    #
    # The flush runs on the event loop thread when it need not wait: busy_timeout is 0
    # there, so another process holding the write lock answers SQLITE_BUSY at once, and
    # that group is handed to a worker thread that may wait (up to the busy timeout)
    # without blocking the loop. Reads run inline in a deferred transaction, which WAL
    # never makes wait on writers.

    def _begin(self, write: bool) -> None:
        self._conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"store {self.path} is closed")

    def _read_locked(self, fn: Callable[[Any], T], *, begun: bool) -> T:
        try:
            if not begun:
                self._begin(False)
            try:
                return fn(_SqliteTx(self._conn))
            finally:
                self._rollback()  # a read transaction has nothing to commit
        except sqlite3.Error as exc:
            raise StoreError(_describe(exc, str(self.path))) from exc

    def _others_write(self) -> bool:
        """Whether another connection committed within this store's last
        ``OTHERS_WINDOW`` groups."""
        version = self._conn.execute("PRAGMA data_version").fetchone()[0]
        if version != self._data_version:
            self._plan_groups = 0 if self._data_version < 0 else OTHERS_WINDOW
            self._data_version = version
        elif self._plan_groups:
            self._plan_groups -= 1
        return self._plan_groups > 0

    def _make_plan(self, batch: Sequence[_Op]) -> _Plan | None:
        """Work a group out against a read snapshot, without the write lock (see
        :class:`_Plan`); None if there is nothing to plan or the plan cannot be made.

        A plan only pays when other processes wait for the lock: once no other process
        has written during ``OTHERS_WINDOW`` groups, groups run under the lock without one.
        """
        try:
            if not self._others_write() and not self._always_plan:
                return None
        except sqlite3.Error:
            return None
        plan = _Plan(self._now())
        try:
            self._begin(False)
            try:
                for i in range(len(batch)):
                    if not self._plan_one(batch[i][0], i, plan, plan.first, scans=False):
                        plan.later.append((i, None))
                for n, (i, _) in enumerate(plan.later):
                    part = _Part()
                    if self._plan_one(batch[i][0], i, plan, part, scans=True):
                        plan.later[n] = (i, part)
            finally:
                self._rollback()  # a read transaction has nothing to commit
        except (sqlite3.Error, _Unplannable):
            return None
        except Exception:  # a plan is an optimisation: a bug in it must not lose writes
            log.exception("could not plan a group of writes; running it under the lock")
            return None
        if not plan.first.outcomes and all(part is None for _, part in plan.later):
            return None
        return plan

    def _plan_one(
        self, fn: Callable[[Any], Any], i: int, plan: _Plan, part: _Part, *, scans: bool
    ) -> bool:
        """Plan write ``i`` into ``part``; False if it must run under the lock instead.

        Raises:
            _Unplannable: it failed half way; the group runs without a plan.
        """
        tx = _PlanTx(self._conn, plan, part, scans=scans, spare=self._claims_contended > 0)
        try:
            value = fn(tx)
        except _Unplannable:
            if tx.wrote:  # pragma: no cover - the primitives that scan come first
                raise
            return False
        except sqlite3.Error:
            raise _Unplannable from None
        except Exception as exc:
            if tx.wrote:  # failed after writing: leave it to the write path
                raise _Unplannable from None
            part.outcomes[i] = (False, exc)  # refused: nothing to write
            return True
        part.outcomes[i] = (True, value)
        if tx.scanned is not None:
            limit, ids = tx.scanned
            part.claims = _by_task(ids, value, tx.statements, tx.events_out)
            if part.claims is None:  # pragma: no cover - not how claims are written
                return False
            part.limit, part.position = limit, i
        part.statements.extend(tx.statements)
        part.events.extend(tx.events_out)
        return True

    def _part_holds(self, part: _Part) -> bool:
        """Under the write lock: execute the part's statements if every row it read is
        unchanged; False if another process wrote one meanwhile. Nothing is written then,
        except by a claim that goes on under the lock (``_Part.taken``)."""
        c = self._conn
        if part.guards:
            ids = json.dumps(list(part.guards))
            try:
                rows = c.execute(_Q["get_tasks"], {"task_ids": ids}).fetchall()
            except sqlite3.Error:
                return False  # run under the lock, which meets the error as it would anyway
            now = {r["task_id"]: tuple(r) for r in rows}
            if part.claims is not None:
                return self._claims_hold(part, now)
            if any(now.get(task_id) != row for task_id, row in part.guards.items()):
                return False
        return self._execute(part.statements)

    def _claims_hold(self, part: _Part, now: dict[str, tuple[Any, ...]]) -> bool:
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
            self._claims_contended = CLAIMS_CONTENDED
        elif self._claims_contended:
            self._claims_contended -= 1
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
        part.outcomes[part.position] = (True, [c.task for c in chosen])
        return True

    def _execute(self, statements: Sequence[_Statement]) -> bool:
        """Execute planned statements; False, with nothing written, if one is refused."""
        if not statements:
            return True
        c = self._conn
        c.execute("SAVEPOINT keel_plan")
        refused = False
        try:
            for sql, params, one_row, _ in statements:
                if c.execute(sql, params).rowcount != 1 and one_row:
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

    def _batch_locked(
        self, batch: Sequence[_Op], *, begun: bool, plan: _Plan | None = None, wait: bool = True
    ) -> list[_Outcome]:
        """Run a group of writes in one transaction and commit it; the lock is held.

        With a plan whose rows are unchanged, its writes are executed as recorded, and
        only the rest run here (see :class:`_Plan`). Without one, every write runs here.
        A plan that waited more than ``PLAN_MAX_AGE`` for the lock is not used.

        A refused write raises before it writes anything (the rules are checked first),
        so the others can commit beside it. Should a write fail after writing (a SQLite
        error mid-way), the group is rolled back and every write retried on its own, each
        waiting for the lock (``wait``) or, on the event loop, raising :class:`_RetryEach`.
        """
        c = self._conn
        if plan is not None and self._now() - plan.made_at > PLAN_MAX_AGE:
            plan = None  # its times are stale: work the group out again under the lock
        outcomes: list[_Outcome | None] = [None] * len(batch)
        events: list[_EventRow] = []
        taken: dict[int, list[Task]] = {}  # claims that go on under the lock (_Part.taken)

        def planned(part: _Part) -> bool:
            if not self._part_holds(part):
                if part.taken is not None:
                    taken[part.position] = part.taken
                    events.extend(part.events)
                return False
            for i, outcome in part.outcomes.items():
                outcomes[i] = outcome
            events.extend(part.events)
            return True

        try:
            if not begun:
                self._begin(True)
            if plan is not None and planned(plan.first):
                live = [i for i, part in plan.later if part is None or not planned(part)]
            else:
                live = list(range(len(batch)))
            for i in live:
                got = taken.get(i)
                tx = _SqliteTx(c, events) if got is None else _Fill(c, events, len(got))
                try:
                    value = batch[i][0](tx)
                    if got is not None:  # earliest ready_at first (ties: the live ones)
                        value = sorted(value + got, key=lambda t: t.ready_at)
                    outcomes[i] = (True, value)
                except Exception as exc:
                    if tx.wrote or isinstance(exc, sqlite3.Error):
                        return self._undo(batch, exc, wait=wait)
                    outcomes[i] = (False, exc)
                else:
                    events.extend(tx.events_out)
            if events:
                c.executemany(_Q["insert_event_row"], events)
            c.execute("COMMIT")
        except sqlite3.Error as exc:
            # The transaction itself failed (I/O, disk full …): nothing of it is stored.
            self._rollback()
            failure = self._map(exc)
            return [(False, failure) if o is None or o[0] else o for o in outcomes]
        except BaseException:
            self._rollback()
            raise
        done = [o for o in outcomes if o is not None]
        assert len(done) == len(batch), "every write of the group has an outcome"
        return done

    def _undo(self, batch: Sequence[_Op], exc: Exception, *, wait: bool) -> list[_Outcome]:
        """A write of the group failed after writing: roll the group back, and retry each
        write in a transaction of its own (so that only the failing one fails)."""
        self._rollback()
        if len(batch) == 1:
            return [(False, self._map(exc))]
        if not wait:
            raise _RetryEach from None
        return [self._one_waiting(op) for op in batch]

    def _one_waiting(self, op: _Op) -> _Outcome:
        """One write in a transaction of its own, waiting for the lock (in a thread)."""
        try:
            self._begin_write_waiting()
        except sqlite3.Error as exc:
            return (False, self._map(exc))
        return self._batch_locked([op], begun=True)[0]

    def _map(self, exc: Exception) -> Exception:
        if isinstance(exc, sqlite3.Error):
            mapped = StoreError(_describe(exc, str(self.path)))
            mapped.__cause__ = exc
            return mapped
        return exc

    def _waiting(self, work: Callable[[], T]) -> T:
        """Run ``work`` holding the lock, in a worker thread, allowed to wait for locks."""
        with self._lock:
            self._check_open()
            self._conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            try:
                return work()
            finally:
                self._conn.execute("PRAGMA busy_timeout = 0")

    async def _run(self, fn: Callable[[Any], T], *, write: bool) -> T:
        if not write:
            return await self._read(fn)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover - not on asyncio (e.g. trio)
            loop = None
        if loop is not self._loop and not self._inflight and not self._flushing:
            self._loop = loop  # nothing queued on the old loop (if any): move to this one
        if loop is None or loop is not self._loop:
            # Group commit serves one event loop at a time; others get a transaction each.
            return await anyio.to_thread.run_sync(
                lambda: _unwrap(self._write_waiting([(fn, None)])[0])
            )
        self._check_open()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append((fn, future))
        self._inflight.add(future)
        future.add_done_callback(self._inflight.discard)
        if not self._flush_scheduled and not self._flushing:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return await future  # type: ignore[no-any-return]

    async def _read(self, fn: Callable[[Any], T]) -> T:
        if self._lock.acquire(blocking=False):
            try:
                self._check_open()
                self._begin(False)
                try:
                    return fn(_SqliteTx(self._conn))
                except sqlite3.OperationalError as exc:
                    if not _is_busy(exc):
                        raise StoreError(_describe(exc, str(self.path))) from exc
                    # Rare in WAL (another process recovering the WAL, say): wait in a
                    # thread below rather than on the event loop.
                except sqlite3.Error as exc:
                    raise StoreError(_describe(exc, str(self.path))) from exc
                finally:
                    self._rollback()
            finally:
                self._lock.release()
        return await anyio.to_thread.run_sync(
            lambda: self._waiting(lambda: self._read_locked(fn, begun=False))
        )

    def _flush(self) -> None:
        self._flush_scheduled = False
        batch = [(fn, f) for fn, f in self._queue if f is None or not f.cancelled()]
        self._queue = []
        if not batch:
            return
        each = False  # True: the group failed after writing; each write on its own
        planned = False  # True: planning was tried here; the thread need not try again
        if self._lock.acquire(blocking=False):
            try:
                if self._closed:
                    _deliver(
                        batch, [(False, StoreError(f"store {self.path} is closed"))] * len(batch)
                    )
                    return
                plan, planned = self._make_plan(batch), True
                try:
                    self._begin(True)
                except sqlite3.OperationalError:
                    # Another process holds the write lock: wait in a thread, and plan
                    # the next groups too.
                    self._plan_groups = OTHERS_WINDOW
                else:
                    try:
                        outcomes = self._batch_locked(batch, begun=True, plan=plan, wait=False)
                    except _RetryEach:
                        each = True
                    else:
                        _deliver(batch, outcomes)
                        return
            finally:
                self._lock.release()
        else:
            plan = None
        self._flushing = True
        assert self._loop is not None
        self._loop.run_in_executor(None, self._flush_waiting, batch, plan, planned, each)

    def _begin_write_waiting(self) -> None:
        """``BEGIN IMMEDIATE``, waiting for another process's write lock (in a thread).

        SQLite's own busy handler sleeps ever longer (up to 100 ms) between tries, which
        all but hands the lock back to the process that holds it. Short jittered polls take
        it within a fraction of a millisecond of its release instead.
        """
        deadline = time.monotonic() + self._busy_ms / 1000
        pause = 0.0002  # seconds
        while True:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or time.monotonic() >= deadline:
                    raise
            else:
                return
            time.sleep(pause * (0.5 + _JITTER.random()))  # waiting for a lock, not a result
            pause = min(pause * 1.5, 0.002)

    def _write_waiting(
        self,
        batch: list[_Op],
        plan: _Plan | None = None,
        *,
        planned: bool = False,
        each: bool = False,
    ) -> list[_Outcome]:
        with self._lock:
            self._check_open()
            if each:
                return [self._one_waiting(op) for op in batch]
            if not planned:
                plan = self._make_plan(batch)
            try:
                self._begin_write_waiting()
            except sqlite3.Error as exc:
                failure = self._map(exc)
                return [(False, failure)] * len(batch)
            return self._batch_locked(batch, begun=True, plan=plan)

    def _flush_waiting(
        self, batch: list[_Op], plan: _Plan | None, planned: bool, each: bool
    ) -> None:
        try:
            outcomes = self._write_waiting(batch, plan, planned=planned, each=each)
        except Exception as exc:
            outcomes = [(False, exc)] * len(batch)
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._flushed, batch, outcomes)

    def _flushed(self, batch: list[_Op], outcomes: list[_Outcome]) -> None:
        _deliver(batch, outcomes)
        self._flushing = False
        if self._queue and not self._flush_scheduled:
            self._flush_scheduled = True
            self._flush()

    def checkpoint(self) -> None:
        """Copy the WAL into the database file and truncate it (``wal_checkpoint(TRUNCATE)``).

        SQLite checkpoints on its own as the WAL grows; this is for a quiet moment, such
        as after a bulk import, so that readers do not search a long WAL.
        """
        with self._lock:
            self._check_open()
            self._conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            try:
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            except sqlite3.Error as exc:
                raise StoreError(_describe(exc, str(self.path))) from exc
            finally:
                self._conn.execute("PRAGMA busy_timeout = 0")

    def integrity_check(self) -> str:
        """``PRAGMA integrity_check``: ``"ok"`` for a sound file."""
        with self._lock:
            return str(self._conn.execute("PRAGMA integrity_check").fetchone()[0])

    async def close(self) -> None:
        # Let queued writes commit first: a caller awaiting one must get its answer.
        if self._inflight:
            await asyncio.wait(list(self._inflight))
        self.close_sync()

    def close_sync(self) -> None:
        """Close the connection. Safe to call twice."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()


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
