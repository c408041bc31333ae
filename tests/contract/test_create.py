"""Contract: create, get, owner scoping and idempotency keys, on every adapter."""

from __future__ import annotations

import math
from typing import Any

import pytest

from keel import (
    IdempotencyConflict,
    InputRejected,
    InputRequest,
    InvalidPayload,
    Status,
    TaskNotFound,
)

from .support import ERROR, SERVICE_SCHEMA, ask, everything, refused

pytestmark = pytest.mark.anyio


# --- create and get ---------------------------------------------------------------------


async def test_create_without_requests_starts_working(store, clock):
    """A task created without input requests is working, unleased, at attempt 1."""
    task = await store.create(name="job", arguments={"incident": "INC-1"})
    assert task.status is Status.WORKING
    assert task.name == "job"
    assert task.arguments == {"incident": "INC-1"}
    assert task.owner == ""
    assert task.created_at == task.updated_at == clock.now
    assert (task.attempt, task.max_attempts, task.fence) == (1, 1, 0)
    assert not task.leased
    assert task.lease_expires_at is None
    assert task.input_requests == {}
    assert task.result is None
    assert task.error is None
    assert task.idempotency_key is None


async def test_create_with_input_requests_starts_input_required(store):
    """A task created with input requests starts input_required and stores what it asks."""
    task = await store.create(input_requests={"svc": ask("Which service?")})
    assert task.status is Status.INPUT_REQUIRED
    assert task.input_requests == {"svc": InputRequest("Which service?", SERVICE_SCHEMA)}
    assert set(task.pending_input) == {"svc"}
    assert task.input_responses == {}
    assert task.status_message == "Which service?"


async def test_create_records_a_creation_event(store, clock):
    """The first history entry is the creation: from nothing to the initial status."""
    task = await store.create(input_requests={"svc": ask()}, actor="cli")
    [event] = await store.history(task.task_id)
    assert event.task_id == task.task_id
    assert event.from_status is None
    assert event.to_status is Status.INPUT_REQUIRED
    assert event.at == clock.now
    assert event.actor == "cli"
    assert "created" in event.reason
    assert "svc" in event.reason


async def test_create_keeps_options(store, clock):
    """Name, owner, arguments, ttl and max_attempts are stored as given."""
    task = await store.create(
        name="diagnose", arguments={"n": [1, 2]}, owner="alice", ttl=60, max_attempts=3
    )
    got = await store.get(task.task_id)
    assert got == task
    assert (got.name, got.owner, got.arguments) == ("diagnose", "alice", {"n": [1, 2]})
    assert (got.ttl, got.max_attempts) == (60.0, 3)
    assert got.expires_at == clock.now + 60


async def test_create_without_arguments_stores_an_empty_object(store):
    """Arguments default to the empty JSON object, never None."""
    task = await store.create()
    assert (await store.get(task.task_id)).arguments == {}


async def test_task_ids_are_unguessable_and_distinct(store):
    """Task ids are distinct and carry at least 128 bits (22+ URL-safe characters)."""
    ids = {(await store.create()).task_id for _ in range(20)}
    assert len(ids) == 20
    assert all(len(i) >= 22 for i in ids)


async def test_get_returns_the_stored_snapshot(store):
    """get() returns a snapshot equal to the one create() returned."""
    task = await store.create(name="job", input_requests={"svc": ask()})
    assert await store.get(task.task_id) == task


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param({"arguments": ["not", "an", "object"]}, id="arguments-list"),
        pytest.param({"arguments": "text"}, id="arguments-str"),
        pytest.param({"max_attempts": 0}, id="max-attempts-0"),
        pytest.param({"max_attempts": True}, id="max-attempts-bool"),
        pytest.param({"ttl": -1}, id="ttl-negative"),
        pytest.param({"ttl": math.inf}, id="ttl-inf"),
        pytest.param({"name": ""}, id="name-empty"),
        pytest.param({"idempotency_key": ""}, id="key-empty"),
        pytest.param({"owner": 7}, id="owner-not-str"),
        pytest.param({"input_requests": {"svc": ask(schema={"type": "nope"})}}, id="bad-schema"),
        pytest.param({"input_requests": {"svc": {"type": "object"}}}, id="not-input-request"),
        pytest.param({"input_requests": {"": ask()}}, id="empty-input-key"),
    ],
)
async def test_create_refuses_bad_requests_and_creates_nothing(store, bad: dict[str, Any]):
    """A malformed create raises InvalidPayload and creates nothing."""
    await refused(store, InvalidPayload, lambda: store.create(**bad))
    assert await store.list() == []


# --- unknown ids ------------------------------------------------------------------------

UNKNOWN = "no-such-task"

