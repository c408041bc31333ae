"""Unit: the transition table and every pure transition function, without any store."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keel import (
    InputRejected,
    InvalidPayload,
    InvalidTransition,
    LeaseLost,
    Status,
    TaskAlreadyTerminal,
)
from keel.model import (
    ALLOWED,
    INTERNAL_ERROR,
    TERMINAL,
    Change,
    Event,
    InputRequest,
    Task,
    can_move,
)
from keel.model import transitions as tr

W, IR = Status.WORKING, Status.INPUT_REQUIRED
C, F, X = Status.COMPLETED, Status.FAILED, Status.CANCELLED
NOW = 1_000.0
SCHEMA = {"type": "object", "required": ["service"], "properties": {"service": {"type": "string"}}}
ERROR = {"code": -32000, "message": "boom"}


def make(status: Status = W, **changes: Any) -> Task:
    """A task as a store would hold it, created at t=0."""
    base = Task(
        task_id="t1",
        status=status,
        owner="",
        name="job",
        arguments={},
        created_at=0.0,
        updated_at=0.0,
    )
    return dataclasses.replace(base, **changes)


def leased(fence: int = 3, expires: float = NOW + 30, **changes: Any) -> Task:
    """A working task held by worker w1 with the given fence."""
    return make(W, lease_owner="w1", lease_expires_at=expires, fence=fence, **changes)


def waiting(**changes: Any) -> Task:
    """A task waiting for input "svc"."""
    return make(IR, input_requests={"svc": InputRequest("Service?", SCHEMA)}, **changes)


def assert_moved(change: Change, old: Task, to: Status) -> None:
    """The change moves ``old`` to ``to`` at NOW with a matching history event."""
    assert change.changed
    assert change.task.status is to
    assert change.task.updated_at == NOW
    assert change.event is not None
    assert (change.event.from_status, change.event.to_status) == (old.status, to)
    assert change.event.at == NOW
    assert change.event.task_id == old.task_id
    assert change.event.reason


# --- the table --------------------------------------------------------------------------


def test_every_status_has_a_row():
    """ALLOWED has one row per status."""
    assert set(ALLOWED) == set(Status)


@pytest.mark.parametrize("status", sorted(TERMINAL))
def test_terminal_statuses_have_no_exits(status):
    """Completed, failed and cancelled lead nowhere, not even to themselves."""
    assert ALLOWED[status] == frozenset()
    assert status.terminal
    assert not any(can_move(status, dst) for dst in Status)


def test_terminal_set_is_exactly_the_three_final_statuses():
    """TERMINAL is {completed, failed, cancelled}; working and input_required are live."""
    assert frozenset({C, F, X}) == TERMINAL
    assert not W.terminal
    assert not IR.terminal


@pytest.mark.parametrize("status", [W, IR])
def test_live_statuses_may_fail_or_be_cancelled(status):
    """Any live status may end failed or cancelled."""
    assert can_move(status, F)
    assert can_move(status, X)


def test_only_working_completes():
    """Completion comes from working only: a task waiting for input cannot complete."""
    assert can_move(W, C)
    assert not can_move(IR, C)


def test_the_seed_lifecycle_is_allowed():
    """working -> input_required -> working -> completed, as in the seed."""
    assert can_move(W, IR)
    assert can_move(IR, W)
    assert can_move(W, C)


def test_status_values_are_the_wire_names():
    """Status members are the MCP wire strings."""
    assert [s.value for s in Status] == [
        "working",
        "input_required",
        "completed",
        "failed",
        "cancelled",
    ]


# --- new_task ---------------------------------------------------------------------------


def _new(**kwargs: Any) -> Change:
    options: dict[str, Any] = {
        "name": None,
        "arguments": {},
        "owner": "",
        "idempotency_key": None,
        "input_requests": None,
        "ttl": None,
        "max_attempts": 1,
        "actor": "client",
    }
    return tr.new_task("t1", NOW, **{**options, **kwargs})


def test_new_task_without_requests_is_working():
    """A new task without requests is working, ready at once, with a creation event."""
    change = _new()
    assert change.task.status is W
    assert change.task.ready_at == change.task.created_at == change.task.updated_at == NOW
    assert change.event is not None
    assert (change.event.from_status, change.event.to_status) == (None, W)


def test_new_task_with_requests_waits_for_input():
    """A new task with requests starts input_required with the first message shown."""
    change = _new(input_requests={"svc": InputRequest("Service?", SCHEMA)})
    assert change.task.status is IR
    assert change.task.status_message == "Service?"
    assert change.event is not None
    assert "'svc'" in change.event.reason


@pytest.mark.parametrize(
    "bad",
    [
        {"arguments": []},
        {"arguments": {"v": {1}}},
        {"max_attempts": 0},
        {"max_attempts": 1.0},
        {"ttl": -1.0},
        {"name": ""},
        {"owner": 5},
        {"idempotency_key": ""},
        {"input_requests": {"k": InputRequest("m", {"type": "bogus"})}},
        {"input_requests": {"k": InputRequest(5, SCHEMA)}},  # type: ignore[arg-type]
    ],
)
def test_new_task_refuses_bad_values(bad):
    """Bad arguments, options or requests raise InvalidPayload."""
    with pytest.raises(InvalidPayload):
        _new(**bad)


def test_same_request_spots_each_difference():
    """same_request names what differs (name, arguments, input requests) or returns None."""
    existing = _new(name="job", arguments={"a": 1}).task
    assert tr.same_request(existing, _new(name="job", arguments={"a": 1}).task) is None
    assert tr.same_request(existing, _new(name="other", arguments={"a": 1}).task) == "task name"
    assert tr.same_request(existing, _new(name="job", arguments={"a": 2}).task) == "arguments"
    with_input = _new(name="job", arguments={"a": 1}, input_requests={"k": InputRequest("m", {})})
    assert tr.same_request(existing, with_input.task) == "input requests"


# --- request_input ----------------------------------------------------------------------

ASK = {"svc": InputRequest("Service?", SCHEMA)}


def test_request_input_from_the_lease_holder_releases_the_lease():
    """working (leased) -> input_required; lease gone, fence kept."""
    task = leased()
    change = tr.request_input(task, ASK, NOW, fence=3)
    assert_moved(change, task, IR)
    assert (change.task.lease_owner, change.task.lease_expires_at) == (None, None)
    assert change.task.fence == 3
    assert change.event is not None
    assert change.event.actor == "worker:w1"


def test_request_input_unleased_on_an_unleased_task():
    """A client may park an unleased working task."""
    task = make()
    assert_moved(tr.request_input(task, ASK, NOW, fence=None), task, IR)


@pytest.mark.parametrize(
    ("task", "fence", "error"),
    [
        (make(C), None, TaskAlreadyTerminal),
        (make(X), 3, TaskAlreadyTerminal),
        (leased(), None, InvalidTransition),
        (leased(), 2, LeaseLost),
        (make(W, fence=3), 3, LeaseLost),
        (waiting(), None, InvalidTransition),
        (make(W, input_requests=ASK, input_responses={"svc": {}}), None, InvalidPayload),
    ],
    ids=["completed", "cancelled", "unleased-on-leased", "stale", "no-lease", "waiting", "reuse"],
)
def test_request_input_refusals(task, fence, error):
    """request_input refuses terminal, foreign, stale, waiting and key-reusing writes."""
    with pytest.raises(error) as info:
        tr.request_input(task, ASK, NOW, fence=fence)
    assert type(info.value) is error


def test_request_input_needs_a_request():
    """request_input with no requests raises InvalidPayload."""
    with pytest.raises(InvalidPayload):
        tr.request_input(make(), {}, NOW, fence=None)


# --- provide_input ----------------------------------------------------------------------


def test_provide_input_resumes_when_all_are_answered():
    """The last answer moves input_required -> working, ready now, message cleared."""
    task = waiting(status_message="Service?")
    change = tr.provide_input(task, {"svc": {"service": "db"}}, NOW, actor="client")
    assert_moved(change, task, W)
    assert change.task.ready_at == NOW
    assert change.task.status_message is None
    assert change.task.input_responses == {"svc": {"service": "db"}}


def test_provide_input_partial_stays_waiting():
    """An answer to one of two requests stays input_required, with an event."""
    task = make(IR, input_requests={**ASK, "b": InputRequest("B?", {})})
    change = tr.provide_input(task, {"b": 1}, NOW, actor="client")
    assert_moved(change, task, IR)
    assert set(change.task.pending_input) == {"svc"}


def test_provide_input_unknown_keys_change_nothing():
    """Only unknown or answered keys: an unchanged Change without an event."""
    task = waiting()
    change = tr.provide_input(task, {"nope": 1}, NOW, actor="client")
    assert (change.changed, change.event, change.task) == (False, None, task)


@pytest.mark.parametrize(
    ("task", "error"),
    [(make(C), TaskAlreadyTerminal), (make(F), TaskAlreadyTerminal), (make(W), InvalidTransition)],
    ids=["completed", "failed", "working"],
)
def test_provide_input_refusals(task, error):
    """provide_input refuses finished tasks and tasks that are not waiting."""
    with pytest.raises(error) as info:
        tr.provide_input(task, {"svc": {"service": "x"}}, NOW, actor="client")
    assert type(info.value) is error


def test_provide_input_not_waiting_message_names_the_status():
    """The refusal says "task is not waiting for input: working" (seed 8B)."""
    with pytest.raises(InvalidTransition, match="task is not waiting for input: working"):
        tr.provide_input(make(W), {"svc": 1}, NOW, actor="client")


def test_provide_input_invalid_answer_is_rejected():
    """An answer violating the schema raises InputRejected naming the field."""
    with pytest.raises(InputRejected) as info:
        tr.provide_input(waiting(), {"svc": {}}, NOW, actor="client")
    assert (info.value.key, info.value.path) == ("svc", "service")


# --- complete, fail, cancel -------------------------------------------------------------


def test_complete_unleased_and_leased():
    """complete moves working -> completed for an unleased client or the lease holder."""
    task = make()
    change = tr.complete(task, {"ok": 1}, NOW, fence=None)
    assert_moved(change, task, C)
    assert change.task.closed_fence is None
    held = leased()
    change = tr.complete(held, 1, NOW, fence=3)
    assert_moved(change, held, C)
    assert change.task.closed_fence == 3
    assert change.task.lease_owner is None


def test_a_leased_complete_is_exactly_the_task_and_history_row_expected():
    """The whole Task and Event a worker's complete produces (both are built without
    their __init__, see keel.model.task.task_of): every field, equality, frozenness."""
    held = leased(attempt=2, claimed_at=NOW - 5)
    change = tr.complete(held, {"content": []}, NOW, fence=3, actor="client")
    assert change.changed
    assert change.task == dataclasses.replace(
        held,
        status=C,
        updated_at=NOW,
        result={"content": []},
        lease_owner=None,
        lease_expires_at=None,
        closed_fence=3,
    )
    assert type(change) is Change
    assert change.event == Event("t1", NOW, W, C, "completed", "worker:w1")
    assert type(change.event) is Event
    assert hash(change.event) == hash(Event("t1", NOW, W, C, "completed", "worker:w1"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        change.event.reason = "edited"  # type: ignore[misc]
    assert (held.status, held.lease_owner) == (W, "w1"), "the old task is untouched"


def test_complete_exact_repeat_is_unchanged():
    """Completing again with the same result and fence returns the task unchanged."""
    done = make(C, result={"a": 1, "b": 2}, closed_fence=3)
    change = tr.complete(done, {"b": 2, "a": 1}, NOW, fence=3)
    assert (change.changed, change.event, change.task) == (False, None, done)


@pytest.mark.parametrize(
    ("task", "result", "fence", "error"),
    [
        (make(C, result=1), 2, None, TaskAlreadyTerminal),
        (make(C, result=1, closed_fence=3), 1, None, TaskAlreadyTerminal),
        (make(C, result=1), 1, 3, TaskAlreadyTerminal),
        (make(F), 1, None, TaskAlreadyTerminal),
        (make(X), 1, None, TaskAlreadyTerminal),
        (waiting(), 1, None, InvalidTransition),
        (leased(), 1, None, InvalidTransition),
        (leased(), 1, 2, LeaseLost),
        (make(W, fence=3), 1, 3, LeaseLost),
    ],
    ids=[
        "other-result",
        "unleased-repeat-of-fenced",
        "fenced-repeat-of-unleased",
        "failed",
        "cancelled",
        "waiting",
        "unleased-on-leased",
        "stale",
        "no-lease",
    ],
)
def test_complete_refusals(task, result, fence, error):
    """complete refuses finished, waiting, foreign and stale writes."""
    with pytest.raises(error) as info:
        tr.complete(task, result, NOW, fence=fence)
    assert type(info.value) is error


def test_fail_from_both_live_statuses():
    """fail moves working or input_required to failed with the error stored."""
    for task in (make(), waiting()):
        change = tr.fail(task, ERROR, NOW, fence=None)
        assert_moved(change, task, F)
        assert change.task.error == ERROR


def test_fail_exact_repeat_is_unchanged():
    """Failing again with the same error and fence returns the task unchanged."""
    failed = make(F, error=ERROR)
    assert not tr.fail(failed, dict(ERROR), NOW, fence=None).changed


@pytest.mark.parametrize(
    "error",
    [
        None,
        "boom",
        {"code": 1},
        {"message": "m"},
        {"code": "1", "message": "m"},
        {"code": False, "message": "m"},
        {"code": 1, "message": "m", "x": 1},
    ],
)
def test_check_error_refuses_non_json_rpc_errors(error):
    """Errors must be {code: int, message: non-empty str, data?}."""
    with pytest.raises(InvalidPayload):
        tr.check_error(error)


def test_check_error_accepts_data():
    """An error with data is accepted as given."""
    error = {"code": 1, "message": "m", "data": [1]}
    assert tr.check_error(error) == error


def test_cancel_live_tasks_including_leased():
    """cancel moves any live task to cancelled and drops a lease."""
    for task in (make(), waiting(), leased()):
        change = tr.cancel(task, NOW, reason="stop", actor="client")
        assert_moved(change, task, X)
        assert change.task.lease_owner is None
        assert change.task.status_message == "cancelled: stop"


def test_cancel_after_cancel_is_unchanged():
    """Cancelling a cancelled task returns it unchanged."""
    cancelled = make(X)
    assert not tr.cancel(cancelled, NOW, reason=None, actor="client").changed


@pytest.mark.parametrize("status", [C, F])
def test_cancel_after_another_ending_is_refused(status):
    """Cancelling a completed or failed task raises TaskAlreadyTerminal (seed 8D)."""
    with pytest.raises(TaskAlreadyTerminal, match=f"already {status.value}"):
        tr.cancel(make(status), NOW, reason=None, actor="client")


# --- leases -----------------------------------------------------------------------------


def test_claim_bumps_the_fence_and_sets_the_lease():
    """claim: lease to the worker until now + lease, fence + 1, a W -> W event."""
    task = make(fence=4, ready_at=NOW)
    change = tr.claim(task, NOW, worker="w9", lease_seconds=30)
    assert_moved(change, task, W)
    assert (change.task.lease_owner, change.task.lease_expires_at) == ("w9", NOW + 30)
    assert change.task.fence == 5


@pytest.mark.parametrize(
    "task",
    [make(ready_at=NOW + 1), leased(), waiting(), make(C)],
    ids=["not-yet", "leased", "waiting", "completed"],
)
def test_claim_refuses_tasks_that_are_not_ready(task):
    """claim raises InvalidTransition for a task not ready to be claimed."""
    with pytest.raises(InvalidTransition):
        tr.claim(task, NOW, worker="w9", lease_seconds=30)


def test_renew_extends_without_an_event():
    """renew sets a new expiry and updated_at, with no history event."""
    change = tr.renew(leased(), NOW, fence=3, lease_seconds=30)
    assert change.changed
    assert change.event is None
    assert (change.task.lease_expires_at, change.task.updated_at) == (NOW + 30, NOW)


@pytest.mark.parametrize(
    ("task", "error"),
    [(make(X), TaskAlreadyTerminal), (leased(fence=4), LeaseLost), (make(), LeaseLost)],
    ids=["cancelled", "stale", "released"],
)
def test_renew_refusals(task, error):
    """renew refuses finished tasks and attempts that no longer hold the lease."""
    with pytest.raises(error):
        tr.renew(task, NOW, fence=3, lease_seconds=30)


def test_set_status_message_has_no_event():
    """set_status_message changes the message and updated_at only."""
    change = tr.set_status_message(make(), "hi", NOW, fence=None)
    assert change.event is None
    assert (change.task.status_message, change.task.updated_at) == ("hi", NOW)


def test_check_step_follows_the_writer_rules():
    """A step may be saved only by the current lease holder of a live task."""
    tr.check_step(leased(), 3)
    for task, error in ((make(C), TaskAlreadyTerminal), (leased(), LeaseLost), (make(), LeaseLost)):
        with pytest.raises(error):
            tr.check_step(task, 2 if task.leased else 3)


# --- retry, recover, reclaim ------------------------------------------------------------


def test_retry_with_attempts_left_schedules_the_next():
    """retry: attempt + 1, unleased, ready after the delay."""
    task = leased(max_attempts=3)
    change = tr.retry(task, ERROR, NOW, fence=3, delay_seconds=5)
    assert_moved(change, task, W)
    assert (change.task.attempt, change.task.ready_at, change.task.lease_owner) == (
        2,
        NOW + 5,
        None,
    )


def test_retry_on_the_last_attempt_dead_letters():
    """retry on the last attempt fails with a dead-letter error keeping the code."""
    task = leased(max_attempts=2, attempt=2)
    change = tr.retry(task, ERROR, NOW, fence=3, delay_seconds=5)
    assert_moved(change, task, F)
    assert change.task.error is not None
    assert change.task.error["code"] == ERROR["code"]
    assert change.task.error["message"] == "dead letter after 2 attempt(s): boom"
    assert change.event is not None
    assert "no attempts left" in change.event.reason


def test_retry_refuses_a_negative_delay():
    """retry with a negative delay raises InvalidPayload."""
    with pytest.raises(InvalidPayload):
        tr.retry(leased(max_attempts=2), ERROR, NOW, fence=3, delay_seconds=-1)


def test_recover_an_expired_lease():
    """recover: an expired lease retries (attempt + 1) or dead-letters on the last attempt."""
    task = leased(expires=NOW - 1, max_attempts=2)
    change = tr.recover(task, NOW)
    assert_moved(change, task, W)
    assert (change.task.attempt, change.task.lease_owner, change.task.ready_at) == (2, None, NOW)
    assert change.event is not None
    assert change.event.actor == "recovery"
    dead = tr.recover(dataclasses.replace(task, attempt=2), NOW)
    assert dead.task.status is F
    assert dead.task.error is not None
    assert dead.task.error["code"] == INTERNAL_ERROR


@pytest.mark.parametrize(
    "task",
    [leased(expires=NOW + 1), make(), waiting(), make(C)],
    ids=["live-lease", "unleased", "waiting", "completed"],
)
def test_recover_refuses_tasks_without_an_expired_lease(task):
    """recover raises InvalidTransition unless the lease expired before now."""
    with pytest.raises(InvalidTransition):
        tr.recover(task, NOW)


def test_reclaim_a_stale_task_explains_itself():
    """reclaim: failed with INTERNAL_ERROR and a Reclaimed entry giving the idle time."""
    task = waiting(updated_at=NOW - 100)
    change, why = tr.reclaim(task, NOW, timeout_seconds=60)
    assert_moved(change, task, F)
    assert change.task.error == {"code": INTERNAL_ERROR, "message": why.reason}
    assert (why.task_id, why.previous_status, why.idle_seconds) == ("t1", IR, 100.0)
    assert change.event is not None
    assert change.event.actor == "reclaim"


@pytest.mark.parametrize(
    "task", [make(updated_at=NOW - 60), make(C, updated_at=0.0)], ids=["fresh", "completed"]
)
def test_reclaim_refuses_fresh_and_finished_tasks(task):
    """reclaim raises InvalidTransition for a task idle no longer than the timeout or finished."""
    with pytest.raises(InvalidTransition):
        tr.reclaim(task, NOW, timeout_seconds=60)


# --- a property over every write --------------------------------------------------------

tasks = st.builds(
    lambda status, lease, fence, attempt: make(
        status,
        fence=fence,
        attempt=attempt,
        max_attempts=3,
        lease_owner="w1" if lease and status is W else None,
        lease_expires_at=NOW if lease and status is W else None,
        input_requests=ASK if status is IR else {},
    ),
    st.sampled_from(list(Status)),
    st.booleans(),
    st.integers(0, 3),
    st.integers(1, 3),
)
fences = st.one_of(st.none(), st.integers(0, 3))
WRITES = {
    "complete": lambda t, f: tr.complete(t, 1, NOW, fence=f),
    "fail": lambda t, f: tr.fail(t, ERROR, NOW, fence=f),
    "cancel": lambda t, f: tr.cancel(t, NOW, reason=None, actor="c"),
    "provide_input": lambda t, f: tr.provide_input(t, {"svc": {"service": "x"}}, NOW, actor="c"),
    "request_input": lambda t, f: tr.request_input(t, {"new": ASK["svc"]}, NOW, fence=f),
    "renew": lambda t, f: tr.renew(t, NOW, fence=f or 0, lease_seconds=1),
    "retry": lambda t, f: tr.retry(t, ERROR, NOW, fence=f or 0, delay_seconds=0),
    "claim": lambda t, f: tr.claim(t, NOW, worker="w2", lease_seconds=1),
    "recover": lambda t, f: tr.recover(t, NOW + 100),
    "reclaim": lambda t, f: tr.reclaim(t, NOW, timeout_seconds=1)[0],
}


@settings(max_examples=300)
@given(task=tasks, fence=fences, write=st.sampled_from(sorted(WRITES)))
def test_every_write_follows_the_table(task, fence, write):
    """Any write either raises a Keel error or makes a move the table allows; terminal absorbs."""
    try:
        change = WRITES[write](task, fence)
    except (InvalidTransition, LeaseLost, InvalidPayload):
        return
    if task.status.terminal:
        assert not change.changed, "a finished task never changes"
        return
    assert can_move(task.status, change.task.status)
    assert change.task.fence >= task.fence
    if change.task.lease_owner is not None:
        assert change.task.status is W
    if change.event is not None:
        assert (change.event.from_status, change.event.to_status) == (
            task.status,
            change.task.status,
        )
