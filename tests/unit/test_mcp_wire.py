"""Unit: Keel tasks in the MCP tasks extension's wire shapes (SEP-2663, 2026-07-28)."""

from __future__ import annotations

import dataclasses

import pytest

from keel.errors import InvalidPayload
from keel.mcp import create_task_result, detailed_task, input_from_wire, iso8601, ttl_ms, wire
from keel.mcp.wire import RELATED_TASK, legacy_outcome
from keel.model import InputRequest, Status, Task
from keel.runtime.outcomes import ToolOutput

T0 = 1_764_585_000.0  # 2025-12-01T10:30:00Z
SCHEMA = {"type": "object", "required": ["service"], "properties": {"service": {"type": "string"}}}


def task(**changes: object) -> Task:
    """A working task created at T0 with a one-hour ttl."""
    base = Task("t1", Status.WORKING, "", "diagnose", {}, T0, T0 + 5, ttl=3600.0)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_times_are_iso8601_utc_with_milliseconds():
    """createdAt / lastUpdatedAt are ISO 8601 in UTC ('Z'), to the millisecond."""
    assert iso8601(T0) == "2025-12-01T10:30:00.000Z"
    assert iso8601(T0 + 0.25) == "2025-12-01T10:30:00.250Z"


def test_a_working_task_has_the_required_fields_and_integer_durations():
    """taskId, status, createdAt, lastUpdatedAt, ttlMs are present; ttlMs and pollIntervalMs
    are integers; the V1 names ttl / pollInterval never appear."""
    wire = detailed_task(task(status_message="loading spans"), now=T0 + 10, poll_interval=1.0)
    assert wire == {
        "taskId": "t1",
        "status": "working",
        "createdAt": "2025-12-01T10:30:00.000Z",
        "lastUpdatedAt": "2025-12-01T10:30:05.000Z",
        "ttlMs": 3_600_000,
        "pollIntervalMs": 1000,
        "statusMessage": "loading spans",
    }
    assert "ttl" not in wire
    assert "pollInterval" not in wire


def test_input_required_lists_only_outstanding_elicitation_requests():
    """inputRequests holds the unanswered requests, as elicitation/create form requests."""
    waiting = task(
        status=Status.INPUT_REQUIRED,
        input_requests={
            "a": InputRequest("Which service?", SCHEMA),
            "b": InputRequest("OK?", SCHEMA),
        },
        input_responses={"a": {"service": "payments"}},
    )
    wire = detailed_task(waiting, now=T0, poll_interval=0.5)
    assert wire["inputRequests"] == {
        "b": {
            "method": "elicitation/create",
            "params": {"mode": "form", "message": "OK?", "requestedSchema": SCHEMA},
        }
    }
    assert wire["pollIntervalMs"] == 500


def test_completed_carries_the_tool_result_and_failed_the_error():
    """completed -> result (a CallToolResult with resultType "complete", isError
    included); failed -> error."""
    result = {"content": [{"type": "text", "text": "nope"}], "isError": True}
    assert detailed_task(task(status=Status.COMPLETED, result=result), now=T0, poll_interval=1)[
        "result"
    ] == {"resultType": "complete", **result}
    error = {"code": -32603, "message": "dead letter after 3 attempt(s): boom"}
    wire = detailed_task(task(status=Status.FAILED, error=error), now=T0, poll_interval=1)
    assert wire["error"] == error
    assert "result" not in wire


def test_a_plain_json_result_goes_out_as_a_tool_result():
    """A result stored through the store API (not a CallToolResult) is wrapped as one."""
    wire = detailed_task(task(status=Status.COMPLETED, result={"n": 1}), now=T0, poll_interval=1)
    assert wire["result"] == {
        "resultType": "complete",
        "content": [{"type": "text", "text": '{"n": 1}'}],
        "isError": False,
        "structuredContent": {"n": 1},
    }


def test_ttl_grows_with_a_live_task_past_its_ttl_and_is_null_when_kept_for_good():
    """A live task past its ttl reports at least a ttl from now; no ttl -> null."""
    assert ttl_ms(task(), now=T0 + 7200) == (7200 + 3600) * 1000
    assert ttl_ms(task(ttl=None), now=T0) is None
    late = task(status=Status.COMPLETED, updated_at=T0 + 7200, result={})
    assert ttl_ms(late, now=T0 + 7200) == (7200 + 3600) * 1000  # kept a ttl after it ended


