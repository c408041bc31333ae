"""Contract: edge cases of the uniform terminal answer, leases, owners and closing."""

from __future__ import annotations

import math

import pytest

from keel import InvalidPayload, StoreError, TaskAlreadyTerminal, TaskNotFound
from keel.model import Limits

from .support import ERROR, JOB, LEASE, WORKER, claimed, refused

pytestmark = pytest.mark.anyio


async def test_finished_task_answers_terminal_even_to_a_non_json_result(store):
    """complete(done, NaN) is a write to a finished task first: TaskAlreadyTerminal."""
    task = await store.create()
    await store.complete(task.task_id, {"ok": True})
    error = await refused(
        store, TaskAlreadyTerminal, lambda: store.complete(task.task_id, math.nan)
    )
    assert error.task.result == {"ok": True}


async def test_finished_task_answers_terminal_even_to_a_malformed_error(store):
    """fail(done, not-an-error) on a finished task: TaskAlreadyTerminal, not InvalidPayload."""
    task = await store.create()
    await store.cancel(task.task_id)
    await refused(store, TaskAlreadyTerminal, lambda: store.fail(task.task_id, {"nope": 1}))


async def test_finished_task_answers_terminal_even_to_an_oversized_step(make_store, clock):
    """A too-large step for a finished task: TaskAlreadyTerminal, not PayloadTooLarge."""
    store = make_store(limits=Limits(max_step_bytes=16))
    lease = await claimed(store)
    await store.cancel(lease.task_id)
    await refused(
        store,
        TaskAlreadyTerminal,
        lambda: store.save_step(lease.task_id, "s", "x" * 100, fence=lease.fence),
    )


async def test_finished_task_answers_terminal_to_an_over_long_cancel_reason(make_store):
    """Cancelling a finished task with a reason over the limit: TaskAlreadyTerminal."""
    store = make_store(limits=Limits(max_message_chars=10))
    task = await store.create()
    await store.complete(task.task_id, None)
    await refused(store, TaskAlreadyTerminal, lambda: store.cancel(task.task_id, reason="r" * 50))


async def test_retry_of_a_finished_task_is_terminal_whatever_the_error(store):
    """retry on a cancelled task answers TaskAlreadyTerminal, even with a malformed error."""
    lease = await claimed(store, max_attempts=3)
    await store.cancel(lease.task_id)
    for error in (ERROR, {"bad": True}):
        await refused(
            store,
            TaskAlreadyTerminal,
            lambda e=error: store.retry(lease.task_id, e, fence=lease.fence, delay_seconds=0),
        )


async def test_a_lease_expiring_exactly_now_is_not_recovered_yet(store, clock):
    """A lease is valid up to its expiry instant; recovery takes it only after that."""
    lease = await claimed(store, max_attempts=2)
    clock.advance(LEASE)
    assert await store.recover_expired() == []
    clock.advance(0.001)
    [recovered] = await store.recover_expired()
    assert recovered.task_id == lease.task_id
    assert recovered.attempt == 2


async def test_claim_refuses_a_string_of_names(store):
    """claim("job") would claim the names j, o, b: it is refused as InvalidPayload."""
    await store.create(name=JOB)
    await refused(
        store, InvalidPayload, lambda: store.claim(JOB, worker=WORKER, lease_seconds=LEASE)
    )


async def test_history_and_steps_are_owner_scoped(store):
    """Another owner's task is unknown to history() and steps() too, as to get()."""
    task = await store.create(owner="alice")
    assert len(await store.history(task.task_id, owner="alice")) == 1
    for call in (store.history, store.steps):
        with pytest.raises(TaskNotFound) as info:
            await call(task.task_id, owner="mallory")
        assert str(info.value) == f"unknown task: {task.task_id}"


async def test_a_closed_store_refuses_every_call(make_store):
    """After close(), every call raises StoreError (memory and SQLite alike)."""
    store = make_store()
    task = await store.create()
    await store.close()
    with pytest.raises(StoreError):
        await store.get(task.task_id)
    with pytest.raises(StoreError):
        await store.create()
