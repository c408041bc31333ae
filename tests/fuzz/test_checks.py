"""The fuzz harness's own checks catch what they are there to catch (pure, no server):
a refusal that created a task, lost one or changed one at rest, and a body that is not
a JSON-RPC answer."""

from __future__ import annotations

import dataclasses

import pytest

from fuzz.harness import messages_of, not_json_rpc, store_changes
from keel.model import Status, Task


def task(task_id: str, status: Status = Status.INPUT_REQUIRED, **fields: object) -> Task:
    return dataclasses.replace(Task(task_id, status, "owner", "tool", {}, 1.0, 1.0), **fields)


def test_a_store_left_alone_passes_and_lease_renewals_do_not_count() -> None:
    """Only what a refusal could change is compared: a renewed lease moves updated_at."""
    before = {"a": task("a"), "b": task("b", Status.WORKING)}
    after = {"a": task("a", updated_at=9.0, lease_expires_at=40.0), "b": task("b", attempt=2)}
    assert store_changes(before, after) == []


def test_a_created_task_and_a_changed_task_at_rest_are_named() -> None:
    """A task created, a task gone, an answered task: each is one problem naming it."""
    before = {"a": task("a"), "b": task("b", Status.COMPLETED)}
    after = {"a": task("a", Status.WORKING, input_responses={"k": 1}), "c": task("c")}
    problems = store_changes(before, after)
    assert len(problems) == 3
    assert problems[0] == "refused, yet tasks were created: ['c']"
    assert problems[1] == "refused, yet tasks are gone: ['b']"
    assert problems[2].startswith("refused, yet task a changed")


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        ({"id": 1, "result": {}}, "no jsonrpc 2.0"),
        ({"jsonrpc": "2.0", "result": {}}, "without id"),
        ({"jsonrpc": "2.0", "id": 1}, "exactly one of"),
        ({"jsonrpc": "2.0", "id": 1, "result": {}, "error": {}}, "exactly one of"),
        ({"jsonrpc": "2.0", "id": 1, "error": {"code": "x", "message": "m"}}, "malformed"),
    ],
)
def test_an_answer_that_is_not_json_rpc_is_named(message: dict[str, object], problem: str) -> None:
    """Each way a body can fail to be a JSON-RPC answer is a problem."""
    assert any(problem in p for p in not_json_rpc(message))


def test_bodies_are_read_as_the_transport_allows() -> None:
    """JSON and SSE bodies give their messages; a 4xx's plain text is a transport error;
    a 2xx that is neither JSON nor SSE is refused."""
    assert messages_of('{"jsonrpc": "2.0", "id": 1, "result": {}}', "application/json", 200)
    sse = 'event: message\ndata: {"jsonrpc": "2.0", "id": 1, "result": {}}\n\n'
    assert messages_of(sse, "text/event-stream", 200) == [{"jsonrpc": "2.0", "id": 1, "result": {}}]
    assert messages_of("Invalid Content-Type header", "", 400) == []
    with pytest.raises(ValueError, match="unexpected body"):
        messages_of("<html>", "text/html", 200)
    with pytest.raises(ValueError, match="not a JSON-RPC message"):
        messages_of("[1]", "application/json", 200)