def test_create_task_result_is_flat_with_result_type_task():
    """CreateTaskResult is the task itself, flat, with resultType "task"."""
    wire = create_task_result(task(), now=T0, poll_interval=1)
    assert wire["resultType"] == "task"
    assert wire["taskId"] == "t1"
    assert "task" not in wire


def test_input_responses_split_into_answers_and_declines():
    """accept -> answers[key] = content; decline / cancel -> declined[key] = action."""
    answers, declined = input_from_wire(
        {
            "a": {"action": "accept", "content": {"service": "payments"}},
            "b": {"action": "decline"},
            "c": {"action": "cancel"},
        }
    )
    assert answers == {"a": {"service": "payments"}}
    assert declined == {"b": "decline", "c": "cancel"}


@pytest.mark.parametrize(
    ("responses", "names"),
    [
        ([], "inputResponses"),
        ({"a": "yes"}, "inputResponses['a']"),
        ({"a": {"action": "maybe"}}, "inputResponses['a'].action"),
        # found by tests/fuzz: an action that is a list or an object (unhashable)
        ({"a": {"action": [1]}}, "inputResponses['a'].action"),
        ({"a": {"action": {"x": 1}}}, "inputResponses['a'].action"),
    ],
)
def test_malformed_input_responses_are_refused_naming_the_key(responses, names):
    """Malformed inputResponses raise InvalidPayload naming where."""
    with pytest.raises(InvalidPayload, match=names.replace("[", r"\[").replace("]", r"\]")):
        input_from_wire(responses)


def test_a_stored_tool_output_round_trips_and_other_json_is_not_one():
    """ToolOutput's stored form reads back as the same value; JSON that is not a stored
    tool result (no content list, unknown fields, a non-bool isError) reads as None."""
    output = ToolOutput(({"type": "text", "text": "2 deploys"},), {"deploys": 2}, meta={"k": 1})
    assert ToolOutput.from_json(output.to_json()) == output
    assert ToolOutput.from_json(ToolOutput.of_error("nope").to_json()) == ToolOutput.of_error(
        "nope"
    )
    for other in (
        {"n": 1},
        "text",
        [1],
        {"content": "x"},
        {"content": [{"text": "no type"}]},
        {"content": [], "isError": "yes"},
        {"content": [], "extra": 1},
    ):
        assert ToolOutput.from_json(other) is None, other


def test_a_plain_string_result_is_its_json_text_on_the_wire():
    """A string stored through the store API goes out as its JSON text (quoted), while a
    handler's returned string is its text as is."""
    wire = detailed_task(task(status=Status.COMPLETED, result="hi"), now=T0, poll_interval=1)
    assert wire["result"]["content"] == [{"type": "text", "text": '"hi"'}]
    assert ToolOutput.of_value("hi").content == ({"type": "text", "text": "hi"},)


def test_the_2025_outcome_has_no_result_type_and_names_its_task_when_related():
    """tasks/result answers the CallToolResult without resultType, with related-task _meta."""
    result = {"content": [{"type": "text", "text": "ok"}], "isError": False}
    done = task(status=Status.COMPLETED, result=result)
    assert legacy_outcome(done, related=False) == {"result": result}
    related = legacy_outcome(done, related=True)["result"]
    assert related["_meta"] == {RELATED_TASK: {"taskId": "t1"}}
    failed = task(status=Status.FAILED, error={"code": -32603, "message": "boom"})
    assert legacy_outcome(failed, related=True) == {"error": failed.error}


def test_protocol_error_codes_are_the_sdk_s():
    """The codes wire.py names itself (it imports no SDK) are the SDK's constants."""
    import mcp_types

    assert wire.INVALID_PARAMS == mcp_types.INVALID_PARAMS
    assert wire.METHOD_NOT_FOUND == mcp_types.METHOD_NOT_FOUND
    assert wire.HEADER_MISMATCH == mcp_types.HEADER_MISMATCH
    assert wire.CANNOT_ASK == mcp_types.MISSING_REQUIRED_CLIENT_CAPABILITY
    assert wire.INTERNAL_ERROR == mcp_types.INTERNAL_ERROR
