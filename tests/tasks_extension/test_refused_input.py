"""Bad input is refused at the door (issue 15, item 1), over real HTTP, on SQLite and
PostgreSQL, for both protocol generations.

Tool arguments that violate the task's schema, that its handler does not take (even
where the schema allows extra properties) or that hold text no store keeps (NUL, lone
surrogates), and answers that hold such text, are answered ``-32602`` with a message
that starts with the field (``arguments.incident_id: …``); the store is exactly as it
was. A task id holding such text is an unknown task, answered as any other.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from mcp import Client
from mcp.server import MCPServer
from mcp.shared.exceptions import MCPError

from contract.support import everything
from keel.mcp.client import TasksClientExtension as Tasks
from keel.mcp.client_v2025 import LegacyClient, RpcError
from keel.runtime import Keel
from keel.store import PostgresStore, SqliteStore, Store
from postgres.pg import drop_schema, new_schema, require_postgres, store_url
from tasks_extension.support import (
    NOT_FOUND,
    WAIT,
    build_app,
    build_server,
    poll,
    post,
    serve_http,
)

pytestmark = pytest.mark.anyio

SURROGATE = "\ud800"
NUL = "\x00"

REFUSED_ARGUMENTS: list[tuple[str, dict[str, Any], str]] = [
    ("ask", {"incident_id": "INC-1", "bogus": 1}, "arguments.bogus"),
    # `typed` has an input_schema that does not forbid extra properties: still refused.
    ("typed", {"incident_id": "INC-1", "bogus": 1}, "arguments.bogus"),
    ("typed", {"incident_id": "nope"}, "arguments.incident_id"),
    ("quick", {"n": "twelve"}, "arguments.n"),
    ("quick", {}, "arguments.n"),
    ("ask", {"incident_id": f"INC{NUL}1"}, "arguments.incident_id"),
    ("ask", {"incident_id": "INC-1", "deep": {"a": [NUL]}}, "arguments.deep"),
]
SURROGATE_ARGUMENTS = {"incident_id": f"INC-{SURROGATE}"}


# slow on PostgreSQL: a schema created and dropped per test (as the contract suite's).
@pytest.fixture(
    params=["sqlite", pytest.param("postgres", marks=(pytest.mark.postgres, pytest.mark.slow))]
)
async def wire_app(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[Keel]:
    """The extension tests' tasks on a fresh SQLite file or PostgreSQL schema."""
    schema = None
    store: Store
    if request.param == "postgres":
        require_postgres()
        schema = new_schema()
        store = PostgresStore(store_url(schema))
    else:
        store = SqliteStore(tmp_path / "keel.db")
    app = build_app(Keel(store))
    try:
        yield app
    finally:
        await app.close()
        if schema is not None:
            drop_schema(schema)


@pytest.fixture
def wire_server(wire_app: Keel) -> MCPServer[Any]:
    return build_server(wire_app)


def _names(message: str, field: str) -> None:
    assert message.startswith(f"{field}: "), message
    message.encode("utf-8")  # printable, sendable text whatever the input held


@pytest.mark.requirement("K2")
async def test_2026_tools_call_refuses_bad_arguments_and_stores_nothing(
    wire_app: Keel, wire_server: MCPServer[Any]
) -> None:
    """2026-07-28 ``tools/call``, by a client with the tasks extension (a task) or
    without (inline): HTTP 400, -32602 naming the field, the store unchanged."""
    async with serve_http(wire_server) as url:
        kept = await post(url, "tools/call", {"name": "kept", "arguments": {}})
        await poll(url, kept.result["taskId"], "completed")  # a task there stays as it is
        before = await everything(wire_app.store)
        for n, (tool, arguments, field) in enumerate(REFUSED_ARGUMENTS * 2):
            declared = n % 2 == 0  # each case both ways
            params = {"name": tool, "arguments": arguments}
            refused = await post(url, "tools/call", params, declared=declared)
            assert (refused.status, refused.error["code"]) == (400, -32602), refused
            _names(refused.error["message"], field)
        assert await everything(wire_app.store) == before


@pytest.mark.requirement("K2")
async def test_the_official_client_sees_the_same_refusals(
    wire_app: Keel, wire_server: MCPServer[Any]
) -> None:
    """Through the official SDK client (in process), with the tasks extension and
    without: MCPError -32602 whose message names the field; nothing stored."""
    for extensions in ([Tasks()], None):
        async with Client(wire_server, extensions=extensions) as client:
            for tool, arguments, field in REFUSED_ARGUMENTS:
                with pytest.raises(MCPError) as info:
                    await client.session.call_tool(tool, arguments, allow_claimed=True)
                assert info.value.code == -32602
                _names(info.value.message, field)
    assert await wire_app.store.list() == []


@pytest.mark.requirement("K2")
async def test_2026_lone_surrogates_in_arguments_are_refused_naming_the_field(
    wire_app: Keel, wire_server: MCPServer[Any]
) -> None:
    """A lone surrogate (``"\\ud800"`` in the JSON) in a value or a key: -32602 naming
    the field (it was -32603), the store unchanged."""
    cases = [
        (SURROGATE_ARGUMENTS, "arguments.incident_id"),
        ({"incident_id": "INC-1", f"x{SURROGATE}": 1}, 'arguments["x\\ud800"]'),
    ]
    async with serve_http(wire_server) as url:
        before = await everything(wire_app.store)
        for arguments, field in cases:
            for declared in (True, False):
                refused = await post(
                    url, "tools/call", {"name": "ask", "arguments": arguments}, declared=declared
                )
                assert (refused.status, refused.error["code"]) == (400, -32602), refused
                _names(refused.error["message"], field)
        assert await everything(wire_app.store) == before


