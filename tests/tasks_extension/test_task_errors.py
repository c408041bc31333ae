"""Every error path of the tasks extension (issue 4 item 4, spec part B6), over real HTTP:
the JSON-RPC code and message, the HTTP status, and that the store is unchanged.

Unknown and purged task ids answer exactly alike; invalid, oversized and schema-violating
payloads answer -32602 naming what is wrong; header mismatches answer -32020 with HTTP
400; removed methods -32601; a broken store -32603 without internals.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from mcp.server import MCPServer

from contract.support import FakeClock
from keel.model import Limits
from keel.runtime import Keel
from keel.store import SqliteStore
from tasks_extension.support import (
    NOT_FOUND,
    Answer,
    build_app,
    build_server,
    poll,
    post,
    serve_http,
)

pytestmark = pytest.mark.anyio
TASKS_METHODS = ("tasks/get", "tasks/update", "tasks/cancel")
TTL = 7 * 86_400.0  # seconds: the default ttl of the test tasks
MiB = 1024 * 1024


def params_for(method: str, task_id: str) -> dict[str, Any]:
    if method == "tasks/update":
        return {"taskId": task_id, "inputResponses": {"service": {"action": "accept"}}}
    return {"taskId": task_id}


def shape(answer: Answer) -> tuple[int, int, str, Any]:
    """What a client can observe of an error: HTTP status, code, message, data."""
    return answer.status, answer.error["code"], answer.error["message"], answer.error.get("data")


def accept(**content: Any) -> dict[str, Any]:
    return {"action": "accept", "content": content}


@pytest.mark.requirement("K1", "B6.1", "B6.2", "B6.8", "B7.2", "B7.3")
@pytest.mark.slow
async def test_unknown_and_purged_tasks_answer_exactly_alike(tmp_path: Path) -> None:
    """A finished task stays readable for its whole TTL; once its TTL has run out it is
    purged (a live one, waiting for input, never is), and from then on tasks/get,
    tasks/update and tasks/cancel answer for it exactly what they answer for an id that
    never existed: HTTP 400, -32602, the same message."""
    clock = FakeClock(time.time())
    app = build_app(Keel(SqliteStore(tmp_path / "keel.db", clock=clock)))
    async with serve_http(build_server(app)) as url:
        unknown = {
            m: shape(await post(url, m, params_for(m, "no-such-task"))) for m in TASKS_METHODS
        }
        assert set(unknown.values()) == {(400, -32602, NOT_FOUND, None)}

        done = await post(url, "tools/call", {"name": "quick", "arguments": {"n": 1}})
        live = await post(url, "tools/call", {"name": "ask", "arguments": {"incident_id": "1"}})
        done_id, live_id = done.result["taskId"], live.result["taskId"]
        await poll(url, done_id, "completed")
        await poll(url, live_id, "input_required")
        # No lease is held on either task now, so moving the clock expires no attempt.
        assert not (await app.store.get(live_id)).leased

        clock.advance(TTL - 1)
        assert await app.store.purge() == []
        assert (await post(url, "tasks/get", {"taskId": done_id})).result["status"] == "completed"

        clock.advance(2)
        assert list(await app.store.purge()) == [done_id]
        for method in TASKS_METHODS:
            assert shape(await post(url, method, params_for(method, done_id))) == unknown[method]
        still = await post(url, "tasks/get", {"taskId": live_id})
        assert still.result["status"] == "input_required"


@pytest.mark.requirement("K2")
async def test_invalid_arguments_name_the_field_and_create_nothing(
    mcp_server: MCPServer[Any], keel_app: Keel
) -> None:
    """Arguments that violate the task's input schema, or its handler's signature, are
    refused with HTTP 400 and -32602 naming the field; no task is created."""
    cases = [
        ("typed", {"incident_id": "not-an-id"}, "incident_id"),
        ("typed", {}, "incident_id"),
        ("quick", {"n": "twelve"}, "arguments.n: "),
        ("ask", {}, "incident_id"),
    ]
    async with serve_http(mcp_server) as url:
        for name, arguments, field in cases:
            refused = await post(url, "tools/call", {"name": name, "arguments": arguments})
            assert (refused.status, refused.error["code"]) == (400, -32602), refused
            assert field in refused.error["message"], (name, refused.error)
    assert await keel_app.store.list() == []


@pytest.mark.requirement("K3")
async def test_oversized_arguments_name_the_limit_and_create_nothing(
    mcp_server: MCPServer[Any], keel_app: Keel
) -> None:
    """Arguments over the store's limit (1 MiB by default, below the SDK's 4 MiB request
    limit, so Keel's check is the one that answers): -32602 naming the limit."""
    big = "x" * (MiB + 10)
    async with serve_http(mcp_server) as url:
        refused = await post(url, "tools/call", {"name": "ask", "arguments": {"incident_id": big}})
    assert (refused.status, refused.error["code"]) == (400, -32602)
    assert "arguments" in refused.error["message"]
    assert f"limit is {MiB} bytes" in refused.error["message"]
    assert await keel_app.store.list() == []


