"""Contract: claims, leases, fencing, retries, recovery, steps and status messages."""

from __future__ import annotations

import pytest

from keel import (
    InvalidPayload,
    InvalidTransition,
    LeaseLost,
    Status,
    TaskAlreadyTerminal,
)
from keel.model import INTERNAL_ERROR, Limits

from .support import ERROR, JOB, LEASE, WORKER, ask, claimed, everything, refused

pytestmark = pytest.mark.anyio


# --- claim ------------------------------------------------------------------------------


async def test_claim_leases_a_ready_task(store, clock):
    """claim gives the task a lease, bumps its fence and records who took it."""
    task = await store.create(name=JOB, max_attempts=3)
    clock.advance(1)
    [got] = await store.claim([JOB], worker=WORKER, lease_seconds=LEASE)
    assert got.task_id == task.task_id
    assert got.status is Status.WORKING
    assert (got.lease_owner, got.lease_expires_at) == (WORKER, clock.now + LEASE)
    assert got.fence == task.fence + 1
    assert got.attempt == 1
    assert got.updated_at == clock.now
    assert await store.get(task.task_id) == got
    event = (await store.history(task.task_id))[-1]
    assert (event.from_status, event.to_status) == (Status.WORKING, Status.WORKING)
    assert event.actor == f"worker:{WORKER}"
    assert "claimed" in event.reason
    assert "1/3" in event.reason


async def test_claim_takes_only_ready_working_tasks_with_registered_names(store):
    """Claims skip other names, nameless tasks, waiting, leased and finished tasks."""
    ready = await store.create(name=JOB)
    await store.create(name="other")
    await store.create()  # a facade task: nobody claims it
    await store.create(name=JOB, input_requests={"svc": ask()})
    done = await store.create(name=JOB)
    await store.complete(done.task_id, 1)
    cancelled = await store.create(name=JOB)
    await store.cancel(cancelled.task_id)
    got = await store.claim([JOB], worker=WORKER, lease_seconds=LEASE, limit=10)
    assert [t.task_id for t in got] == [ready.task_id]
    assert await store.claim([JOB], worker="w2", lease_seconds=LEASE, limit=10) == []


async def test_claim_takes_any_of_several_names(store, clock):
    """claim with several names takes ready tasks of each of them."""
    a = await store.create(name="a")
    clock.advance(1)
    b = await store.create(name="b")
    got = await store.claim(["b", "a"], worker=WORKER, lease_seconds=LEASE, limit=5)
    assert [t.task_id for t in got] == [a.task_id, b.task_id]


async def test_claim_is_oldest_first_and_bounded_by_limit(store, clock):
    """claim returns the oldest ready tasks first, at most ``limit`` per call."""
    ids = []
    for _ in range(5):
        ids.append((await store.create(name=JOB)).task_id)
        clock.advance(1)
    first = await store.claim([JOB], worker=WORKER, lease_seconds=LEASE, limit=2)
    second = await store.claim([JOB], worker=WORKER, lease_seconds=LEASE, limit=2)
    third = await store.claim([JOB], worker=WORKER, lease_seconds=LEASE, limit=2)
    assert [t.task_id for t in first] == ids[:2]
    assert [t.task_id for t in second] == ids[2:4]
    assert [t.task_id for t in third] == ids[4:]
    assert await store.claim([JOB], worker=WORKER, lease_seconds=LEASE) == []


@pytest.mark.parametrize(
    ("names", "limit"), [([], 1), ([JOB], 0), ([JOB], -1)], ids=["no-names", "zero", "negative"]
)
async def test_claim_with_nothing_to_take_changes_nothing(store, names, limit):
    """claim with no names or a limit below 1 takes nothing."""
    await store.create(name=JOB)
    before = await everything(store)
    assert await store.claim(names, worker=WORKER, lease_seconds=LEASE, limit=limit) == []
    assert await everything(store) == before


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"worker": "", "lease_seconds": LEASE}, id="empty-worker"),
        pytest.param({"worker": WORKER, "lease_seconds": 0}, id="zero-lease"),
        pytest.param({"worker": WORKER, "lease_seconds": -5}, id="negative-lease"),
    ],
)
async def test_claim_refuses_bad_options(store, kwargs):
    """claim with an empty worker id or a non-positive lease raises InvalidPayload."""
    await store.create(name=JOB)
    await refused(store, InvalidPayload, lambda: store.claim([JOB], **kwargs))


