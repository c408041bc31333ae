"""Contract: complete_many, several completions in one call (how a worker writes them)."""

from __future__ import annotations

import math

import pytest

from keel import (
    InvalidPayload,
    InvalidTransition,
    LeaseLost,
    Status,
    TaskAlreadyTerminal,
    TaskNotFound,
)
from keel.store.base import MAX_COMPLETE_BATCH

from .support import WORKER, ask, claimed, everything, refused

pytestmark = pytest.mark.anyio


async def test_complete_many_completes_each_with_its_result(store, clock):
    """Each claimed task completed with its own result, in the order given, one history
    entry each, exactly as one complete call per task would leave it."""
    tasks = [await claimed(store) for _ in range(3)]
    clock.advance(2)
    done = await store.complete_many(
        [(t.task_id, {"n": n}, t.fence) for n, t in enumerate(tasks)], actor=f"worker:{WORKER}"
    )
    assert [d.task_id for d in done] == [t.task_id for t in tasks]  # type: ignore[union-attr]
    for n, (task, got) in enumerate(zip(tasks, done, strict=True)):
        assert got == await store.get(task.task_id)
        assert (got.status, got.result, got.closed_fence) == (
            Status.COMPLETED,
            {"n": n},
            task.fence,
        )
        assert (got.lease_owner, got.updated_at) == (None, clock.now)
        event = (await store.history(task.task_id))[-1]
        assert (event.from_status, event.to_status) == (Status.WORKING, Status.COMPLETED)
        assert (event.actor, event.at) == (f"worker:{WORKER}", clock.now)


async def test_a_refused_completion_leaves_its_task_and_the_others_complete(store):
    """Each refusal is the error complete would raise, in its place; its task is unchanged
    (history included), and the others complete in the same call."""
    good = await claimed(store)
    stale = await claimed(store)
    waiting = await store.create(input_requests={"service": ask()})
    ended = await claimed(store)
    await store.complete(ended.task_id, "first", fence=ended.fence)
    bad = await claimed(store)
    untouched = {
        t.task_id: await everything_of(store, t.task_id) for t in (stale, waiting, ended, bad)
    }
    done = await store.complete_many(
        [
            ("no-such-task", 1, 1),
            (stale.task_id, 2, stale.fence + 1),
            (waiting.task_id, 3, None),
            (ended.task_id, "second", ended.fence),
            (bad.task_id, {"x": math.nan}, bad.fence),
            (good.task_id, "ok", good.fence),
        ]
    )
    kinds = [type(d) for d in done[:5]]
    assert kinds == [
        TaskNotFound,
        LeaseLost,
        InvalidTransition,
        TaskAlreadyTerminal,
        InvalidPayload,
    ]
    assert done[5] == await store.get(good.task_id)
    assert (done[5].status, done[5].result) == (Status.COMPLETED, "ok")  # type: ignore[union-attr]
    for task_id, before in untouched.items():
        assert await everything_of(store, task_id) == before


async def test_a_repeat_in_complete_many_returns_the_snapshot(store):
    """An exact repeat of the completion returns the stored task, as complete does."""
    task = await claimed(store)
    first = await store.complete(task.task_id, {"a": 1}, fence=task.fence)
    assert await store.complete_many([(task.task_id, {"a": 1}, task.fence)]) == [first]


async def test_complete_many_of_nothing_writes_nothing(store):
    before = await everything(store)
    assert await store.complete_many([]) == []
    assert await everything(store) == before


async def test_too_many_completions_in_one_call_are_refused(store):
    """More than MAX_COMPLETE_BATCH in one call: refused whole, nothing completed."""
    task = await claimed(store)
    many = [(task.task_id, n, task.fence) for n in range(MAX_COMPLETE_BATCH + 1)]
    error = await refused(store, InvalidPayload, lambda: store.complete_many(many))
    assert str(MAX_COMPLETE_BATCH) in str(error)


async def everything_of(store, task_id):
    """One task as stored, with its history."""
    return await store.get(task_id), tuple(await store.history(task_id))


async def test_complete_many_keeps_the_lease_rules(store):
    """An unfenced completion of a leased task is refused as complete refuses it."""
    task = await claimed(store)
    before = await everything_of(store, task.task_id)
    done = await store.complete_many([(task.task_id, 1, None)])
    assert type(done[0]) is InvalidTransition
    assert await everything_of(store, task.task_id) == before


@pytest.mark.parametrize(
    "results",
    ["abc", [("a", 1)], [("a", 1, 1, 2)], [None], {"a": (1, 2, 3)}],
    ids=["a string", "a pair", "four items", "not a triple", "a mapping"],
)
async def test_malformed_completions_are_refused(store, results):
    """Not a list of (task_id, result, fence): InvalidPayload naming it, nothing written."""
    task = await claimed(store)
    error = await refused(store, InvalidPayload, lambda: store.complete_many(results))
    assert "complete_many" in str(error)
    assert (await store.get(task.task_id)).status is Status.WORKING