@pytest.mark.requirement("K4", "K5")
async def test_bad_input_is_refused_naming_the_problem_and_stays_outstanding(
    tmp_path: Path,
) -> None:
    """tasks/update with input over the size limit, violating the requested schema, or
    with an unknown action: -32602 naming the limit / field / key, nothing stored, the
    request still outstanding; a good answer afterwards completes the task."""
    limits = Limits(max_input_bytes=512)
    app = build_app(Keel(SqliteStore(tmp_path / "keel.db", limits=limits)))
    async with serve_http(build_server(app)) as url:
        created = await post(url, "tools/call", {"name": "ask", "arguments": {"incident_id": "7"}})
        task_id = created.result["taskId"]
        waiting = await poll(url, task_id, "input_required")
        history = await app.store.history(task_id)
        cases = [
            (accept(service="x" * 600), "limit is 512 bytes"),
            (accept(service=42), "service"),
            (accept(other="db"), "service"),
            ({"action": "maybe"}, "'service'"),
        ]
        for response, named in cases:
            refused = await post(
                url, "tasks/update", {"taskId": task_id, "inputResponses": {"service": response}}
            )
            assert (refused.status, refused.error["code"]) == (400, -32602), refused
            assert named in refused.error["message"], refused.error
            again = await post(url, "tasks/get", {"taskId": task_id})
            assert again.result == waiting
        assert await app.store.history(task_id) == history
        stored = await app.store.get(task_id)
        assert stored.input_responses == {}

        await post(
            url,
            "tasks/update",
            {"taskId": task_id, "inputResponses": {"service": accept(service="db")}},
        )
        done = await poll(url, task_id, "completed")
    assert done["result"]["structuredContent"] == {"incident": "7", "service": "db"}


@pytest.mark.requirement("B4.21")
async def test_routing_headers_that_disagree_with_the_body_are_refused(
    mcp_server: MCPServer[Any], keel_app: Keel
) -> None:
    """Mcp-Name other than params.taskId on tasks/*; Mcp-Method other than the body's
    method; Mcp-Name other than the tool on tools/call: HTTP 400, -32020, and nothing is
    applied. A missing Mcp-Name is accepted (FastMCP's tasks client sends none)."""
    async with serve_http(mcp_server) as url:
        created = await post(url, "tools/call", {"name": "ask", "arguments": {"incident_id": "8"}})
        task_id = created.result["taskId"]
        await poll(url, task_id, "input_required")
        answer = {"service": accept(service="db")}
        refusals = []
        for method in TASKS_METHODS:
            params = (
                {"taskId": task_id, "inputResponses": answer}
                if method == "tasks/update"
                else {"taskId": task_id}
            )
            refusals.append(await post(url, method, params, name="some-other-task"))
            other = "tasks/get" if method != "tasks/get" else "tasks/cancel"
            refusals.append(await post(url, method, params, method_header=other))
        refusals.append(
            await post(url, "tools/call", {"name": "quick", "arguments": {"n": 1}}, name="ask")
        )
        for refused in refusals:
            assert (refused.status, refused.error["code"]) == (400, -32020), refused
        still = await post(url, "tasks/get", {"taskId": task_id}, omit_name=True)
        assert still.result["status"] == "input_required"
        assert len(await keel_app.store.list()) == 1  # the mismatched tools/call made no task
        ack = await post(
            url, "tasks/update", {"taskId": task_id, "inputResponses": answer}, omit_name=True
        )
        assert ack.result["resultType"] == "complete"
        await poll(url, task_id, "completed")


@pytest.mark.requirement("B6.4", "B6.5")
async def test_removed_methods_are_method_not_found(mcp_server: MCPServer[Any]) -> None:
    """tasks/result and tasks/list (removed by SEP-2663) answer -32601; the SDK sends it
    with HTTP 404, its status for every -32601."""
    async with serve_http(mcp_server) as url:
        for method, params in [("tasks/result", {"taskId": "t"}), ("tasks/list", {})]:
            answer = await post(url, method, params)
            assert (answer.status, answer.error["code"]) == (404, -32601), method


@pytest.mark.requirement("B6.3")
async def test_a_broken_store_is_an_internal_error_without_internals(tmp_path: Path) -> None:
    """When the store itself fails (here: closed under the server), tasks/* answer
    -32603 with a generic message: no path, no exception text."""
    app = build_app(Keel(SqliteStore(tmp_path / "keel.db")))
    async with serve_http(build_server(app)) as url:
        created = await post(url, "tools/call", {"name": "quick", "arguments": {"n": 1}})
        await poll(url, created.result["taskId"], "completed")
        await app.store.close()
        answer = await post(url, "tasks/get", {"taskId": created.result["taskId"]})
    assert answer.error["code"] == -32603
    assert str(tmp_path) not in str(answer.body)
    assert "closed" not in answer.error["message"]
