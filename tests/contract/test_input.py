"""Contract: input requests and answers (provide_input, request_input), on every adapter."""

from __future__ import annotations

import math

import pytest

from keel import (
    InputRejected,
    InvalidPayload,
    InvalidTransition,
    LeaseLost,
    Status,
)

from .support import JOB, LEASE, WORKER, ask, claimed, everything, refused

pytestmark = pytest.mark.anyio

NESTED_SCHEMA = {
    "type": "object",
    "properties": {"hosts": {"type": "array", "items": {"type": "string"}}},
}


# --- provide_input ----------------------------------------------------------------------


async def test_answer_resumes_the_task(store, clock):
    """A valid answer to the only request moves input_required -> working and is stored."""
    task = await store.create(input_requests={"svc": ask()})
    clock.advance(7)
    got = await store.provide_input(task.task_id, {"svc": {"service": "payments"}})
    assert got.status is Status.WORKING
    assert got.input_responses == {"svc": {"service": "payments"}}
    assert got.pending_input == {}
    assert got.status_message is None
    assert got.updated_at == got.ready_at == clock.now
    assert await store.get(task.task_id) == got
    event = (await store.history(task.task_id))[-1]
    assert (event.from_status, event.to_status) == (Status.INPUT_REQUIRED, Status.WORKING)
    assert event.actor == "client"
    assert "svc" in event.reason


async def test_answer_records_the_given_actor(store):
    """provide_input records who answered in the history."""
    task = await store.create(input_requests={"svc": ask()})
    await store.provide_input(task.task_id, {"svc": {"service": "x"}}, actor="cli")
    assert (await store.history(task.task_id))[-1].actor == "cli"


@pytest.mark.parametrize(
    ("answer", "path"),
    [
        pytest.param({}, "service", id="missing-required"),
        pytest.param({"service": 3}, "service", id="wrong-type"),
        pytest.param("payments", "", id="not-an-object"),
    ],
)
async def test_invalid_answer_is_rejected_naming_the_field(store, answer, path):
    """An answer violating its schema raises InputRejected naming the field; nothing changes."""
    task = await store.create(input_requests={"svc": ask()})
    error = await refused(
        store, InputRejected, lambda: store.provide_input(task.task_id, {"svc": answer})
    )
    assert (error.task_id, error.key, error.path) == (task.task_id, "svc", path)
    if path:
        assert repr(path) in str(error)
    assert (await store.get(task.task_id)).status is Status.INPUT_REQUIRED


async def test_invalid_nested_answer_names_its_path(store):
    """A violation deep in the answer is located with a slash path (hosts/1)."""
    task = await store.create(input_requests={"h": ask(schema=NESTED_SCHEMA)})
    error = await refused(
        store,
        InputRejected,
        lambda: store.provide_input(task.task_id, {"h": {"hosts": ["a", 2]}}),
    )
    assert error.path == "hosts/1"


async def test_one_invalid_answer_rejects_all_answers_of_the_call(store):
    """If any answer is invalid, none of the answers in the call is accepted."""
    task = await store.create(input_requests={"a": ask(), "b": ask()})
    await refused(
        store,
        InputRejected,
        lambda: store.provide_input(task.task_id, {"a": {"service": "ok"}, "b": {"service": 1}}),
    )


async def test_partial_answers_keep_the_task_waiting(store):
    """Answering some of several requests keeps input_required until the last arrives."""
    task = await store.create(input_requests={"a": ask("A?"), "b": ask("B?")})
    partial = await store.provide_input(task.task_id, {"a": {"service": "x"}})
    assert partial.status is Status.INPUT_REQUIRED
    assert set(partial.pending_input) == {"b"}
    assert partial.input_responses == {"a": {"service": "x"}}
    history = await store.history(task.task_id)
    assert len(history) == 2
    assert (history[-1].from_status, history[-1].to_status) == (
        Status.INPUT_REQUIRED,
        Status.INPUT_REQUIRED,
    )
    assert "'b'" in history[-1].reason
    done = await store.provide_input(task.task_id, {"b": {"service": "y"}})
    assert done.status is Status.WORKING
    assert done.input_responses == {"a": {"service": "x"}, "b": {"service": "y"}}


