"""Clients that do not declare the tasks extension never strand a task.

On 2026-07-28 a task that needs input answers such a client with an input-required
result (MRTR) whose ``requestState`` resumes that same task on the retry; a 2025-11-25
client that cannot be asked gets ``-32021`` and the task is cancelled, the reason in its
history. Failures reach every client with the same code and message.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.server import MCPServer
from mcp.server.request_state import RequestStateSecurity
from mcp.shared.exceptions import MCPError
from mcp_types import ElicitRequestParams, ElicitResult

from keel.errors import ConfigurationError
from keel.mcp.client import TasksClientExtension, accept
from keel.mcp.server import TasksExtension, keel_lifespan
from keel.mcp.state_key import KEY_FILE, KEY_VARIABLE, request_state_security
from keel.mcp.wire import TASK_CANCELLED
from keel.model import Status
from keel.runtime import Keel
from tasks_extension.support import post, serve_http

pytestmark = pytest.mark.anyio

ASK = {"name": "ask", "arguments": {"incident_id": "9"}}


async def test_a_plain_client_is_asked_and_its_retry_resumes_the_same_task(
    mcp_server: MCPServer[Any], keel_app: Keel
) -> None:
    """Round 1: input_required with the task's question and a requestState, the task
    stored input_required. A refused answer is -32602 naming the field and changes
    nothing. The retry with a good answer completes that task inline: one task in all."""
    async with serve_http(mcp_server) as url:
        asked = await post(url, "tools/call", ASK, declared=False)
        assert asked.result["resultType"] == "input_required"
        request = asked.result["inputRequests"]["service"]
        assert request["method"] == "elicitation/create"
        assert request["params"]["message"] == "Which service is affected?"
        state = asked.result["requestState"]
        [task] = await keel_app.store.list()
        assert task.status is Status.INPUT_REQUIRED

        wrong = await post(
            url,
            "tools/call",
            {**ASK, "requestState": state, "inputResponses": {"service": accept({"service": 7})}},
            declared=False,
        )
        assert wrong.error["code"] == -32602
        assert "service" in wrong.error["message"]
        assert (await keel_app.store.get(task.task_id)).status is Status.INPUT_REQUIRED

        done = await post(
            url,
            "tools/call",
            {
                **ASK,
                "requestState": state,
                "inputResponses": {"service": accept({"service": "db"})},
            },
            declared=False,
        )
    assert done.result["resultType"] == "complete"
    assert done.result["structuredContent"] == {"incident": "9", "service": "db"}
    assert [t.task_id for t in await keel_app.store.list()] == [task.task_id]


async def test_a_request_state_for_another_tool_is_refused(
    mcp_server: MCPServer[Any], keel_app: Keel
) -> None:
    """The requestState names a task of ``ask``: replayed on another tool it is -32602,
    and the task is untouched."""
    async with serve_http(mcp_server) as url:
        asked = await post(url, "tools/call", ASK, declared=False)
        state = asked.result["requestState"]
        refused = await post(
            url,
            "tools/call",
            {"name": "two", "arguments": {}, "requestState": state},
            declared=False,
        )
    assert refused.error["code"] == -32602
    [task] = await keel_app.store.list()
    assert task.status is Status.INPUT_REQUIRED


async def test_the_official_client_answers_through_its_elicitation_callback(
    mcp_server: MCPServer[Any],
) -> None:
    """The official Python client without the extension drives the MRTR rounds itself:
    its elicitation callback is asked, and call_tool returns the task's result."""
    questions: list[str] = []

    async def on_elicit(_ctx: Any, params: ElicitRequestParams) -> ElicitResult:
        questions.append(params.message)
        return ElicitResult(action="accept", content={"service": "payments"})

    async with Client(mcp_server, elicitation_callback=on_elicit) as client:
        result = await client.call_tool("ask", {"incident_id": "3"})
    assert questions == ["Which service is affected?"]
    assert result.structured_content == {"incident": "3", "service": "payments"}


async def test_a_legacy_client_that_cannot_be_asked_gets_32021_and_the_task_is_cancelled(
    mcp_server: MCPServer[Any], keel_app: Keel
) -> None:
    """At 2025-11-25 there is no MRTR: without a way to ask, the call answers -32021 and
    the task is cancelled (not left input_required), the reason in its history."""
    async with Client(mcp_server, mode="legacy") as client:
        with pytest.raises(MCPError) as raised:
            await client.call_tool("ask", {"incident_id": "4"})
    assert raised.value.error.code == -32021
    [task] = await keel_app.store.list()
    assert task.status is Status.CANCELLED
    assert task.task_id in raised.value.error.message
    history = await keel_app.store.history(task.task_id)
    assert "needs input (service)" in str(history[-1])


async def test_failures_reach_every_client_with_the_same_code_and_message(
    mcp_server: MCPServer[Any],
) -> None:
    """A failed task: the plain client's error and Keel's client's error are the same
    JSON-RPC error (the code is not lost in an isError result)."""
    async with Client(mcp_server) as plain:
        with pytest.raises(MCPError) as inline:
            await plain.call_tool("protocol_error", {})
    async with Client(mcp_server, extensions=[TasksClientExtension()]) as keel:
        with pytest.raises(MCPError) as polled:
            await keel.call_tool("protocol_error", {})
    assert inline.value.error.code == polled.value.error.code != TASK_CANCELLED
    assert inline.value.error.message == polled.value.error.message


async def test_a_request_state_outlives_the_server_that_sealed_it(
    keel_app: Keel, tmp_path: Path
) -> None:
    """Sealed with the key kept beside the store, the state handed out by one server
    process is accepted by the next one (a restart between question and answer); a
    server with a key of its own refuses it (-32602) and the task keeps waiting."""
    security = request_state_security(tmp_path)

    def server(policy: RequestStateSecurity | None) -> MCPServer[Any]:
        return MCPServer(
            "keel-tests",
            extensions=[TasksExtension(keel_app)],
            lifespan=keel_lifespan(keel_app),
            request_state_security=policy,
        )

    async with serve_http(server(security)) as url:
        asked = await post(url, "tools/call", ASK, declared=False)
    retry = {
        **ASK,
        "requestState": asked.result["requestState"],
        "inputResponses": {"service": accept({"service": "db"})},
    }
    async with serve_http(server(None)) as url:  # the SDK's default: a key of its own
        refused = await post(url, "tools/call", retry, declared=False)
    assert refused.error["code"] == -32602
    [task] = await keel_app.store.list()
    assert task.status is Status.INPUT_REQUIRED
    async with serve_http(server(request_state_security(tmp_path))) as url:
        done = await post(url, "tools/call", retry, declared=False)
    assert done.result["structuredContent"] == {"incident": "9", "service": "db"}


def test_the_request_state_key_is_made_once_and_kept_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key file is created on first use (mode 0600) and read back after; the
    environment variable wins; a short key is a ConfigurationError naming its source."""
    monkeypatch.delenv(KEY_VARIABLE, raising=False)
    request_state_security(tmp_path)
    key_file = tmp_path / KEY_FILE
    first = key_file.read_text()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    request_state_security(tmp_path)
    assert key_file.read_text() == first
    assert [p.name for p in tmp_path.iterdir()] == [KEY_FILE]  # no temporary file left
    monkeypatch.setenv(KEY_VARIABLE, "short")
    with pytest.raises(ConfigurationError, match=KEY_VARIABLE):
        request_state_security(tmp_path)
