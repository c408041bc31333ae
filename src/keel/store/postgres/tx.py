"""The PostgreSQL :class:`~keel.store.base.Tx`: row primitives over one connection.

A write group runs several protocol calls in one transaction. To keep that to a handful
of round trips whatever its size:

* the tasks the group will change, as its ops declare them
  (:attr:`~keel.store.base.Op.touches`), are read and locked in **one**
  ``SELECT … FOR UPDATE`` up front, in task-id order so that two groups cannot deadlock;
* updates and history entries are **held back** and sent together (one statement
  each, over one JSON array of rows: ``update_tasks``, ``insert_events``) just before
  anything that must see them, and before COMMIT;
* what the transaction knows of a task (read, inserted or changed) is kept, so a second
  call on the same task in the group reads it without a round trip.

A call that is refused (a :class:`~keel.errors.KeelError`) before anything it did reached
the database is simply undone from what is held back; the others in its group commit.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from typing import Any

import msgspec
import psycopg
from psycopg.rows import RowMaker, dict_row, no_result

from keel.errors import StoreError
from keel.model import Event, JsonValue, Status, Task
from keel.store.browse import Position, TaskFilter, sql_where
from keel.store.postgres.leases import PgLeases
from keel.store.rows import event_from_row, task_from_row, task_reader, task_to_row
from keel.store.sqlfiles import load_queries

__all__ = ["GroupState", "PgTx"]

Q = load_queries(__package__ or "keel.store.postgres")

_ABSENT = object()

Mark = tuple[int, dict[str, Task | None], dict[str, tuple[Task, Task]], int]


_encode = msgspec.json.Encoder().encode


def _json_rows(rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Rows as one JSON array, the one parameter of ``update_tasks`` and ``insert_events``:
    one string for psycopg to send, where arrays of every column cost it a conversion per
    element (floats in their shortest round-trip form: float8 reads them back exactly)."""
    return {"rows": _encode(rows).decode()}


class GroupState:
    """What one transaction (a group of calls) knows and holds back."""

    def __init__(self, *, write: bool, now: Callable[[], float]) -> None:
        self.write = write
        self._now = now
        self.cache: dict[str, Task | None] = {}
        """Each task as this transaction sees it (None: known not to exist)."""
        self.updates: dict[str, tuple[Task, Task]] = {}
        """Held-back updates: task id -> (the row as stored, the task as it must be)."""
        self.events: list[dict[str, Any]] = []
        self.flushes = 0
        """How many times held-back writes were sent (a call that saw one cannot be undone)."""
        self.wrote = False
        """Whether anything reached the database (held-back writes count once sent)."""
        self.ready_names: set[str] = set()
        self.cancelled: set[str] = set()
        self.changed: set[str] = set()
        """Tasks written (for the change feed, :mod:`keel.store.changes`)."""
        self._sent_updates: list[tuple[psycopg.Cursor[Any], int]] = []
        """Updates sent whose row counts :meth:`check` has not looked at yet."""

    def preload(self, cur: psycopg.Cursor[dict[str, Any]], task_ids: Sequence[str]) -> None:
        ids = [i for i in task_ids if i not in self.cache]
        if not ids:
            return
        query = Q["get_tasks_locked"] if self.write else Q["get_tasks"]
        found = {t.task_id: t for t in task_cursor(cur).execute(query, {"task_ids": ids})}
        for task_id in ids:
            self.cache[task_id] = found.get(task_id)

    def note(self, old: Task | None, new: Task) -> None:
        """Remember what the notifications after COMMIT must say about ``new``."""
        self.changed.add(new.task_id)
        if new.status is Status.WORKING and new.lease_owner is None and new.name is not None:
            if new.ready_at <= self._now():
                self.ready_names.add(new.name)
        elif new.status is Status.CANCELLED and old is not None and old.lease_owner is not None:
            self.cancelled.add(new.task_id)

    def flush(self, cur: psycopg.Cursor[dict[str, Any]]) -> None:
        """Send the held-back updates and history entries."""
        if self.updates or self.events:
            self.flushes += 1
        if self.updates:
            rows = []
            for stored, new in self.updates.values():
                row = task_to_row(new, mutable_only=True)
                row.update(task_id=stored.task_id, old_status=stored.status,
                           old_fence=stored.fence)  # fmt: skip
                rows.append(row)
            self.updates = {}
            # A cursor of their own: its row count is read after the answers came (see
            # check), which a write group in pipeline mode waits for only before COMMIT.
            updating = cur.connection.cursor()
            updating.execute(Q["update_tasks"], _json_rows(rows))
            self._sent_updates.append((updating, len(rows)))
            self.wrote = True
        if self.events:
            events, self.events = self.events, []
            cur.execute(Q["insert_events"], _json_rows(events))
            self.wrote = True

    def check(self) -> None:
        """Refuse the group if a held-back update sent matched no row (once its answers
        came): the rows are locked, so this cannot happen; if it does, nothing commits."""
        sent, self._sent_updates = self._sent_updates, []
        for updating, expected in sent:
            if updating.rowcount != expected:
                raise StoreError("a task changed under a locked write; nothing was written")

    def mark(self) -> Mark:
        """What to go back to if the next call is refused (see :meth:`undo`)."""
        return len(self.events), dict(self.cache), dict(self.updates), self.flushes

    def undo(self, mark: Mark) -> None:
        """Forget a refused call's held-back writes (only if none of them were sent)."""
        del self.events[mark[0] :]
        self.cache, self.updates = mark[1], mark[2]


