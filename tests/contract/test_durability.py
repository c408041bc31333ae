"""Contract: what a durable adapter keeps across a reopen (a restarted process)."""

from __future__ import annotations

import pytest

from keel import IdempotencyConflict, LeaseLost, Status

from .support import ERROR, JOB, LEASE, WORKER, ask, claimed, everything

pytestmark = pytest.mark.anyio


async def test_everything_survives_a_reopen(store, reopen, clock):
    """A second handle on the same data sees every task, history and step, unchanged."""
    waiting = await store.create(name=JOB, input_requests={"svc": ask()}, idempotency_key="k")
    lease = await claimed(store, name="other", max_attempts=2)
    await store.save_step(lease.task_id, "s", {"rows": [1]}, fence=lease.fence)
    done = await store.create()
    await store.fail(done.task_id, ERROR)
    clock.advance(5)
    before = await everything(store)
    second = reopen()
    assert await everything(second) == before
    assert (await second.get(waiting.task_id)).pending_input == {"svc": ask()}


async def test_waiting_task_resumes_after_a_restart(store, reopen):
    """A task waiting for input before the restart takes its answer after it (the incident)."""
    task = await store.create(input_requests={"svc": ask()}, idempotency_key="incident-1")
    await store.close()
    second = reopen()
    assert (await second.get(task.task_id)).status is Status.INPUT_REQUIRED
    got = await second.provide_input(task.task_id, {"svc": {"service": "payments"}})
    assert got.status is Status.WORKING
    done = await second.complete(task.task_id, {"summary": "deploy 42"})
    assert (await reopen().get(task.task_id)) == done


async def test_idempotency_keys_survive_a_restart(store, reopen):
    """A retried create after a restart finds the task; a different one still conflicts."""
    task = await store.create(arguments={"a": 1}, idempotency_key="k")
    second = reopen()
    assert (await second.create(arguments={"a": 1}, idempotency_key="k")).task_id == task.task_id
    with pytest.raises(IdempotencyConflict):
        await second.create(arguments={"a": 2}, idempotency_key="k")


async def test_fences_survive_a_restart(store, reopen, clock):
    """After a restart the fence still refuses the previous attempt's writes."""
    old = await claimed(store, max_attempts=2)
    second = reopen()
    clock.advance(LEASE + 1)
    await second.recover_expired()
    [new] = await second.claim([JOB], worker=WORKER, lease_seconds=LEASE)
    assert new.fence == old.fence + 1
    with pytest.raises(LeaseLost):
        await store.complete(old.task_id, 1, fence=old.fence)
