"""Contract: an operator's retry of a failed task (``store.rerun``, :mod:`keel.store.rerun`).

A new task with a new id and the same name, arguments, owner, attempts and TTL, the old
task's recorded steps copied, the two histories naming each other; the old task stays
exactly as it was. Only a failed task is retried; anything else is refused unchanged.
"""

from __future__ import annotations

import pytest

from keel import InvalidTransition, Status, TaskNotFound
from keel.store import Store

from .support import ERROR, JOB, LEASE, WORKER, FakeClock, ask, claimed, refused

pytestmark = pytest.mark.anyio


async def _dead_lettered(store: Store) -> str:
    """A task that failed its only attempt after recording a step."""
    task = await claimed(
        store, arguments={"host": "db-1"}, owner="alice", ttl=3600, idempotency_key="k1"
    )
    await store.save_step(task.task_id, "fetch", {"rows": 3}, fence=task.fence)
    dead = await store.retry(task.task_id, ERROR, fence=task.fence, delay_seconds=0)
    assert dead.status is Status.FAILED
    return task.task_id


async def test_a_failed_task_is_retried_as_a_new_linked_task(
    store: Store, clock: FakeClock
) -> None:
    """Same request, steps copied, histories linked; the old task is untouched."""
    old_id = await _dead_lettered(store)
    before = await store.get(old_id)
    clock.advance(5)
    new = await store.rerun(old_id, actor="local operator")
    assert new.task_id != old_id
    assert new.status is Status.WORKING
    assert (new.name, new.arguments, new.owner) == (JOB, {"host": "db-1"}, "alice")
    assert (new.max_attempts, new.ttl, new.attempt) == (before.max_attempts, 3600, 1)
    assert new.idempotency_key is None
    assert await store.steps(new.task_id) == {"fetch": {"rows": 3}}
    assert await store.get(old_id) == before
    first = (await store.history(new.task_id))[0]
    assert (first.reason, first.actor, first.from_status) == (
        f"retry of {old_id}",
        "local operator",
        None,
    )
    last = (await store.history(old_id))[-1]
    assert (last.reason, last.actor) == (f"retried as {new.task_id}", "local operator")
    assert (last.from_status, last.to_status) == (Status.FAILED, Status.FAILED)
    again = await store.create(
        name=JOB, arguments={"host": "db-1"}, owner="alice", idempotency_key="k1"
    )
    assert again.task_id == old_id  # the key stays bound to the old task
    got = await store.claim([JOB], worker=WORKER, lease_seconds=LEASE)
    assert [t.task_id for t in got] == [new.task_id]


@pytest.mark.parametrize("outcome", ["working", "input_required", "completed", "cancelled"])
async def test_only_a_failed_task_is_retried(store: Store, outcome: str) -> None:
    """InvalidTransition naming the status; nothing changes."""
    asks = {"k": ask()} if outcome == "input_required" else None
    task = await store.create(name=JOB, input_requests=asks)
    if outcome == "completed":
        await store.complete(task.task_id, {"ok": True})
    elif outcome == "cancelled":
        await store.cancel(task.task_id)
    error = await refused(store, InvalidTransition, lambda: store.rerun(task.task_id))
    assert f"only a failed task can be retried; task {task.task_id} is {outcome}" == str(error)


async def test_an_unknown_task_is_not_found(store: Store) -> None:
    """TaskNotFound; nothing changes."""
    await refused(store, TaskNotFound, lambda: store.rerun("nope"))
