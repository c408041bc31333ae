"""Contract: complete, fail, cancel, and the uniform answer of a terminal task."""

from __future__ import annotations

from typing import Any

import pytest

from keel import (
    InvalidPayload,
    InvalidTransition,
    Status,
    TaskAlreadyTerminal,
)

from .support import ERROR, JOB, LEASE, WORKER, ask, claimed, everything, refused

pytestmark = pytest.mark.anyio


# --- complete ---------------------------------------------------------------------------


async def test_complete_stores_the_result(store, clock):
    """complete: working -> completed with the result, one history entry."""
    task = await store.create()
    clock.advance(4)
    done = await store.complete(task.task_id, {"summary": "deploy 42", "citations": [1, 2]})
    assert done.status is Status.COMPLETED
    assert done.result == {"summary": "deploy 42", "citations": [1, 2]}
    assert done.error is None
    assert done.updated_at == clock.now
    assert done.closed_fence is None
    assert await store.get(task.task_id) == done
    event = (await store.history(task.task_id))[-1]
    assert (event.from_status, event.to_status) == (Status.WORKING, Status.COMPLETED)
    assert (event.actor, event.at) == ("client", clock.now)


async def test_complete_accepts_a_domain_error_result(store):
    """A tool's domain error is a completed result with isError, not a failure."""
    task = await store.create()
    result = {"content": [{"type": "text", "text": "no such incident"}], "isError": True}
    done = await store.complete(task.task_id, result)
    assert (done.status, done.result, done.error) == (Status.COMPLETED, result, None)


@pytest.mark.parametrize("result", [None, 0, "text", [1, "a"], {"a": None}])
async def test_complete_accepts_any_json_result(store, result):
    """Any JSON value is a result, including null and scalars."""
    task = await store.create()
    done = await store.complete(task.task_id, result)
    assert (await store.get(task.task_id)).result == done.result == result


async def test_complete_while_waiting_for_input_is_refused(store):
    """A task waiting for input cannot complete: InvalidTransition (not terminal), unchanged."""
    task = await store.create(input_requests={"svc": ask()})
    error = await refused(store, InvalidTransition, lambda: store.complete(task.task_id, 1))
    assert "input_required" in str(error)


async def test_complete_result_is_a_private_copy(store):
    """Mutating the result after completing, or the returned one, never changes the store."""
    task = await store.create()
    result: dict[str, Any] = {"items": [1]}
    done = await store.complete(task.task_id, result)
    result["items"].append(2)
    done.result["items"].append(3)
    assert (await store.get(task.task_id)).result == {"items": [1]}


@pytest.mark.parametrize("value", [{1}, float("nan"), b"x"], ids=["set", "nan", "bytes"])
async def test_non_json_result_is_refused(store, value):
    """A result JSON cannot hold raises InvalidPayload and changes nothing."""
    task = await store.create()
    await refused(store, InvalidPayload, lambda: store.complete(task.task_id, {"v": value}))


# --- fail -------------------------------------------------------------------------------


async def test_fail_stores_a_json_rpc_error(store, clock):
    """fail: working -> failed with the {code, message, data} error stored as given."""
    task = await store.create()
    error = {"code": -32001, "message": "upstream timed out", "data": {"after": 30}}
    failed = await store.fail(task.task_id, error)
    assert failed.status is Status.FAILED
    assert failed.error == error
    assert failed.result is None
    assert await store.get(task.task_id) == failed
    event = (await store.history(task.task_id))[-1]
    assert (event.from_status, event.to_status) == (Status.WORKING, Status.FAILED)
    assert "upstream timed out" in event.reason


async def test_fail_a_task_waiting_for_input(store):
    """A task waiting for input may fail."""
    task = await store.create(input_requests={"svc": ask()})
    failed = await store.fail(task.task_id, ERROR)
    assert (failed.status, failed.error) == (Status.FAILED, ERROR)


@pytest.mark.parametrize(
    "error",
    [
        pytest.param("boom", id="string"),
        pytest.param({"message": "no code"}, id="no-code"),
        pytest.param({"code": "1", "message": "m"}, id="code-str"),
        pytest.param({"code": True, "message": "m"}, id="code-bool"),
        pytest.param({"code": 1.5, "message": "m"}, id="code-float"),
        pytest.param({"code": 1}, id="no-message"),
        pytest.param({"code": 1, "message": ""}, id="empty-message"),
        pytest.param({"code": 1, "message": 2}, id="message-int"),
        pytest.param({"code": 1, "message": "m", "extra": 1}, id="extra-field"),
        pytest.param({"code": 1, "message": "m", "data": {1, 2}}, id="data-not-json"),
    ],
)
async def test_fail_with_a_malformed_error_is_refused(store, error):
    """fail with anything but {code: int, message: str, data?} raises InvalidPayload."""
    task = await store.create()
    await refused(store, InvalidPayload, lambda: store.fail(task.task_id, error))


# --- cancel -----------------------------------------------------------------------------