async def test_unknown_and_answered_keys_are_ignored(store, clock):
    """Unknown keys and keys answered already change nothing: the first answer stands."""
    task = await store.create(input_requests={"a": ask(), "b": ask()})
    await store.provide_input(task.task_id, {"a": {"service": "first"}})
    clock.advance(3)
    before = await everything(store)
    got = await store.provide_input(
        task.task_id, {"a": {"service": "second"}, "nope": 1, "also-nope": {"service": 2}}
    )
    assert got == (await store.get(task.task_id))
    assert await everything(store) == before
    assert got.input_responses == {"a": {"service": "first"}}


async def test_already_answered_invalid_value_is_ignored_not_rejected(store):
    """An answered key is ignored before validation, so its new value is never checked."""
    task = await store.create(input_requests={"a": ask(), "b": ask()})
    await store.provide_input(task.task_id, {"a": {"service": "x"}})
    got = await store.provide_input(task.task_id, {"a": "not even an object"})
    assert got.input_responses == {"a": {"service": "x"}}


async def test_input_to_a_working_task_is_refused_naming_its_status(store):
    """provide_input on a working task raises InvalidTransition naming "working" (8B)."""
    task = await store.create()
    error = await refused(
        store, InvalidTransition, lambda: store.provide_input(task.task_id, {"svc": 1})
    )
    assert "task is not waiting for input: working" in str(error)
    assert error.status == "working"
    assert error.task == task


async def test_input_must_be_an_object_keyed_by_request(store):
    """Responses that are not a mapping raise InvalidPayload and change nothing."""
    task = await store.create(input_requests={"svc": ask()})
    await refused(store, InvalidPayload, lambda: store.provide_input(task.task_id, ["svc"]))


@pytest.mark.parametrize("value", [{1, 2}, math.nan, b"bytes"], ids=["set", "nan", "bytes"])
async def test_non_json_input_is_refused(store, value):
    """An answer JSON cannot hold raises InvalidPayload and changes nothing."""
    task = await store.create(input_requests={"any": ask(schema={})})
    await refused(
        store, InvalidPayload, lambda: store.provide_input(task.task_id, {"any": {"v": value}})
    )


async def test_answer_is_a_private_copy(store):
    """Mutating the answer after it was given never changes the stored one."""
    task = await store.create(input_requests={"any": ask(schema={})})
    answer = {"hosts": ["a"]}
    got = await store.provide_input(task.task_id, {"any": answer})
    answer["hosts"].append("b")
    got.input_responses["any"]["hosts"].append("c")
    assert (await store.get(task.task_id)).input_responses == {"any": {"hosts": ["a"]}}


# --- request_input ----------------------------------------------------------------------


async def test_worker_request_parks_the_task_and_releases_the_lease(store, clock):
    """request_input from the lease holder: input_required, no lease, fence unchanged."""
    lease = await claimed(store)
    clock.advance(2)
    got = await store.request_input(lease.task_id, {"svc": ask("Service?")}, fence=lease.fence)
    assert got.status is Status.INPUT_REQUIRED
    assert not got.leased
    assert got.lease_expires_at is None
    assert got.fence == lease.fence
    assert got.attempt == lease.attempt
    assert got.status_message == "Service?"
    assert got.updated_at == clock.now
    assert await store.get(lease.task_id) == got
    event = (await store.history(lease.task_id))[-1]
    assert (event.from_status, event.to_status) == (Status.WORKING, Status.INPUT_REQUIRED)
    assert event.actor == f"worker:{WORKER}"


async def test_unleased_request_input_on_an_unleased_task(store):
    """A client may park an unleased working task for input."""
    task = await store.create()
    got = await store.request_input(task.task_id, {"svc": ask()}, fence=None)
    assert got.status is Status.INPUT_REQUIRED
    assert (await store.history(task.task_id))[-1].actor == "client"


