"""Every answer Keel puts on the wire validates against the published 2026-07-28 schemas
(issue 12, item 1).

Two real servers, each a ``keel serve`` process on 127.0.0.1 (built exactly as the
command builds them), are driven over HTTP with hand-written 2026-07-28 requests through
every state they can reach, and every JSON-RPC answer is recorded with what it must be:

* the conformance app (``keel serve --app conformance``): the plain tool; each task tool
  created, working, input_required (one and two questions, a partial answer), completed,
  completed with ``isError``, failed and cancelled; the MRTR input-required result and
  the task it starts; inline answers to a client without the extension, and the MRTR
  round that asks it for a task's input and its retries; the acks of
  tasks/update and tasks/cancel; the errors (-32602 unknown task, bad input and bad
  arguments, -32021, -32020, -32603);
* Incident Bridge (``keel serve``, sample dataset, fast pace): its plain tools (answers
  and tool errors) and ``diagnose_root_cause`` through input to its cited conclusion,
  a tool error, and inline to a client without the extension (asked through MRTR).

Each answer is then checked against the extension's JSON schema, the core schema and the
SDK's models (:mod:`tasks_extension.wire_schema`); a failure names the request, the JSON
path, the message and the schema path. The checker itself is shown to catch the bug the
TypeScript client found (a completed task's ``result`` without ``resultType``) on a real
recorded answer.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from keel.bridge import SEED_DEPLOY, SEED_INCIDENT
from keel_serve import KeelServe
from tasks_extension.wire_schema import SCHEMAS, Exchange, Wire, tags, violations

START = 120.0  # seconds a server may take to start (the Bridge indexes its sample data)
UNKNOWN = "task-that-does-not-exist"


@contextmanager
def keel_serve(folder: Path, *args: str) -> Iterator[str]:
    """``keel serve ARGS`` as a process in ``folder`` on a free 127.0.0.1 port; yields its
    URL once it listens, and stops it when the block ends."""
    server = KeelServe(
        args, cwd=folder, env={**os.environ, "KEEL_STORE": ""}, log=folder / "serve.log"
    )
    server.start()
    try:
        anyio.run(server.ready, START)
        yield server.url
    finally:
        server.stop()


def record(url: str, flows: Callable[[Wire], Awaitable[None]]) -> list[Exchange]:
    """Run ``flows`` against ``url``; every exchange, in order."""
    wire = Wire(url)
    anyio.run(flows, wire)
    return wire.exchanges


# --- the conformance app ------------------------------------------------------------


async def conformance_basics(wire: Wire) -> None:
    """Discovery, the plain tool, inline answers and the errors that need no task."""
    await wire.send("DiscoverResult", "discover", "server/discover")
    await wire.send("ListToolsResult", "tools", "tools/list")
    for declared in (True, False):
        answer = await wire.call(
            "CallToolResult",
            f"greet, declared={declared}",
            "greet",
            arguments={"name": "Ada"},
            declared=declared,
        )
        assert answer.result["content"][0]["text"] == "Hello, Ada!"
    inline = await wire.call(
        "CallToolResult",
        "slow_compute inline (no extension)",
        "slow_compute",
        arguments={"seconds": 0.05, "label": "x"},
        declared=False,
    )
    assert "computed x" in inline.result["content"][0]["text"]
    refused = await wire.call(
        "JSONRPCErrorResponse",
        "failing_job without the extension (task required)",
        "failing_job",
        arguments={},
        declared=False,
    )
    assert refused.error["code"] == -32021
    failed = await wire.call(
        "JSONRPCErrorResponse",
        "protocol_error_job inline (no extension)",
        "protocol_error_job",
        arguments={},
        declared=False,
    )
    assert failed.error["code"] == -32603
    bad = await wire.call(
        "JSONRPCErrorResponse",
        "slow_compute with a bad argument",
        "slow_compute",
        arguments={"seconds": "soon"},
    )
    assert bad.error["code"] == -32602
    for method in ("tasks/get", "tasks/update", "tasks/cancel"):
        params = {"taskId": UNKNOWN}
        if method == "tasks/update":
            params["inputResponses"] = {"confirm": {"action": "accept", "content": {}}}
        unknown = await wire.send("JSONRPCErrorResponse", "unknown task", method, params)
        assert unknown.error["code"] == -32602
    undeclared = await wire.send(
        "JSONRPCErrorResponse",
        "without the extension",
        "tasks/get",
        {"taskId": UNKNOWN},
        declared=False,
    )
    assert undeclared.error["code"] == -32021


async def conformance_plain_input(wire: Wire) -> None:
    """A client without the extension is asked through MRTR: the input-required result,
    a retry with a wrong answer (-32602), the retry that completes the task inline."""
    asked = await wire.call(
        "InputRequiredResult",
        "confirm_delete (no extension)",
        "confirm_delete",
        arguments={"filename": "b.txt"},
        declared=False,
    )
    [key] = asked.result["inputRequests"]
    retry = {"arguments": {"filename": "b.txt"}, "requestState": asked.result["requestState"]}
    wrong = await wire.call(
        "JSONRPCErrorResponse",
        "confirm_delete retried with a wrong answer (no extension)",
        "confirm_delete",
        **retry,
        inputResponses={key: {"action": "accept", "content": {"confirm": "y"}}},
        declared=False,
    )
    assert wrong.error["code"] == -32602
    done = await wire.call(
        "CallToolResult",
        "confirm_delete retried with the answer (no extension)",
        "confirm_delete",
        **retry,
        inputResponses={key: {"action": "accept", "content": {"confirm": True}}},
        declared=False,
    )
    assert done.result["content"][0]["text"] == "deleted b.txt"


async def conformance_tasks(wire: Wire) -> None:
    """Each task tool through the states it reaches."""
    done = await wire.call(
        "CreateTaskResult",
        "slow_compute",
        "slow_compute",
        arguments={"seconds": 0.3, "label": "pi"},
    )
    await wire.until(done.result["taskId"], "slow_compute", "completed")

    slow = await wire.call(
        "CreateTaskResult", "slow_compute to cancel", "slow_compute", arguments={"seconds": 600}
    )
    slow_id = slow.result["taskId"]
    await wire.until(slow_id, "slow_compute running", "working")
    await wire.send("CancelTaskResult", "running task", "tasks/cancel", {"taskId": slow_id})
    await wire.until(slow_id, "slow_compute cancelled", "cancelled")
    await wire.send("CancelTaskResult", "cancelled task", "tasks/cancel", {"taskId": slow_id})
    mismatch = await wire.send(
        "JSONRPCErrorResponse",
        "Mcp-Name disagrees",
        "tasks/get",
        {"taskId": slow_id},
        name="another-task",
    )
    assert mismatch.error["code"] == -32020

    tool_error = await wire.call("CreateTaskResult", "failing_job", "failing_job", arguments={})
    ended = await wire.until(tool_error.result["taskId"], "failing_job", "completed")
    assert ended["result"]["isError"] is True
    protocol = await wire.call(
        "CreateTaskResult", "protocol_error_job", "protocol_error_job", arguments={}
    )
    await wire.until(protocol.result["taskId"], "protocol_error_job", "failed")
    await wire.send(
        "CancelTaskResult", "failed task", "tasks/cancel", {"taskId": protocol.result["taskId"]}
    )


async def conformance_input(wire: Wire) -> None:
    """Input: one question (a bad answer refused), two at once (answered in two parts),
    and the synchronous MRTR question before a task."""
    confirm = await wire.call(
        "CreateTaskResult", "confirm_delete", "confirm_delete", arguments={"filename": "a.txt"}
    )
    task_id = confirm.result["taskId"]
    asking = await wire.until(task_id, "confirm_delete", "input_required")
    [key] = asking["inputRequests"]
    rejected = await wire.send(
        "JSONRPCErrorResponse",
        "confirm_delete, an answer of the wrong type",
        "tasks/update",
        {
            "taskId": task_id,
            "inputResponses": {key: {"action": "accept", "content": {"confirm": "y"}}},
        },
    )
    assert rejected.error["code"] == -32602
    answer = {
        "taskId": task_id,
        "inputResponses": {key: {"action": "accept", "content": {"confirm": True}}},
    }
    await wire.send("UpdateTaskResult", "confirm_delete", "tasks/update", answer)
    await wire.until(task_id, "confirm_delete answered", "completed")
    await wire.send("UpdateTaskResult", "confirm_delete, answered again", "tasks/update", answer)
    await wire.send("CancelTaskResult", "completed task", "tasks/cancel", {"taskId": task_id})

    again = await wire.call("CreateTaskResult", "confirm_delete to decline", "confirm_delete")
    again_id = again.result["taskId"]
    await wire.until(again_id, "confirm_delete to decline", "input_required")
    declined = {"taskId": again_id, "inputResponses": {key: {"action": "decline"}}}
    await wire.send("UpdateTaskResult", "confirm_delete, declined", "tasks/update", declined)
    await wire.until(again_id, "confirm_delete declined", "completed", "failed", "cancelled")

    multi = await wire.call("CreateTaskResult", "multi_input", "multi_input", arguments={})
    multi_id = multi.result["taskId"]
    both = await wire.until(multi_id, "multi_input", "input_required")
    assert set(both["inputRequests"]) == {"name", "confirm"}
    name = {"name": {"action": "accept", "content": {"name": "Ada"}}}
    await wire.send(
        "UpdateTaskResult",
        "multi_input, one of two",
        "tasks/update",
        {"taskId": multi_id, "inputResponses": name},
    )
    left = await wire.send(
        "GetTaskResult", "multi_input, one left", "tasks/get", {"taskId": multi_id}
    )
    assert set(left.result["inputRequests"]) == {"confirm"}, left.result
    await wire.send(
        "UpdateTaskResult",
        "multi_input, the other",
        "tasks/update",
        {
            "taskId": multi_id,
            "inputResponses": {"confirm": {"action": "accept", "content": {"confirm": False}}},
        },
    )
    await wire.until(multi_id, "multi_input answered", "completed")

    asked = await wire.call(
        "InputRequiredResult",
        "test_tool_with_task, first round",
        "test_tool_with_task",
        arguments={},
    )
    [mrtr_key] = asked.result["inputRequests"]
    started = await wire.call(
        "CreateTaskResult",
        "test_tool_with_task, answered",
        "test_tool_with_task",
        arguments={},
        inputResponses={mrtr_key: {"action": "accept", "content": {"name": "Ada"}}},
        requestState=asked.result["requestState"],
    )
    await wire.until(started.result["taskId"], "test_tool_with_task", "completed")


async def conformance_flows(wire: Wire) -> None:
    await conformance_basics(wire)
    await conformance_plain_input(wire)
    await conformance_tasks(wire)
    await conformance_input(wire)


# --- Incident Bridge ----------------------------------------------------------------


async def bridge_flows(wire: Wire) -> None:
    """The plain tools (answers and tool errors) and the diagnosis through input to its
    conclusion, as a tool error, and inline to a client without the extension (asked
    for the service through MRTR)."""
    await wire.send("ListToolsResult", "tools", "tools/list")
    plain = [
        ("get_incident", {"incident_id": SEED_INCIDENT}, False),
        ("get_incident", {"incident_id": "INC-0000-NOPE"}, True),
        ("list_deploys", {"deploy_id": SEED_DEPLOY}, False),
        ("search_traces", {"service": "payments", "errors_only": True, "limit": 5}, False),
    ]
    for tool, arguments, is_error in plain:
        answer = await wire.call("CallToolResult", f"{tool} {arguments}", tool, arguments=arguments)
        assert bool(answer.result.get("isError")) is is_error, answer.body
    for tool, arguments in (
        ("list_deploys", {"since": "yesterday-ish"}),
        ("search_traces", {"limit": 100_000}),
    ):  # invalid arguments: refused as every tool's are (docs/mcp.md)
        refused = await wire.send(
            "JSONRPCErrorResponse",
            f"{tool} {arguments}",
            "tools/call",
            {"name": tool, "arguments": arguments},
        )
        assert refused.error["code"] == -32602, refused.body

    created = await wire.call(
        "CreateTaskResult",
        "diagnose_root_cause",
        "diagnose_root_cause",
        arguments={"incident_id": SEED_INCIDENT},
    )
    task_id = created.result["taskId"]
    asking = await wire.until(task_id, "diagnose_root_cause", "input_required")
    [key] = asking["inputRequests"]
    wrong = await wire.send(
        "JSONRPCErrorResponse",
        "diagnose_root_cause, a service not in the enum",
        "tasks/update",
        {
            "taskId": task_id,
            "inputResponses": {key: {"action": "accept", "content": {"service": "billing"}}},
        },
    )
    assert wrong.error["code"] == -32602
    await wire.send(
        "UpdateTaskResult",
        "diagnose_root_cause",
        "tasks/update",
        {
            "taskId": task_id,
            "inputResponses": {key: {"action": "accept", "content": {"service": "payments"}}},
        },
    )
    done = await wire.until(task_id, "diagnose_root_cause answered", "completed")
    assert done["result"]["structuredContent"]["root_cause"]["deploy_id"] == SEED_DEPLOY
    await wire.send("CancelTaskResult", "completed diagnosis", "tasks/cancel", {"taskId": task_id})

    unknown = await wire.call(
        "CreateTaskResult",
        "diagnose_root_cause, unknown incident",
        "diagnose_root_cause",
        arguments={"incident_id": "INC-0000-NOPE"},
    )
    await wire.until(unknown.result["taskId"], "diagnose_root_cause, unknown incident", "completed")
    asked = await wire.call(
        "InputRequiredResult",
        "diagnose_root_cause (no extension)",
        "diagnose_root_cause",
        arguments={"incident_id": SEED_INCIDENT},
        declared=False,
    )
    [key] = asked.result["inputRequests"]
    inline = await wire.call(
        "CallToolResult",
        "diagnose_root_cause retried with the service (no extension)",
        "diagnose_root_cause",
        arguments={"incident_id": SEED_INCIDENT},
        requestState=asked.result["requestState"],
        inputResponses={key: {"action": "accept", "content": {"service": "payments"}}},
        declared=False,
    )
    assert SEED_DEPLOY in inline.result["content"][0]["text"]


# --- fixtures and tests ---------------------------------------------------------------


@pytest.fixture(scope="module")
def conformance(tmp_path_factory: pytest.TempPathFactory) -> list[Exchange]:
    """Every exchange of the conformance flows with ``keel serve --app conformance``."""
    folder = tmp_path_factory.mktemp("conformance")
    with keel_serve(folder, "--app", "conformance", "--store", str(folder / "keel.db")) as url:
        return record(url, conformance_flows)


@pytest.fixture(scope="module")
def bridge(tmp_path_factory: pytest.TempPathFactory) -> list[Exchange]:
    """Every exchange of the Bridge flows with ``keel serve`` (sample data, fast pace)."""
    folder = tmp_path_factory.mktemp("bridge")
    with keel_serve(folder, "--data-dir", str(folder / "data"), "--pace", "fast") as url:
        return record(url, bridge_flows)


def report(exchanges: list[Exchange]) -> str:
    """Each failing answer once (identical repeated polls are reported once), with every
    violation and the answer itself."""
    lines: list[str] = []
    seen: set[str] = set()
    for exchange in exchanges:
        found = violations(exchange)
        key = exchange.describe() + repr(exchange.answer.body.get("result", {}).get("status"))
        if found and key not in seen:
            seen.add(key)
            answer = json.dumps(exchange.answer.body)
            shown = answer if len(answer) <= 600 else f"{answer[:600]}… ({len(answer)} chars)"
            lines.append(f"{exchange.describe()}: answer {shown}")
            lines += [f"    {v}" for v in found]
    return "\n".join(lines)


@pytest.mark.requirement("B2.1", "B2.3", "B4.6", "B4.10", "B4.14")
@pytest.mark.slow
def test_every_conformance_answer_validates(conformance: list[Exchange]) -> None:
    """Every answer of the conformance app, in every state, validates against the
    extension's and the core 2026-07-28 schemas and the SDK's models."""
    failures = report(conformance)
    assert not failures, f"answers that break the 2026-07-28 schemas:\n{failures}"


@pytest.mark.slow
def test_the_conformance_flows_reach_every_state(conformance: list[Exchange]) -> None:
    """The recorded answers cover every shape the test claims to check: each task status
    through tasks/get, a completed tool error, every result kind, each error code."""
    seen = set().union(*(tags(e) for e in conformance))
    expected = {
        "DiscoverResult", "ListToolsResult", "CallToolResult", "InputRequiredResult",
        "CreateTaskResult:working", "UpdateTaskResult", "CancelTaskResult",
        "GetTaskResult:working", "GetTaskResult:input_required", "GetTaskResult:completed",
        "GetTaskResult:completed:isError", "GetTaskResult:failed", "GetTaskResult:cancelled",
        "error:-32602", "error:-32603", "error:-32021", "error:-32020",
    }  # fmt: skip
    assert expected <= seen, f"never recorded: {sorted(expected - seen)}"


@pytest.mark.requirement("B2.1", "B4.6", "B4.10")
@pytest.mark.slow
def test_every_bridge_answer_validates(bridge: list[Exchange]) -> None:
    """Every answer of Incident Bridge (plain tools, the diagnosis through input to its
    conclusion, a tool error, inline through MRTR) validates against the same schemas and
    models."""
    seen = set().union(*(tags(e) for e in bridge))
    expected = {
        "GetTaskResult:input_required", "GetTaskResult:completed", "InputRequiredResult",
        "GetTaskResult:completed:isError", "CallToolResult:isError", "error:-32602",
    }  # fmt: skip
    assert expected <= seen, f"never recorded: {sorted(expected - seen)}"
    failures = report(bridge)
    assert not failures, f"answers that break the 2026-07-28 schemas:\n{failures}"


def _completed(exchanges: list[Exchange]) -> Exchange:
    return next(
        e for e in exchanges
        if e.kind == "GetTaskResult" and e.answer.body["result"]["status"] == "completed"
    )  # fmt: skip


def _with(exchange: Exchange, change: Callable[[dict[str, Any]], object]) -> Exchange:
    body = copy.deepcopy(exchange.answer.body)
    change(body["result"])
    return Exchange(
        exchange.label, exchange.method, exchange.kind, type(exchange.answer)(200, body)
    )


@pytest.mark.slow
def test_the_check_catches_a_completed_result_without_result_type(
    conformance: list[Exchange],
) -> None:
    """The bug the TypeScript client found: a real completed tasks/get answer whose
    ``result`` lacks ``resultType`` fails, at ``$.result``, the CallToolResult check and
    the SDK model; a wrong top-level ``resultType`` fails GetTaskResult itself."""
    real = _completed(conformance)
    assert violations(real) == []
    broken = violations(_with(real, lambda r: r["result"].pop("resultType")))
    assert any(
        v.startswith("$.result.result: 'resultType' is a required property")
        and "CallToolResult" in v
        for v in broken
    ), broken
    assert any(v.startswith("$.result.result.resultType: Field required") for v in broken), broken
    task_typed = violations(_with(real, lambda r: r.update(resultType="task")))
    assert any(
        v.startswith("$.result.resultType: 'complete' was expected") and "GetTaskResult" in v
        for v in task_typed
    ), task_typed


def test_the_vendored_schemas_are_the_published_files() -> None:
    """Each vendored schema file has the sha256 its README row records (it was not
    edited after it was fetched)."""
    readme = (SCHEMAS / "README.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `([\w.-]+\.json)` \|.*\| `([0-9a-f]{64})` \|$", readme, re.M))
    files = sorted(p.name for p in SCHEMAS.glob("*.json"))
    assert sorted(rows) == files
    for name, digest in rows.items():
        assert hashlib.sha256((SCHEMAS / name).read_bytes()).hexdigest() == digest, name