@pytest.mark.parametrize("waiting", [False, True], ids=["working", "input_required"])
async def test_cancel_a_live_task(store, clock, waiting):
    """cancel: a working or waiting task becomes cancelled, and says why."""
    task = await store.create(input_requests={"svc": ask()} if waiting else None)
    clock.advance(1)
    got = await store.cancel(task.task_id, reason="user gave up", actor="cli")
    assert got.status is Status.CANCELLED
    assert got.updated_at == clock.now
    assert "user gave up" in (got.status_message or "")
    event = (await store.history(task.task_id))[-1]
    assert (event.from_status, event.to_status) == (task.status, Status.CANCELLED)
    assert event.actor == "cli"
    assert "user gave up" in event.reason


async def test_cancel_reaches_a_leased_task(store):
    """An unleased cancel reaches a running task and drops its lease."""
    lease = await claimed(store)
    got = await store.cancel(lease.task_id)
    assert got.status is Status.CANCELLED
    assert not got.leased
    assert got.lease_expires_at is None


# --- terminal is absorbing, and the answer is uniform ------------------------------------

ENDINGS = {
    "completed": lambda s, i: s.complete(i, {"summary": "first"}),
    "failed": lambda s, i: s.fail(i, ERROR),
    "cancelled": lambda s, i: s.cancel(i),
}

# Writes that are never an exact repeat of any ending above.
WRITES = {
    "complete": lambda s, i: s.complete(i, {"summary": "second"}),
    "complete-leased": lambda s, i: s.complete(i, {"summary": "first"}, fence=1),
    "fail": lambda s, i: s.fail(i, {"code": 1, "message": "other"}),
    "cancel": lambda s, i: s.cancel(i),
    "provide_input": lambda s, i: s.provide_input(i, {"svc": {"service": "x"}}),
    "request_input": lambda s, i: s.request_input(i, {"new": ask()}, fence=None),
    "request_input-leased": lambda s, i: s.request_input(i, {"new": ask()}, fence=1),
    "renew": lambda s, i: s.renew(i, fence=1, lease_seconds=LEASE),
    "set_status_message": lambda s, i: s.set_status_message(i, "still here"),
    "set_status_message-leased": lambda s, i: s.set_status_message(i, "x", fence=1),
    "save_step": lambda s, i: s.save_step(i, "step", {"v": 1}, fence=1),
    "retry": lambda s, i: s.retry(i, ERROR, fence=1, delay_seconds=0),
}

CASES = [
    pytest.param(ending, write, id=f"{ending}-then-{write}")
    for ending in ENDINGS
    for write in WRITES
    if (ending, write) != ("cancelled", "cancel")  # the exact repeat: tested below
]


@pytest.mark.parametrize(("ending", "write"), CASES)
async def test_every_write_to_a_terminal_task_raises_task_already_terminal(
    store, clock, ending, write
):
    """Any write to a finished task raises TaskAlreadyTerminal with the stored snapshot."""
    task = await store.create(input_requests={"svc": ask()})
    if ending == "completed":
        await store.provide_input(task.task_id, {"svc": {"service": "payments"}})
    finished = await ENDINGS[ending](store, task.task_id)
    clock.advance(10)
    error = await refused(store, TaskAlreadyTerminal, lambda: WRITES[write](store, task.task_id))
    assert isinstance(error, InvalidTransition)
    assert error.task == finished == await store.get(task.task_id)
    assert error.status == ending
    assert f"already {ending}" in str(error)
    assert task.task_id in str(error)


async def test_exact_repeat_of_complete_returns_the_stored_snapshot(store, clock):
    """Completing again with the same result returns the snapshot: no write, no event."""
    task = await store.create()
    done = await store.complete(task.task_id, {"a": 1, "b": [1, 2]})
    clock.advance(10)
    before = await everything(store)
    again = await store.complete(task.task_id, {"b": [1, 2], "a": 1})
    assert again == done
    assert again.updated_at == done.updated_at
    assert await everything(store) == before


async def test_complete_twice_with_another_result_keeps_the_first(store):
    """A second complete with another result raises; the first result stands (8C)."""
    task = await store.create()
    await store.complete(task.task_id, {"summary": "no active incident"})
    error = await refused(
        store, TaskAlreadyTerminal, lambda: store.complete(task.task_id, {"summary": "rewritten!"})
    )
    assert error.task.result == {"summary": "no active incident"}


async def test_exact_repeat_of_fail_returns_the_stored_snapshot(store, clock):
    """Failing again with the same error returns the snapshot: no write, no event."""
    task = await store.create()
    failed = await store.fail(task.task_id, ERROR)
    clock.advance(10)
    before = await everything(store)
    assert await store.fail(task.task_id, dict(ERROR)) == failed
    assert await everything(store) == before


async def test_cancel_after_cancel_returns_the_stored_snapshot(store, clock):
    """Cancelling a cancelled task returns it unchanged, whatever the reason given."""
    task = await store.create()
    cancelled = await store.cancel(task.task_id, reason="first")
    clock.advance(10)
    before = await everything(store)
    assert await store.cancel(task.task_id) == cancelled
    assert await store.cancel(task.task_id, reason="second") == cancelled
    assert await everything(store) == before