@pytest.mark.requirement("K2")
async def test_2025_tools_call_refuses_bad_arguments_and_stores_nothing(
    wire_app: Keel, wire_server: MCPServer[Any]
) -> None:
    """2025-11-25 ``tools/call``, with ``params.task`` or without: -32602 naming the
    field, the store unchanged."""
    async with serve_http(wire_server) as url, LegacyClient(url, timeout=WAIT) as client:
        before = await everything(wire_app.store)
        for tool, arguments, field in REFUSED_ARGUMENTS:
            for task in ({"task": {}}, {}):
                with pytest.raises(RpcError) as info:
                    await client.request(
                        "tools/call", {"name": tool, "arguments": arguments, **task}
                    )
                assert info.value.code == -32602
                _names(info.value.error["message"], field)
        assert await everything(wire_app.store) == before


async def test_2025_lone_surrogates_never_reach_the_store(
    wire_app: Keel, wire_server: MCPServer[Any]
) -> None:
    """On a 2025-11-25 session the SDK's JSON parser refuses a lone surrogate escape
    itself (-32700, before any handler runs); nothing is stored either way."""
    async with serve_http(wire_server) as url, LegacyClient(url, timeout=WAIT) as client:
        with pytest.raises(RpcError) as info:
            await client.call_task("ask", SURROGATE_ARGUMENTS)
        assert info.value.code in {-32700, -32602}
    assert await wire_app.store.list() == []


@pytest.mark.requirement("K5")
async def test_2026_answers_with_unstorable_text_are_refused_and_the_request_stays(
    wire_app: Keel, wire_server: MCPServer[Any]
) -> None:
    """tasks/update whose content holds NUL or a lone surrogate: -32602 naming
    ``input.<key>.<field>``, nothing stored, the request still outstanding; a good answer
    afterwards completes the task."""
    async with serve_http(wire_server) as url:
        created = await post(url, "tools/call", {"name": "ask", "arguments": {"incident_id": "7"}})
        task_id = created.result["taskId"]
        waiting = await poll(url, task_id, "input_required")
        before = await everything(wire_app.store)
        for text in (f"pay{NUL}", f"pay{SURROGATE}"):
            answer = {"service": {"action": "accept", "content": {"service": text}}}
            refused = await post(url, "tasks/update", {"taskId": task_id, "inputResponses": answer})
            assert (refused.status, refused.error["code"]) == (400, -32602), refused
            _names(refused.error["message"], "input.service.service")
            assert (await post(url, "tasks/get", {"taskId": task_id})).result == waiting
        assert await everything(wire_app.store) == before
        good = {"service": {"action": "accept", "content": {"service": "db"}}}
        await post(url, "tasks/update", {"taskId": task_id, "inputResponses": good})
        done = await poll(url, task_id, "completed")
    assert done["result"]["structuredContent"] == {"incident": "7", "service": "db"}


@pytest.mark.requirement("K5")
async def test_2025_an_elicitation_answer_with_nul_is_refused_and_the_task_waits(
    wire_app: Keel, wire_server: MCPServer[Any]
) -> None:
    """The 2025-11-25 answer path (``elicitation/create`` while tasks/result waits): an
    answer holding NUL makes tasks/result answer -32602 naming the field; the task still
    waits for that input, unchanged."""
    answers = iter([{"service": f"pay{NUL}"}])

    async def on_input(message: str, schema: dict[str, Any], task_id: str | None) -> Any:
        return next(answers)

    async with (
        serve_http(wire_server) as url,
        LegacyClient(url, on_input=on_input, timeout=WAIT) as client,
    ):
        created = await client.call_task("ask", {"incident_id": "7"})
        await client.until(created["taskId"], "input_required", limit=WAIT)
        before = await everything(wire_app.store)
        with pytest.raises(RpcError) as info:
            await client.result(created["taskId"])
        assert info.value.code == -32602
        _names(info.value.error["message"], "input.service.service")
        assert (await client.get(created["taskId"]))["status"] == "input_required"
    assert await everything(wire_app.store) == before


@pytest.mark.requirement("K1")
@pytest.mark.parametrize(
    "task_id",
    [pytest.param(f"a{NUL}b", id="nul"), pytest.param(SURROGATE, id="surrogate")],
)
async def test_a_task_id_no_store_can_hold_is_answered_as_an_unknown_task(
    wire_app: Keel, wire_server: MCPServer[Any], task_id: str
) -> None:
    """tasks/get, tasks/update and tasks/cancel with such an id answer exactly what they
    answer for an id that never existed, on every store (it was -32603 on PostgreSQL)."""
    methods = {
        "tasks/get": {},
        "tasks/cancel": {},
        "tasks/update": {"inputResponses": {"service": {"action": "accept"}}},
    }
    async with serve_http(wire_server) as url:
        for method, extra in methods.items():
            for candidate in (task_id, "no-such-task"):
                # No Mcp-Name header: an HTTP header cannot carry NUL.
                answer = await post(url, method, {"taskId": candidate, **extra}, omit_name=True)
                assert (answer.status, answer.error) == (
                    400,
                    {"code": -32602, "message": NOT_FOUND},
                )
        if NUL in task_id:  # a lone surrogate does not pass the 2025 session's parser
            async with LegacyClient(url, timeout=WAIT) as client:
                with pytest.raises(RpcError) as info:
                    await client.get(task_id)
                assert (info.value.code, info.value.error["message"]) == (-32602, NOT_FOUND)
    assert await wire_app.store.list() == []