class PgTx(PgLeases):
    """One protocol call's view of the group's transaction."""

    def __init__(self, cur: psycopg.Cursor[dict[str, Any]], state: GroupState) -> None:
        self._cur = cur
        self._s: GroupState = state
        self.sent = False
        """Whether this call sent a write that cannot be undone without a rollback."""

    def _sent(self) -> None:
        self.sent = True
        self._s.wrote = True

    def _fetch(self, query: str, params: dict[str, Any]) -> list[Task]:
        self._s.flush(self._cur)
        tasks = task_cursor(self._cur).execute(Q[query], params).fetchall()
        for task in tasks:
            # A held-back change is newer than the row (flushed above, so none are left).
            self._s.cache[task.task_id] = task
        return tasks

    def load(self, task_id: str) -> Task | None:
        cache = self._s.cache
        if task_id in cache:
            return cache[task_id]
        query = Q["get_task_locked"] if self._s.write else Q["get_task"]
        task = task_cursor(self._cur).execute(query, {"task_id": task_id}).fetchone()
        cache[task_id] = task
        return task

    def load_by_key(self, owner: str, key: str) -> Task | None:
        row = self._cur.execute(
            Q["get_task_by_key"], {"owner": owner, "idempotency_key": key}
        ).fetchone()
        if row is None:
            return None
        task_id = row["task_id"]
        cached = self._s.cache.get(task_id, _ABSENT)
        if isinstance(cached, Task):
            return cached
        task = task_from_row(row)
        self._s.cache[task_id] = task
        return task

    def insert(self, task: Task) -> None:
        self._s.flush(self._cur)  # history entries of earlier calls first, in order
        self._cur.execute(Q["insert_task"], task_to_row(task))
        self._sent()
        self._s.cache[task.task_id] = task
        self._s.note(None, task)

    def update(self, old: Task, new: Task) -> None:
        held = self._s.updates.get(old.task_id)
        stored = old if held is None else held[0]
        self._s.updates[old.task_id] = (stored, new)
        self._s.cache[old.task_id] = new
        self._s.note(old, new)

    def append(self, event: Event) -> None:
        self._s.events.append(
            {
                "task_id": event.task_id,
                "at": event.at,
                "from_status": event.from_status,  # StrEnums: the JSON has their values
                "to_status": event.to_status,
                "reason": event.reason,
                "actor": event.actor,
            }
        )

    def ready(self, names: Collection[str], now: float, limit: int) -> list[Task]:
        return self._fetch("ready_tasks", {"names": list(names), "now": now, "limit": limit})

    def expired(self, now: float, limit: int) -> list[Task]:
        if not self._s.write:
            # The sweep's "anything to do?" read: ids only, no lock.
            rows = self._cur.execute(Q["any_expired"], {"now": now}).fetchall()
            return [t for r in rows if (t := self.load(r["task_id"])) is not None][:limit]
        return self._fetch("expired_leases", {"now": now, "limit": limit})

    def stale(self, cutoff: float) -> list[Task]:
        return self._fetch("stale_tasks", {"cutoff": cutoff})

    def purgeable(self, now: float, limit: int) -> list[str]:
        self._s.flush(self._cur)
        rows = self._cur.execute(Q["purgeable_tasks"], {"now": now, "limit": limit})
        return [r["task_id"] for r in rows]

    def delete(self, task_ids: Sequence[str]) -> None:
        if not task_ids:
            return
        self._s.flush(self._cur)
        self._cur.execute(Q["delete_tasks"], {"task_ids": list(task_ids)})
        self._sent()
        for task_id in task_ids:
            self._s.cache[task_id] = None

    def put_step(self, task_id: str, step: str, value_json: str, at: float) -> None:
        self._cur.execute(
            Q["put_step"], {"task_id": task_id, "name": step, "value": value_json, "created_at": at}
        )
        self._sent()

    def get_steps(self, task_id: str) -> dict[str, JsonValue]:
        rows = self._cur.execute(Q["get_steps"], {"task_id": task_id})
        return {r["name"]: json.loads(r["value"]) for r in rows}

    def events(self, task_id: str) -> list[Event]:
        self._s.flush(self._cur)
        rows = self._cur.execute(Q["get_events"], {"task_id": task_id})
        return [event_from_row(r) for r in rows]

    def status_of(self, task_ids: Sequence[str]) -> dict[str, tuple[Status, int]]:
        self._s.flush(self._cur)
        rows = self._cur.execute(Q["task_statuses"], {"task_ids": list(task_ids)})
        return {r["task_id"]: (Status(r["status"]), r["fence"]) for r in rows}

    def counts(self) -> dict[Status, int]:
        self._s.flush(self._cur)
        rows = self._cur.execute(Q["count_by_status"], {})
        return {Status(r["status"]): int(r["n"]) for r in rows}

    def schema_version(self) -> int:
        row = self._cur.execute("SELECT coalesce(max(version), 0) AS v FROM keel_schema")
        return int(row.fetchone()["v"])  # type: ignore[index]

    def page(
        self, status: Status | None, owner: str | None, limit: int, after: str | None
    ) -> list[Task]:
        params = {
            "status": None if status is None else status.value,
            "owner": owner,
            "after": after,
            "limit": limit,
        }
        return self._fetch("page_tasks", params)

    def browse(self, where: TaskFilter, mark: Position | None, limit: int) -> list[Task]:
        # task_id in byte order ("C"), as the browse indexes keep it (0002_browse.sql).
        condition, params = sql_where(
            where, mark, lambda name: f"%({name})s", id_column='task_id COLLATE "C"', find="strpos"
        )
        self._s.flush(self._cur)
        query = Q["browse_tasks"].replace("{where}", condition)
        return task_cursor(self._cur).execute(query.encode(), {**params, "limit": limit}).fetchall()

    def claim(
        self, names: Collection[str], now: float, worker: str, lease: float, limit: int
    ) -> list[Task]:
        """Lease up to ``limit`` ready tasks in one statement (see ``claim`` in queries.sql)."""
        self._s.flush(self._cur)
        params = {"names": list(names), "now": now, "worker": worker, "lease": lease,
                  "limit": limit}  # fmt: skip
        tasks = task_cursor(self._cur).execute(Q["claim"], params).fetchall()
        for task in tasks:
            self._s.cache[task.task_id] = task
        if tasks:
            self._sent()
        return tasks


def cursor(conn: psycopg.Connection[Any]) -> psycopg.Cursor[dict[str, Any]]:
    """A cursor whose rows are dicts (what :func:`task_from_row` reads)."""
    return conn.cursor(row_factory=dict_row)


def task_cursor(cur: psycopg.Cursor[Any]) -> psycopg.Cursor[Task]:
    """A cursor beside ``cur`` for statements that return whole tasks (``SELECT *`` of
    ``tasks``): each row becomes a :class:`Task` straight from the driver's tuple, where a
    dict per row cost as much again as the Task (see :func:`task_reader`). Its results come
    in PostgreSQL's binary format: a task's seven times are float8, which the text format
    sends as decimal digits for Python to parse (about a twentieth of a worker's work per
    task); the values are the same."""
    return cur.connection.cursor(row_factory=_task_row, binary=True)


def _task_row(cur: Any) -> RowMaker[Task]:
    """psycopg's row factory of :func:`task_cursor`: called once per result (its column
    names read from the result itself: ``cur.description`` builds a Column per column)."""
    result = cur.pgresult
    if result is None or not result.nfields:
        return no_result
    return task_reader([result.fname(i).decode() for i in range(result.nfields)])
