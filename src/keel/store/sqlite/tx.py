"""The SQLite :class:`~keel.store.base.Tx`: row primitives over the store's connection.

History entries are held back and inserted with the rest of the group in one
``executemany`` just before COMMIT (same transaction, a fraction of the cost), and an
update writes only the columns that changed since the row was read.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Collection, Sequence
from typing import Any

from keel.errors import StoreError
from keel.model import Event, JsonValue, Status, Task
from keel.store.browse import Position, TaskFilter, sql_where
from keel.store.rows import event_from_row, task_from_row, task_to_row
from keel.store.sqlfiles import load_queries
from keel.store.sqlite.leases import SqliteLeases

__all__ = ["EventRow", "Fill", "Q", "SqliteTx"]

Q = load_queries("keel.store.sqlite")
"""The adapter's named statements (``queries.sql``)."""

EventRow = tuple[str, float, str | None, str, str, str]
"""A history entry as insert_event_row's parameters."""


class SqliteTx(SqliteLeases):
    """One op's view of the store's transaction (which the caller begins and ends)."""

    def __init__(self, conn: sqlite3.Connection, pending: list[EventRow] | None = None) -> None:
        self._c = conn
        self.wrote = False
        self.events_out: list[EventRow] = []
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
        row = self._c.execute(Q[query], params).fetchone()
        return None if row is None else self._kept(row)

    def _all(self, query: str, params: dict[str, Any]) -> list[Task]:
        return [self._kept(row) for row in self._c.execute(Q[query], params)]

    def load(self, task_id: str) -> Task | None:
        return self._one("get_task", {"task_id": task_id})

    def load_by_key(self, owner: str, key: str) -> Task | None:
        return self._one("get_task_by_key", {"owner": owner, "idempotency_key": key})

    def insert(self, task: Task) -> None:
        self.wrote = True
        self._c.execute(Q["insert_task"], task_to_row(task))

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
            self._c.executemany(Q["insert_event_row"], self.pending)
            self.pending.clear()
        if self.events_out:
            self._c.executemany(Q["insert_event_row"], self.events_out)
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
        rows = self._c.execute(Q["purgeable_tasks"], {"now": now, "limit": limit})
        return [r["task_id"] for r in rows]

    def delete(self, task_ids: Sequence[str]) -> None:
        self.wrote = True
        self.flush_events()  # entries of tasks deleted below must exist to be deleted
        if task_ids:
            self._c.execute(Q["delete_tasks"], {"task_ids": json.dumps(list(task_ids))})

    def put_step(self, task_id: str, step: str, value_json: str, at: float) -> None:
        self.wrote = True
        self._c.execute(
            Q["put_step"],
            {"task_id": task_id, "name": step, "value": value_json, "created_at": at},
        )

    def get_steps(self, task_id: str) -> dict[str, JsonValue]:
        rows = self._c.execute(Q["get_steps"], {"task_id": task_id})
        return {r["name"]: json.loads(r["value"]) for r in rows}

    def events(self, task_id: str) -> list[Event]:
        rows = self._c.execute(Q["get_events"], {"task_id": task_id})
        return [event_from_row(r) for r in rows]

    def status_of(self, task_ids: Sequence[str]) -> dict[str, tuple[Status, int]]:
        rows = self._c.execute(Q["task_statuses"], {"task_ids": json.dumps(list(task_ids))})
        return {r["task_id"]: (Status(r["status"]), r["fence"]) for r in rows}

    def counts(self) -> dict[Status, int]:
        rows = self._c.execute(Q["count_by_status"], {})
        return {Status(r["status"]): int(r["n"]) for r in rows}

    def browse(self, where: TaskFilter, mark: Position | None, limit: int) -> list[Task]:
        condition, params = sql_where(where, mark, lambda name: f":{name}")
        query = Q["browse_tasks"].replace("{where}", condition)
        return [self._kept(row) for row in self._c.execute(query, {**params, "limit": limit})]

    def schema_version(self) -> int:
        return int(self._c.execute("SELECT max(version) FROM keel_schema").fetchone()[0])

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
    return Q["update_task"].replace("{assignments}", assignments)


class Fill(SqliteTx):
    """Under the lock, the rest of a planned claim that took ``taken`` tasks as planned
    (see ``keel.store.sqlite.planning.Part.taken``): it reads as many fewer ready tasks.
    Those it took are no longer ready, so it finds the ones before them still free."""

    def __init__(self, conn: sqlite3.Connection, pending: list[EventRow], taken: int) -> None:
        super().__init__(conn, pending)
        self.taken = taken
        # The tasks it took as planned are written already: should the rest fail, the
        # group must be undone, not commit them as if the claim had been refused.
        self.wrote = True

    def ready(self, names: Collection[str], now: float, limit: int) -> list[Task]:
        return super().ready(names, now, limit - self.taken) if limit > self.taken else []