async def test_every_claim_bumps_the_fence(store, clock):
    """Each new claim of the same task carries a larger fence."""
    lease = await claimed(store, max_attempts=5)
    fences = [lease.fence]
    for _ in range(3):
        clock.advance(LEASE + 1)
        await store.recover_expired()
        [again] = await store.claim([JOB], worker=WORKER, lease_seconds=LEASE)
        fences.append(again.fence)
    assert fences == [1, 2, 3, 4]


# --- renew ------------------------------------------------------------------------------


async def test_renew_extends_the_lease_without_an_event(store, clock):
    """renew moves the expiry to now + lease; heartbeats add no history entry."""
    lease = await claimed(store)
    history = await store.history(lease.task_id)
    clock.advance(20)
    got = await store.renew(lease.task_id, fence=lease.fence, lease_seconds=LEASE)
    assert got.lease_expires_at == clock.now + LEASE
    assert got.updated_at == clock.now
    assert (got.fence, got.lease_owner) == (lease.fence, WORKER)
    assert await store.get(lease.task_id) == got
    assert await store.history(lease.task_id) == history


async def test_renewed_lease_is_not_recovered(store, clock):
    """A lease renewed in time is not expired by recover_expired."""
    lease = await claimed(store)
    clock.advance(LEASE - 1)
    await store.renew(lease.task_id, fence=lease.fence, lease_seconds=LEASE)
    clock.advance(LEASE - 1)
    assert await store.recover_expired() == []
    assert (await store.get(lease.task_id)).lease_owner == WORKER


async def test_renew_refuses_a_bad_lease(store):
    """renew with a non-positive lease raises InvalidPayload."""
    lease = await claimed(store)
    await refused(
        store,
        InvalidPayload,
        lambda: store.renew(lease.task_id, fence=lease.fence, lease_seconds=0),
    )


async def test_renew_after_the_lease_was_released_is_lost(store):
    """renew after request_input released the lease raises LeaseLost."""
    lease = await claimed(store)
    await store.request_input(lease.task_id, {"svc": ask()}, fence=lease.fence)
    error = await refused(
        store,
        LeaseLost,
        lambda: store.renew(lease.task_id, fence=lease.fence, lease_seconds=LEASE),
    )
    assert (error.task_id, error.fence, error.current_fence) == (
        lease.task_id,
        lease.fence,
        lease.fence,
    )


# --- fencing ----------------------------------------------------------------------------

STALE_WRITES = {
    "complete": lambda s, i, f: s.complete(i, {"ok": 1}, fence=f),
    "fail": lambda s, i, f: s.fail(i, ERROR, fence=f),
    "renew": lambda s, i, f: s.renew(i, fence=f, lease_seconds=LEASE),
    "retry": lambda s, i, f: s.retry(i, ERROR, fence=f, delay_seconds=0),
    "request_input": lambda s, i, f: s.request_input(i, {"k": ask()}, fence=f),
    "set_status_message": lambda s, i, f: s.set_status_message(i, "m", fence=f),
    "save_step": lambda s, i, f: s.save_step(i, "step", 1, fence=f),
}


@pytest.mark.parametrize("write", STALE_WRITES.values(), ids=STALE_WRITES.keys())
async def test_stale_attempts_writes_are_lost(store, clock, write):
    """After the task was recovered and claimed again, the old fence's writes raise LeaseLost."""
    old = await claimed(store, max_attempts=2)
    clock.advance(LEASE + 1)
    await store.recover_expired()
    [new] = await store.claim([JOB], worker="w2", lease_seconds=LEASE)
    error = await refused(store, LeaseLost, lambda: write(store, old.task_id, old.fence))
    assert (error.task_id, error.fence, error.current_fence) == (
        old.task_id,
        old.fence,
        new.fence,
    )
    assert str(old.fence) in str(error)
    assert str(new.fence) in str(error)