async def test_cancel_after_complete_is_refused_and_keeps_completed(store):
    """cancel after completed raises TaskAlreadyTerminal; the task stays completed (8D)."""
    task = await store.create()
    done = await store.complete(task.task_id, {"ok": True})
    error = await refused(store, TaskAlreadyTerminal, lambda: store.cancel(task.task_id))
    assert error.task == done
    assert (await store.get(task.task_id)).status is Status.COMPLETED


async def test_fenced_exact_repeat_returns_the_snapshot(store, clock):
    """A worker's completion repeated with the same fence returns the stored snapshot."""
    lease = await claimed(store)
    done = await store.complete(lease.task_id, {"ok": 1}, fence=lease.fence)
    assert done.closed_fence == lease.fence
    assert (await store.history(lease.task_id))[-1].actor == f"worker:{WORKER}"
    clock.advance(10)
    before = await everything(store)
    assert await store.complete(lease.task_id, {"ok": 1}, fence=lease.fence) == done
    assert await everything(store) == before


@pytest.mark.parametrize("fence", [None, "other"], ids=["unleased", "other-fence"])
async def test_repeat_from_another_writer_is_not_a_repeat(store, fence):
    """The same result from another writer (unleased, or another fence) is refused."""
    lease = await claimed(store)
    await store.complete(lease.task_id, {"ok": 1}, fence=lease.fence)
    other = lease.fence + 1 if fence == "other" else None
    await refused(
        store,
        TaskAlreadyTerminal,
        lambda: store.complete(lease.task_id, {"ok": 1}, fence=other),
    )


async def test_unleased_repeat_of_fenced_fail_is_refused(store):
    """A worker's failure repeated without its lease is refused."""
    lease = await claimed(store)
    await store.fail(lease.task_id, ERROR, fence=lease.fence)
    await refused(store, TaskAlreadyTerminal, lambda: store.fail(lease.task_id, ERROR))


async def test_complete_then_fail_and_fail_then_complete_are_refused(store):
    """A different outcome after the end is refused both ways."""
    a = await store.create()
    await store.complete(a.task_id, 1)
    await refused(store, TaskAlreadyTerminal, lambda: store.fail(a.task_id, ERROR))
    b = await store.create()
    await store.fail(b.task_id, ERROR)
    await refused(store, TaskAlreadyTerminal, lambda: store.complete(b.task_id, 1))


async def test_exact_repeat_of_a_dead_lettering_retry_returns_the_snapshot(store, clock):
    """The retry that ended a task, repeated exactly, is an exact repeat like complete/fail."""
    lease = await claimed(store, max_attempts=1)
    dead = await store.retry(lease.task_id, ERROR, fence=lease.fence, delay_seconds=0)
    assert dead.status is Status.FAILED
    clock.advance(10)
    before = await everything(store)
    assert await store.retry(lease.task_id, ERROR, fence=lease.fence, delay_seconds=0) == dead
    assert await everything(store) == before


INEXACT_RETRIES = {
    "other-error": lambda s, i, f: s.retry(
        i, {"code": 1, "message": "x"}, fence=f, delay_seconds=0
    ),
    "other-fence": lambda s, i, f: s.retry(i, ERROR, fence=f + 1, delay_seconds=0),
}


@pytest.mark.parametrize("repeat", INEXACT_RETRIES.values(), ids=INEXACT_RETRIES.keys())
async def test_inexact_repeat_of_a_dead_lettering_retry_is_refused(store, repeat):
    """A retry after the dead letter with another error or fence raises TaskAlreadyTerminal."""
    lease = await claimed(store, max_attempts=1)
    await store.retry(lease.task_id, ERROR, fence=lease.fence, delay_seconds=0)
    await refused(store, TaskAlreadyTerminal, lambda: repeat(store, lease.task_id, lease.fence))


async def test_cancelled_running_task_refuses_the_attempts_later_writes(store):
    """After cancel, the running attempt's fenced writes all raise TaskAlreadyTerminal."""
    lease = await claimed(store)
    cancelled = await store.cancel(lease.task_id, reason="stop")
    f = lease.fence
    writes = [
        lambda: store.complete(lease.task_id, 1, fence=f),
        lambda: store.fail(lease.task_id, ERROR, fence=f),
        lambda: store.renew(lease.task_id, fence=f, lease_seconds=LEASE),
        lambda: store.save_step(lease.task_id, "s", 1, fence=f),
        lambda: store.set_status_message(lease.task_id, "m", fence=f),
        lambda: store.request_input(lease.task_id, {"k": ask()}, fence=f),
        lambda: store.retry(lease.task_id, ERROR, fence=f, delay_seconds=0),
    ]
    for write in writes:
        error = await refused(store, TaskAlreadyTerminal, write)
        assert error.task == cancelled
    assert await store.claim([JOB], worker=WORKER, lease_seconds=LEASE) == []
