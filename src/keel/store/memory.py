"""The in-memory adapter: for tests and demos. Everything is lost when the process ends.

It keeps rows exactly as the SQL adapters do (JSON columns as text), so values come back
as private copies and behave the same on every adapter.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

from keel.errors import StoreError
from keel.model import Event, JsonValue, Limits, Status, Task
from keel.store.base import Op, TxStore
from keel.store.browse import Position, TaskFilter
from keel.store.leases import LeaseMark, WorkerLeases, memory_leased, memory_stuck, memory_workers
from keel.store.protocol import Clock
from keel.store.rows import task_from_row, task_to_row

__all__ = ["MemoryStore"]

T = TypeVar("T")
_TERMINAL = {s.value for s in Status if s.terminal}


class _Data:
    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}
        self.keys: dict[tuple[str, str], str] = {}
        self.live: set[str] = set()
        self.events: dict[str, list[Event]] = {}
        self.steps: dict[str, dict[str, str]] = {}
        self.seq = 0
        """Numbers rows in the order they were stored, as SQLite's rowid."""


class _MemoryTx:
    """Applies writes at once and remembers how to undo them if the transaction fails."""

    def __init__(self, data: _Data) -> None:
        self._d = data
        self.undo: list[Callable[[], None]] = []
        self.changed: set[str] = set()
        """Tasks this transaction inserted or updated (for the change feed)."""

    def load(self, task_id: str) -> Task | None:
        row = self._d.rows.get(task_id)
        return None if row is None else task_from_row(row)

    def load_by_key(self, owner: str, key: str) -> Task | None:
        task_id = self._d.keys.get((owner, key))
        return None if task_id is None else self.load(task_id)

    def insert(self, task: Task) -> None:
        d = self._d
        if task.task_id in d.rows:  # pragma: no cover - ids are 128 random bits
            raise StoreError(f"task id {task.task_id} already exists")
        d.seq += 1
        self.changed.add(task.task_id)
        d.rows[task.task_id] = {**task_to_row(task), "rowid": d.seq}
        d.events[task.task_id] = []
        d.steps[task.task_id] = {}
        if not task.status.terminal:
            d.live.add(task.task_id)
        if task.idempotency_key is not None:
            d.keys[(task.owner, task.idempotency_key)] = task.task_id
        self.undo.append(lambda: self._forget(task))

    def _forget(self, task: Task) -> None:
        d = self._d
        d.rows.pop(task.task_id, None)
        d.events.pop(task.task_id, None)
        d.steps.pop(task.task_id, None)
        d.live.discard(task.task_id)
        if task.idempotency_key is not None:
            d.keys.pop((task.owner, task.idempotency_key), None)

    def update(self, old: Task, new: Task) -> None:
        row = self._d.rows.get(old.task_id)
        if row is None or row["status"] != old.status.value or row["fence"] != old.fence:
            raise StoreError(f"task {old.task_id} changed under a write")  # pragma: no cover
        before = dict(row)
        row.update(task_to_row(new, mutable_only=True))
        self.changed.add(new.task_id)
        if new.status.terminal:
            self._d.live.discard(new.task_id)

        def restore() -> None:
            row.clear()
            row.update(before)
            if before["status"] not in _TERMINAL:
                self._d.live.add(old.task_id)

        self.undo.append(restore)

    def append(self, event: Event) -> None:
        events = self._d.events[event.task_id]
        events.append(event)
        self.undo.append(lambda: events.remove(event))

    def _live(self) -> list[dict[str, Any]]:
        return [self._d.rows[i] for i in self._d.live]

    def ready(self, names: Collection[str], now: float, limit: int) -> list[Task]:
        rows = [
            r
            for r in self._live()
            if r["status"] == "working"
            and r["lease_owner"] is None
            and r["ready_at"] <= now
            and r["name"] in names
        ]
        rows.sort(key=lambda r: (r["ready_at"], r["rowid"]))
        return [task_from_row(r) for r in rows[:limit]]

    def expired(self, now: float, limit: int) -> list[Task]:
        rows = [
            r for r in self._live() if r["lease_owner"] is not None and r["lease_expires_at"] < now
        ]
        rows.sort(key=lambda r: (r["lease_expires_at"], r["task_id"]))
        return [task_from_row(r) for r in rows[:limit]]

    def stale(self, cutoff: float) -> list[Task]:
        rows = [r for r in self._live() if r["updated_at"] < cutoff]
        rows.sort(key=lambda r: (r["updated_at"], r["task_id"]))
        return [task_from_row(r) for r in rows]

    def purgeable(self, now: float, limit: int) -> list[str]:
        rows = [
            r
            for r in self._d.rows.values()
            if r["status"] in _TERMINAL and r["expires_at"] is not None and r["expires_at"] <= now
        ]
        rows.sort(key=lambda r: (r["expires_at"], r["task_id"]))
        return [r["task_id"] for r in rows[:limit]]

    def delete(self, task_ids: Sequence[str]) -> None:
        d = self._d
        for task_id in task_ids:
            row, events, steps = d.rows[task_id], d.events[task_id], d.steps[task_id]
            task = task_from_row(row)
            self._forget(task)

            def restore(
                t: Task = task,
                r: dict[str, Any] = row,
                e: list[Event] = events,
                s: dict[str, str] = steps,
            ) -> None:
                d.rows[t.task_id], d.events[t.task_id], d.steps[t.task_id] = r, e, s
                if t.idempotency_key is not None:
                    d.keys[(t.owner, t.idempotency_key)] = t.task_id

            self.undo.append(restore)

    def put_step(self, task_id: str, step: str, value_json: str, at: float) -> None:
        steps = self._d.steps[task_id]
        if step not in steps:
            steps[step] = value_json
            self.undo.append(lambda: steps.__delitem__(step))

    def get_steps(self, task_id: str) -> dict[str, JsonValue]:
        return {k: json.loads(v) for k, v in self._d.steps.get(task_id, {}).items()}

    def events(self, task_id: str) -> list[Event]:
        return list(self._d.events[task_id])

    def status_of(self, task_ids: Sequence[str]) -> dict[str, tuple[Status, int]]:
        rows = self._d.rows
        return {i: (Status(rows[i]["status"]), rows[i]["fence"]) for i in task_ids if i in rows}

    def counts(self) -> dict[Status, int]:
        return dict(Counter(Status(r["status"]) for r in self._d.rows.values()))

    def browse(self, where: TaskFilter, mark: Position | None, limit: int) -> list[Task]:
        rows = [
            r
            for r in self._d.rows.values()
            if where.matches(r) and (mark is None or mark.before(r))
        ]
        rows.sort(key=lambda r: (r["created_at"], r["task_id"]), reverse=True)
        return [task_from_row(r) for r in rows[:limit]]

    def schema_version(self) -> int:
        return 0  # memory:// keeps no schema

    def worker_leases(self, now: float) -> list[WorkerLeases]:
        return memory_workers(self._live(), now)

    def leased_by(self, worker: str, mark: LeaseMark | None, limit: int) -> list[Task]:
        return memory_leased(self._live(), worker, mark, limit)

    def stuck(
        self, now: float, waiting_before: float, cutoffs: Mapping[str, float], limit: int
    ) -> tuple[list[Task], list[Task], list[tuple[Task, float]]]:
        return memory_stuck(self._live(), self._d.events, now, waiting_before, cutoffs, limit=limit)

    def page(
        self, status: Status | None, owner: str | None, limit: int, after: str | None
    ) -> list[Task]:
        rows = sorted(self._d.rows.values(), key=lambda r: r["rowid"])
        if after is not None:
            mark = self._d.rows.get(after)
            if mark is None:
                return []
            rows = [r for r in rows if r["rowid"] > mark["rowid"]]
        rows = [
            r
            for r in rows
            if (status is None or r["status"] == status.value)
            and (owner is None or r["owner"] == owner)
        ]
        return [task_from_row(r) for r in rows[:limit]]


class MemoryStore(TxStore):
    """A :class:`keel.store.Store` in process memory (``memory://``)."""

    def __init__(self, *, clock: Clock | None = None, limits: Limits | None = None) -> None:
        super().__init__(clock=clock, limits=limits)
        self._data = _Data()
        self._lock = threading.Lock()
        self._closed = False

    async def close(self) -> None:
        """Drop the tasks: a closed memory store answers every call with StoreError."""
        with self._lock:
            self._closed = True
            self._data = _Data()

    async def _run(self, op: Op[T], *, write: bool) -> T:
        with self._lock:
            if self._closed:
                raise StoreError("store memory:// is closed")
            tx = _MemoryTx(self._data)
            try:
                out = op.run(tx)
            except BaseException:
                for undo in reversed(tx.undo):
                    undo()
                raise
            self.change_hub.publish(tx.changed)  # committed: in the lock, in commit order
            return out