@pytest.mark.parametrize("write", STALE_WRITES.values(), ids=STALE_WRITES.keys())
async def test_fenced_write_to_an_unleased_task_is_lost(store, clock, write):
    """A fenced write to a task whose lease expired and was recovered raises LeaseLost."""
    old = await claimed(store, max_attempts=2)
    clock.advance(LEASE + 1)
    await store.recover_expired()
    await refused(store, LeaseLost, lambda: write(store, old.task_id, old.fence))


UNLEASED_WRITES = {
    "complete": lambda s, i: s.complete(i, {"ok": 1}),
    "fail": lambda s, i: s.fail(i, ERROR),
    "request_input": lambda s, i: s.request_input(i, {"k": ask()}, fence=None),
    "set_status_message": lambda s, i: s.set_status_message(i, "m"),
}


@pytest.mark.parametrize("write", UNLEASED_WRITES.values(), ids=UNLEASED_WRITES.keys())
async def test_unleased_writes_to_a_leased_task_are_refused(store, write):
    """Only cancel reaches a running task without its lease; others raise InvalidTransition."""
    lease = await claimed(store)
    error = await refused(store, InvalidTransition, lambda: write(store, lease.task_id))
    assert WORKER in str(error)
    assert error.status == "working"


async def test_lease_holder_completes_its_task(store):
    """The attempt holding the current fence may complete; the lease goes with it."""
    lease = await claimed(store)
    done = await store.complete(lease.task_id, {"ok": 1}, fence=lease.fence)
    assert (done.status, done.result, done.leased) == (Status.COMPLETED, {"ok": 1}, False)
    assert done.lease_expires_at is None


async def test_lease_holder_fails_its_task(store):
    """The attempt holding the current fence may fail the task (a protocol error)."""
    lease = await claimed(store)
    failed = await store.fail(lease.task_id, ERROR, fence=lease.fence)
    assert (failed.status, failed.error, failed.leased) == (Status.FAILED, ERROR, False)
    assert failed.closed_fence == lease.fence


# --- retry ------------------------------------------------------------------------------


async def test_retry_schedules_the_next_attempt(store, clock):
    """retry: attempt + 1, lease released, ready only after the delay."""
    lease = await claimed(store, max_attempts=3)
    got = await store.retry(lease.task_id, ERROR, fence=lease.fence, delay_seconds=10)
    assert got.status is Status.WORKING
    assert got.attempt == 2
    assert not got.leased
    assert got.ready_at == clock.now + 10
    assert got.fence == lease.fence
    event = (await store.history(lease.task_id))[-1]
    assert (event.from_status, event.to_status) == (Status.WORKING, Status.WORKING)
    assert "attempt 1/3 failed" in event.reason
    assert ERROR["message"] in event.reason
    assert event.actor == f"worker:{WORKER}"

    clock.advance(9)
    assert await store.claim([JOB], worker=WORKER, lease_seconds=LEASE) == []
    clock.advance(1)
    [again] = await store.claim([JOB], worker=WORKER, lease_seconds=LEASE)
    assert (again.task_id, again.attempt, again.fence) == (lease.task_id, 2, lease.fence + 1)


async def test_retry_on_the_last_attempt_dead_letters(store):
    """retry on the last attempt fails the task with a dead-letter error and says why."""
    lease = await claimed(store, max_attempts=2)
    again = await store.retry(lease.task_id, ERROR, fence=lease.fence, delay_seconds=0)
    [second] = await store.claim([JOB], worker=WORKER, lease_seconds=LEASE)
    dead = await store.retry(second.task_id, ERROR, fence=second.fence, delay_seconds=0)
    assert again.attempt == 2
    assert dead.status is Status.FAILED
    assert dead.attempt == 2
    assert not dead.leased
    assert dead.error is not None
    assert dead.error["code"] == ERROR["code"]
    assert dead.error["message"].startswith("dead letter after 2 attempt(s)")
    assert ERROR["message"] in dead.error["message"]
    event = (await store.history(lease.task_id))[-1]
    assert (event.from_status, event.to_status) == (Status.WORKING, Status.FAILED)
    assert "no attempts left" in event.reason