EVERY_CALL_ON_AN_ID = {
    "get": lambda s: s.get(UNKNOWN),
    "history": lambda s: s.history(UNKNOWN),
    "steps": lambda s: s.steps(UNKNOWN),
    "provide_input": lambda s: s.provide_input(UNKNOWN, {"svc": {"service": "x"}}),
    "request_input": lambda s: s.request_input(UNKNOWN, {"k": ask()}, fence=None),
    "complete": lambda s: s.complete(UNKNOWN, {"ok": True}),
    "fail": lambda s: s.fail(UNKNOWN, ERROR),
    "cancel": lambda s: s.cancel(UNKNOWN),
    "renew": lambda s: s.renew(UNKNOWN, fence=1, lease_seconds=30),
    "retry": lambda s: s.retry(UNKNOWN, ERROR, fence=1, delay_seconds=0),
    "set_status_message": lambda s: s.set_status_message(UNKNOWN, "hi"),
    "save_step": lambda s: s.save_step(UNKNOWN, "step", 1, fence=1),
}


@pytest.mark.parametrize("call", EVERY_CALL_ON_AN_ID.values(), ids=EVERY_CALL_ON_AN_ID.keys())
async def test_unknown_id_raises_task_not_found_naming_it(store, call):
    """Every method taking a task id answers an unknown id with TaskNotFound naming it (8E)."""
    await store.create()  # the store is not empty: the id is simply not there
    error = await refused(store, TaskNotFound, lambda: call(store))
    assert error.task_id == UNKNOWN
    assert str(error) == f"unknown task: {UNKNOWN}"


# --- owners -----------------------------------------------------------------------------


async def test_owner_sees_its_own_task(store):
    """get(owner=...) with the task's owner returns it."""
    task = await store.create(owner="alice")
    assert await store.get(task.task_id, owner="alice") == task


@pytest.mark.parametrize(
    "call",
    [
        lambda s, i: s.get(i, owner="mallory"),
        lambda s, i: s.provide_input(i, {"svc": {"service": "x"}}, owner="mallory"),
        lambda s, i: s.cancel(i, owner="mallory"),
    ],
    ids=["get", "provide_input", "cancel"],
)
async def test_another_owners_task_looks_exactly_like_a_missing_one(store, call):
    """Another owner's task raises TaskNotFound with the very message of a missing id."""
    task = await store.create(owner="alice", input_requests={"svc": ask()})
    foreign = await refused(store, TaskNotFound, lambda: call(store, task.task_id))
    with pytest.raises(TaskNotFound) as missing:
        await call(store, "x" * len(task.task_id))
    assert str(foreign) == str(missing.value).replace("x" * len(task.task_id), task.task_id)
    assert str(foreign) == f"unknown task: {task.task_id}"


async def test_owner_scoping_applies_to_the_default_owner_too(store):
    """A task with the default owner "" is hidden from a named owner."""
    task = await store.create()
    with pytest.raises(TaskNotFound):
        await store.get(task.task_id, owner="alice")


# --- idempotency keys -------------------------------------------------------------------


async def test_same_idempotency_key_returns_the_same_task(store, clock):
    """A repeated create with the same key returns the first task and creates nothing (8A)."""
    first = await store.create(
        name="job", arguments={"a": 1}, idempotency_key="incident-1", input_requests={"s": ask()}
    )
    clock.advance(5)
    before = await everything(store)
    again = await store.create(
        name="job", arguments={"a": 1}, idempotency_key="incident-1", input_requests={"s": ask()}
    )
    assert again == first
    assert await everything(store) == before


async def test_idempotent_repeat_compares_json_not_key_order(store):
    """Arguments equal as JSON (other key order, tuple vs list) repeat the same request."""
    first = await store.create(arguments={"a": 1, "b": [1, 2]}, idempotency_key="k")
    again = await store.create(arguments={"b": (1, 2), "a": 1}, idempotency_key="k")
    assert again.task_id == first.task_id
    assert len(await store.list()) == 1


async def test_idempotency_key_returns_the_task_after_it_finished(store):
    """A repeat after the task completed returns the completed task, not a new one."""
    first = await store.create(idempotency_key="k")
    done = await store.complete(first.task_id, {"ok": True})
    assert await store.create(idempotency_key="k") == done


async def test_idempotency_key_is_scoped_to_the_owner(store):
    """The same key under another owner creates another task."""
    alice = await store.create(owner="alice", idempotency_key="k")
    bob = await store.create(owner="bob", idempotency_key="k")
    anonymous = await store.create(idempotency_key="k")
    assert len({alice.task_id, bob.task_id, anonymous.task_id}) == 3
    assert (await store.create(owner="bob", idempotency_key="k")).task_id == bob.task_id


@pytest.mark.parametrize(
    ("second", "difference"),
    [
        pytest.param({"arguments": {"a": 2}}, "arguments", id="arguments"),
        pytest.param({"name": "other"}, "task name", id="name"),
        pytest.param({"name": None}, "task name", id="no-name"),
        pytest.param(
            {"input_requests": {"s": ask(schema={"type": "object", "required": ["team"]})}},
            "input requests",
            id="schema",
        ),
        pytest.param({"input_requests": {"s": ask("Other?")}}, "input requests", id="message"),
        pytest.param({"input_requests": {"t": ask()}}, "input requests", id="key"),
    ],
)
async def test_same_key_different_request_conflicts_and_creates_nothing(
    store, second: dict[str, Any], difference: str
):
    """The same key with another name, arguments or input request is a conflict."""
    base: dict[str, Any] = {
        "name": "job",
        "arguments": {"a": 1},
        "input_requests": {"s": ask()},
    }
    first = await store.create(idempotency_key="k", **base)
    error = await refused(
        store, IdempotencyConflict, lambda: store.create(idempotency_key="k", **{**base, **second})
    )
    assert error.key == "k"
    assert error.task_id == first.task_id
    assert difference in str(error)
    assert first.task_id in str(error)


