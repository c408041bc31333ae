"""The outcomes of handlers that end together are written in one store call
(``complete_many``); a call the store refuses as a whole is written one task at a time,
and one it cannot take now is written again, so that no task's outcome is lost."""

from __future__ import annotations

from typing import Any

import pytest

from keel.errors import StoreError, StoreUnavailable
from keel.model import Status
from keel.runtime import Keel, TaskContext
from keel.store import MemoryStore
from keel.store.observed import Committed

from .support import Gates, running, settles, terminal_events, worker

pytestmark = pytest.mark.anyio

COUNT = 6


class Commits:
    """A store observer: what each committed call was, with how many transitions."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def committed(self, commit: Committed) -> None:
        self.seen.append((commit.what, len(commit.transitions)))


class Refusing(MemoryStore):
    """A memory store whose ``complete_many`` raises ``error`` the first ``times`` calls
    (then writes as usual); its ``complete`` calls are counted."""

    def __init__(self, error: StoreError, times: int) -> None:
        super().__init__()
        self.error, self.times = error, times
        self.batches: list[int] = []
        self.singles = 0

    async def complete_many(self, results: Any, **kw: Any) -> Any:
        self.batches.append(len(results))
        if len(self.batches) <= self.times:
            raise self.error
        return await super().complete_many(results, **kw)

    async def complete(self, task_id: str, result: Any, **kw: Any) -> Any:
        self.singles += 1
        return await super().complete(task_id, result, **kw)


async def ended_together(store: MemoryStore) -> list[str]:
    """``COUNT`` tasks whose handlers end in the same event-loop pass; their ids once all
    are terminal."""
    app, gates = Keel(store), Gates()
    entered = [0]

    @app.task("together")
    async def together(ctx: TaskContext, n: int) -> int:
        entered[0] += 1
        if entered[0] == COUNT:
            gates.open("all in")
        await gates.wait("end")
        return n

    tasks = [await app.submit("together", {"n": n}) for n in range(COUNT)]
    async with running(worker(app, concurrency=COUNT)):
        await gates.wait("all in")
        gates.open("end")
        for task in tasks:
            await settles(store, task.task_id)
    return [task.task_id for task in tasks]


async def completed_once(store: MemoryStore, task_ids: list[str]) -> None:
    for n, task_id in enumerate(task_ids):
        task = await store.get(task_id)
        text = [{"type": "text", "text": str(n)}]
        assert (task.status, task.result) == (Status.COMPLETED, {"content": text, "isError": False})
        assert len(terminal_events(await store.history(task_id))) == 1


async def test_handlers_that_end_together_complete_in_one_store_call() -> None:
    store, commits = MemoryStore(), Commits()
    store.observer = commits
    task_ids = await ended_together(store)
    await completed_once(store, task_ids)
    assert [seen for seen in commits.seen if seen[0] == "complete"] == [("complete", COUNT)]


async def test_a_batch_the_store_refuses_is_written_one_task_at_a_time() -> None:
    """A refusal of the whole call is not blamed on every task: each is completed alone."""
    store = Refusing(StoreError("a write the database refused"), times=1)
    task_ids = await ended_together(store)
    await completed_once(store, task_ids)
    assert (store.batches, store.singles) == ([COUNT], COUNT)


async def test_a_batch_the_store_cannot_take_now_is_written_again() -> None:
    """StoreUnavailable: every attempt writes its outcome again after its backoff."""
    store = Refusing(StoreUnavailable("memory://", "a test outage"), times=2)
    task_ids = await ended_together(store)
    await completed_once(store, task_ids)
    # The first call had them all; after the two refused, each task was written once.
    assert store.batches[0] == COUNT
    assert sum(store.batches[2:]) == COUNT
    assert store.singles == 0