@pytest.mark.parametrize(
    ("error", "delay"),
    [({"message": "no code"}, 0), (ERROR, -1), (ERROR, float("nan"))],
    ids=["bad-error", "negative-delay", "nan-delay"],
)
async def test_retry_refuses_bad_arguments(store, error, delay):
    """retry with a malformed error or a bad delay raises InvalidPayload; nothing changes."""
    lease = await claimed(store, max_attempts=3)
    await refused(
        store,
        InvalidPayload,
        lambda: store.retry(lease.task_id, error, fence=lease.fence, delay_seconds=delay),
    )


# --- recover_expired --------------------------------------------------------------------


async def test_recover_expired_retries_an_expired_lease(store, clock):
    """An expired lease is recovered: attempt + 1, unleased, ready at once."""
    lease = await claimed(store, max_attempts=2)
    clock.advance(LEASE)
    assert await store.recover_expired() == [], "a lease is live up to its expiry"
    clock.advance(1)
    [got] = await store.recover_expired()
    assert got.task_id == lease.task_id
    assert (got.status, got.attempt, got.leased, got.ready_at) == (
        Status.WORKING,
        2,
        False,
        clock.now,
    )
    assert await store.get(lease.task_id) == got
    event = (await store.history(lease.task_id))[-1]
    assert event.actor == "recovery"
    assert "expired" in event.reason
    assert WORKER in event.reason
    [again] = await store.claim([JOB], worker="w2", lease_seconds=LEASE)
    assert again.task_id == lease.task_id


async def test_recover_expired_dead_letters_after_the_last_attempt(store, clock):
    """An expired lease on the last attempt fails the task with a dead-letter error."""
    lease = await claimed(store, max_attempts=1)
    clock.advance(LEASE + 5)
    [got] = await store.recover_expired()
    assert got.status is Status.FAILED
    assert got.error is not None
    assert got.error["code"] == INTERNAL_ERROR
    assert got.error["message"].startswith("dead letter after 1 attempt(s)")
    assert "stopped renewing its lease" in got.error["message"]
    assert lease.lease_owner is not None
    assert lease.lease_owner not in got.error["message"]  # clients see no worker id...
    last = (await store.history(lease.task_id))[-1].reason
    assert "no attempts left" in last
    assert f"lease of {lease.lease_owner} expired" in last  # ...operators do


async def test_recover_expired_twice_changes_nothing_the_second_time(store, clock):
    """recover_expired is idempotent: the second run finds nothing to do."""
    await claimed(store, max_attempts=3)
    await claimed(store, name="other", max_attempts=1)
    clock.advance(LEASE + 1)
    assert len(await store.recover_expired()) == 2
    before = await everything(store)
    assert await store.recover_expired() == []
    assert await everything(store) == before


async def test_recover_expired_honours_its_limit(store, clock):
    """recover_expired handles at most ``limit`` leases per call."""
    for _ in range(3):
        await store.create(name=JOB, max_attempts=2)
    await store.claim([JOB], worker=WORKER, lease_seconds=LEASE, limit=3)
    clock.advance(LEASE + 1)
    assert len(await store.recover_expired(limit=2)) == 2
    assert len(await store.recover_expired(limit=2)) == 1


async def test_recover_expired_leaves_live_and_unleased_tasks_alone(store, clock):
    """Only expired leases are recovered; waiting, ready and fresh leases are untouched."""
    await store.create(name=JOB, input_requests={"svc": ask()})
    await store.create(name="idle")
    clock.advance(LEASE * 10)
    await claimed(store)
    before = await everything(store)
    assert await store.recover_expired() == []
    assert await everything(store) == before


# --- steps ------------------------------------------------------------------------------


