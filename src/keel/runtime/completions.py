"""A worker's completed outcomes, written together: one store call for the handlers that
ended at the same moment.

The store already commits the writes made together as one transaction (its group
commit). What it cannot save is the work around each call: an op and its future, its
place in the group, its record for the observer (metrics, logs), its answer. A worker
whose short handlers end by the dozen made one ``complete`` call per task; it now makes
one :meth:`~keel.store.Store.complete_many` for all the results queued by the time the
event loop comes round (a seventh of the instructions per task of a PostgreSQL worker
draining no-op tasks; docs/benchmarks.md, "Completions written together").

Each attempt still hears its own answer: its completed task, or the error the store
gave for its task alone (a lost lease, a result too large), raised where it waits. A
call that fails as a whole leaves every task as it was:

* :class:`~keel.errors.StoreUnavailable` is raised to each attempt, which writes its
  outcome again after its backoff (see ``Worker._finish``), together with the others
  that try again then;
* any other :class:`~keel.errors.StoreError` (a write the database refused, not the
  connection) is not blamed on the whole batch: each task is completed again alone, so
  that only the one whose write fails fails.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from keel.errors import KeelError, StoreError, StoreUnavailable
from keel.model import JsonObject, Task
from keel.store import Store
from keel.store.base import MAX_COMPLETE_BATCH

__all__ = ["Completions"]

_Result = tuple[str, JsonObject, int]
"""``(task_id, result, fence)``: one completion, as ``complete_many`` takes it."""


@dataclass(slots=True)
class _Queued:
    task: Task
    result: JsonObject
    answer: asyncio.Future[Task | KeelError]


class Completions:
    """Completes tasks for a worker, the results queued in one pass of the event loop
    together (at most :data:`~keel.store.base.MAX_COMPLETE_BATCH` a call)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._queue: list[_Queued] = []
        self._sending: set[asyncio.Task[None]] = set()  # held: the loop keeps only weak refs

    async def complete(self, task: Task, result: JsonObject) -> Task:
        """Complete ``task`` (claimed: its fence is the attempt's) with ``result``.

        Raises:
            KeelError: what ``store.complete`` would raise for it (StoreUnavailable included).
        """
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Task | KeelError] = loop.create_future()
        self._queue.append(_Queued(task, result, answer))
        if len(self._queue) == 1:
            loop.call_soon(self._send)
        got = await answer
        if isinstance(got, KeelError):
            raise got
        return got

    def _send(self) -> None:
        queue, self._queue = self._queue, []
        loop = asyncio.get_running_loop()
        for start in range(0, len(queue), MAX_COMPLETE_BATCH):
            sending = loop.create_task(self._write(queue[start : start + MAX_COMPLETE_BATCH]))
            self._sending.add(sending)
            sending.add_done_callback(self._sending.discard)

    async def _write(self, batch: list[_Queued]) -> None:
        results: list[_Result] = [(q.task.task_id, q.result, q.task.fence) for q in batch]
        done: Sequence[Task | KeelError]
        try:
            try:
                done = await self._store.complete_many(results)
            except StoreUnavailable:
                raise
            except StoreError:
                if len(batch) == 1:
                    raise
                done = await self._one_by_one(results)
        except BaseException as exc:
            for queued in batch:
                if not queued.answer.done():
                    queued.answer.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for queued, got in zip(batch, done, strict=True):
            if not queued.answer.done():
                queued.answer.set_result(got)

    async def _one_by_one(self, results: list[_Result]) -> Sequence[Task | KeelError]:
        """Each task completed alone (they still share a transaction when the store groups
        them; a refused one no longer fails the others)."""

        async def one(task_id: str, result: JsonObject, fence: int) -> Task | KeelError:
            try:
                return await self._store.complete(task_id, result, fence=fence)
            except KeelError as exc:
                return exc

        return list(await asyncio.gather(*(one(*result) for result in results)))