async def test_facade_style_task_conflicts_when_the_repeat_drops_its_schema(store):
    """A nameless task created with a schema conflicts with a repeat that has none."""
    await store.create(idempotency_key="k", input_requests={"input": ask()})
    await refused(store, IdempotencyConflict, lambda: store.create(idempotency_key="k"))


async def test_named_task_conflicts_when_the_repeat_drops_its_initial_requests(store):
    """A named task created with input requests conflicts with a repeat that has none."""
    await store.create(name="job", idempotency_key="k", input_requests={"s": ask()})
    with pytest.raises(IdempotencyConflict):
        await store.create(name="job", idempotency_key="k")


async def test_nameless_task_repeat_ignores_requests_made_after_creation(store):
    """A nameless task that asked for more input later still matches its original create."""
    first = await store.create(idempotency_key="k")
    await store.request_input(first.task_id, {"later": ask()}, fence=None)
    assert (await store.create(idempotency_key="k")).task_id == first.task_id


async def test_named_task_repeat_ignores_requests_made_after_creation(store):
    """Input a handler asked for later does not make the original create a conflict."""
    first = await store.create(name="job", idempotency_key="k")
    [lease] = await store.claim(["job"], worker="w1", lease_seconds=30)
    await store.request_input(first.task_id, {"later": ask()}, fence=lease.fence)
    again = await store.create(name="job", idempotency_key="k")
    assert again.task_id == first.task_id
    assert again.status is Status.INPUT_REQUIRED


# --- payloads ---------------------------------------------------------------------------

NOT_JSON = {
    "set": {1, 2},
    "nan": math.nan,
    "inf": math.inf,
    "bytes": b"raw",
    "object": object(),
    "tuple-key": {(1, 2): "x"},
}


@pytest.mark.parametrize("value", NOT_JSON.values(), ids=NOT_JSON.keys())
async def test_non_json_arguments_are_refused(store, value):
    """Arguments that JSON cannot hold raise InvalidPayload and create nothing."""
    error = await refused(store, InvalidPayload, lambda: store.create(arguments={"v": value}))
    assert "arguments" in str(error)


async def test_create_returns_a_private_copy(store):
    """Mutating the caller's arguments or the returned snapshot never changes the store."""
    arguments: dict[str, Any] = {"nested": {"list": [1, 2]}}
    schema: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "string"}}}
    task = await store.create(arguments=arguments, input_requests={"s": ask(schema=schema)})
    stored = await store.get(task.task_id)
    arguments["nested"]["list"].append(3)
    schema["properties"]["a"]["type"] = "integer"
    task.arguments["nested"]["extra"] = True
    task.input_requests["s"].schema["required"] = ["a"]
    again = await store.get(task.task_id)
    assert again == stored
    assert again.arguments == {"nested": {"list": [1, 2]}}
    assert again.input_requests["s"].schema == {
        "type": "object",
        "properties": {"a": {"type": "string"}},
    }


async def test_get_returns_a_private_copy(store):
    """Mutating a snapshot returned by get() never changes the next get()."""
    task = await store.create(arguments={"a": {"b": 1}})
    got = await store.get(task.task_id)
    got.arguments["a"]["b"] = 2
    assert (await store.get(task.task_id)).arguments == {"a": {"b": 1}}


async def test_tuples_come_back_as_lists(store):
    """Values are stored as JSON: a tuple comes back as a list, on every adapter."""
    task = await store.create(arguments={"t": (1, 2)})
    assert task.arguments == {"t": [1, 2]}
    assert (await store.get(task.task_id)).arguments == {"t": [1, 2]}


async def test_create_with_answers_starts_working_with_them(store):
    """Input given with the create (asked before the task existed) is validated and stored;
    with every request answered the task starts working."""
    task = await store.create(
        name="job",
        input_requests={"input": ask()},
        input_responses={"input": {"service": "payments"}},
    )
    assert task.status is Status.WORKING
    assert task.input_responses == {"input": {"service": "payments"}}
    assert task.pending_input == {}


async def test_create_with_a_bad_answer_creates_nothing(store):
    """An answer given with the create that violates its schema, or answers no request,
    is refused and no task is created."""
    await refused(
        store,
        InputRejected,
        lambda: store.create(input_requests={"input": ask()}, input_responses={"input": {}}),
    )
    await refused(
        store,
        InvalidPayload,
        lambda: store.create(input_requests={"input": ask()}, input_responses={"other": {}}),
    )