async def test_steps_are_checkpointed_and_the_first_value_stands(store):
    """save_step records each step once; saving it again keeps the first value."""
    lease = await claimed(store)
    assert await store.steps(lease.task_id) == {}
    history = await store.history(lease.task_id)
    await store.save_step(lease.task_id, "load-incident", {"id": "INC-1"}, fence=lease.fence)
    await store.save_step(lease.task_id, "deploys", [1, 2], fence=lease.fence)
    await store.save_step(lease.task_id, "load-incident", {"id": "other"}, fence=lease.fence)
    assert await store.steps(lease.task_id) == {
        "load-incident": {"id": "INC-1"},
        "deploys": [1, 2],
    }
    assert await store.history(lease.task_id) == history, "steps are not transitions"


async def test_steps_survive_a_new_attempt(store, clock):
    """Steps of an earlier attempt stay visible to the next one; it keeps the first value."""
    old = await claimed(store, max_attempts=2)
    await store.save_step(old.task_id, "s", "first", fence=old.fence)
    clock.advance(LEASE + 1)
    await store.recover_expired()
    [new] = await store.claim([JOB], worker=WORKER, lease_seconds=LEASE)
    await store.save_step(new.task_id, "s", "second", fence=new.fence)
    assert await store.steps(new.task_id) == {"s": "first"}


async def test_save_step_needs_a_lease(store):
    """save_step on an unleased task raises LeaseLost."""
    task = await store.create(name=JOB)
    await refused(store, LeaseLost, lambda: store.save_step(task.task_id, "s", 1, fence=0))


@pytest.mark.parametrize(
    ("step", "value"),
    [("", 1), ("s", {1, 2}), ("s", float("nan")), ("s", b"x")],
    ids=["empty-name", "set", "nan", "bytes"],
)
async def test_save_step_refuses_bad_steps(store, step, value):
    """A step without a name or with a non-JSON value raises InvalidPayload."""
    lease = await claimed(store)
    await refused(
        store,
        InvalidPayload,
        lambda: store.save_step(lease.task_id, step, value, fence=lease.fence),
    )


async def test_steps_are_private_copies(store):
    """Mutating a saved value or a returned step never changes the stored step."""
    lease = await claimed(store)
    value = {"rows": [1]}
    await store.save_step(lease.task_id, "s", value, fence=lease.fence)
    value["rows"].append(2)
    got = await store.steps(lease.task_id)
    got["s"]["rows"].append(3)
    assert await store.steps(lease.task_id) == {"s": {"rows": [1]}}


# --- status messages --------------------------------------------------------------------


async def test_status_message_is_set_and_cleared_without_events(store, clock):
    """set_status_message updates the snapshot (and updated_at) but not the history."""
    task = await store.create()
    history = await store.history(task.task_id)
    clock.advance(3)
    got = await store.set_status_message(task.task_id, "correlating deploys")
    assert (got.status_message, got.updated_at) == ("correlating deploys", clock.now)
    assert await store.get(task.task_id) == got
    cleared = await store.set_status_message(task.task_id, None)
    assert cleared.status_message is None
    assert await store.history(task.task_id) == history


async def test_lease_holder_sets_the_status_message(store):
    """The attempt holding the lease may set the status message."""
    lease = await claimed(store)
    got = await store.set_status_message(lease.task_id, "step 2/5", fence=lease.fence)
    assert got.status_message == "step 2/5"
    assert got.lease_owner == WORKER


async def test_status_message_too_long_is_refused(make_store):
    """A status message over the limit raises InvalidPayload; nothing changes."""
    store = make_store(limits=Limits(max_message_chars=10))
    task = await store.create()
    await store.set_status_message(task.task_id, "x" * 10)
    await refused(store, InvalidPayload, lambda: store.set_status_message(task.task_id, "x" * 11))


async def test_status_message_must_be_text(store):
    """A status message that is not a string raises InvalidPayload."""
    task = await store.create()
    await refused(store, InvalidPayload, lambda: store.set_status_message(task.task_id, 42))


async def test_terminal_task_refuses_a_status_message(store):
    """A finished task refuses a status message with TaskAlreadyTerminal."""
    task = await store.create()
    await store.complete(task.task_id, 1)
    await refused(
        store, TaskAlreadyTerminal, lambda: store.set_status_message(task.task_id, "late")
    )