async def test_input_arriving_makes_the_task_claimable_again(store):
    """After the answer arrives the task is ready again; the next claim bumps the fence."""
    lease = await claimed(store)
    await store.request_input(lease.task_id, {"svc": ask()}, fence=lease.fence)
    assert await store.claim([JOB], worker=WORKER, lease_seconds=LEASE) == []
    await store.provide_input(lease.task_id, {"svc": {"service": "payments"}})
    [again] = await store.claim([JOB], worker="w2", lease_seconds=LEASE)
    assert again.task_id == lease.task_id
    assert again.fence == lease.fence + 1
    assert again.attempt == lease.attempt, "waiting for input is not a failed attempt"
    assert again.input_responses == {"svc": {"service": "payments"}}
    assert again.lease_owner == "w2"


async def test_input_keys_are_unique_over_the_tasks_lifetime(store):
    """A key used once (even answered) cannot be requested again; nothing changes."""
    lease = await claimed(store)
    await store.request_input(lease.task_id, {"svc": ask()}, fence=lease.fence)
    await store.provide_input(lease.task_id, {"svc": {"service": "x"}})
    [again] = await store.claim([JOB], worker=WORKER, lease_seconds=LEASE)
    error = await refused(
        store,
        InvalidPayload,
        lambda: store.request_input(again.task_id, {"svc": ask()}, fence=again.fence),
    )
    assert "svc" in str(error)


async def test_initial_request_keys_count_as_used(store):
    """A key from creation cannot be requested again later."""
    task = await store.create(name=JOB, input_requests={"svc": ask()})
    await store.provide_input(task.task_id, {"svc": {"service": "x"}})
    [lease] = await store.claim([JOB], worker=WORKER, lease_seconds=LEASE)
    await refused(
        store,
        InvalidPayload,
        lambda: store.request_input(task.task_id, {"svc": ask()}, fence=lease.fence),
    )


async def test_several_requests_at_once(store):
    """request_input may ask several keys at once; all must be answered to resume."""
    lease = await claimed(store)
    got = await store.request_input(lease.task_id, {"a": ask(), "b": ask()}, fence=lease.fence)
    assert set(got.pending_input) == {"a", "b"}
    assert (await store.provide_input(lease.task_id, {"b": {"service": "y"}})).status is (
        Status.INPUT_REQUIRED
    )


@pytest.mark.parametrize(
    "requests",
    [
        pytest.param({}, id="none"),
        pytest.param({"k": ask(schema={"type": 5})}, id="bad-schema"),
        pytest.param({"k": {"type": "object"}}, id="not-input-request"),
    ],
)
async def test_bad_input_requests_are_refused(store, requests):
    """No requests, a bad schema, or a non-InputRequest raise InvalidPayload; nothing changes."""
    lease = await claimed(store)
    await refused(
        store,
        InvalidPayload,
        lambda: store.request_input(lease.task_id, requests, fence=lease.fence),
    )


async def test_request_input_while_waiting_is_refused(store):
    """A task already waiting for input cannot request more (it holds no lease)."""
    task = await store.create(input_requests={"a": ask()})
    error = await refused(
        store,
        InvalidTransition,
        lambda: store.request_input(task.task_id, {"b": ask()}, fence=None),
    )
    assert "input_required" in str(error)


async def test_unleased_request_input_on_a_leased_task_is_refused(store):
    """A client cannot park a task a worker is running."""
    lease = await claimed(store)
    await refused(
        store,
        InvalidTransition,
        lambda: store.request_input(lease.task_id, {"b": ask()}, fence=None),
    )


async def test_request_input_with_a_stale_fence_is_refused(store):
    """A stale attempt's request_input raises LeaseLost and changes nothing."""
    lease = await claimed(store)
    await refused(
        store,
        LeaseLost,
        lambda: store.request_input(lease.task_id, {"b": ask()}, fence=lease.fence - 1),
    )
