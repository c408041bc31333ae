"""Helpers for the tasks-extension tests: a real HTTP server in the test's event loop, raw
JSON-RPC over HTTP, bearer-token principals, and the extension's request models.

``listen(url, notifications)`` opens a raw ``subscriptions/listen`` stream and reads its
SSE frames one at a time.

``serve_http(server)`` runs the SDK's Streamable HTTP app for an ``MCPServer`` under
uvicorn on 127.0.0.1 (a port the OS picks), and stops it when the block ends. ``post``
sends one hand-written 2026-07-28 request, so a test controls every header and ``_meta``
key and sees the HTTP status as well as the JSON-RPC body.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx2
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server import MCPServer
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context
from mcp_types import Result
from starlette.types import ASGIApp

from keel.mcp.client import (
    CancelTask,
    Detailed,
    GetTask,
    TaskIdParams,
    UpdateParams,
    UpdateTask,
)
from keel.mcp.client import TasksClientExtension as Tasks
from keel.mcp.server import TasksExtension, keel_lifespan
from keel.mcp.wire import TASKS_EXTENSION
from keel.runtime import Keel, TaskContext, TaskFailed, ToolError

__all__ = [
    "NOT_FOUND",
    "SERVICE",
    "VERSION",
    "WAIT",
    "Answer",
    "Listen",
    "TokenVerifier",
    "auth_settings",
    "build_app",
    "build_server",
    "cancel",
    "client_as",
    "get",
    "listen",
    "meta",
    "poll",
    "post",
    "serve_asgi",
    "serve_http",
    "update",
    "wait_for",
]

VERSION = "2026-07-28"
WAIT = 15.0  # seconds any one step of a flow may take (bounded waits, never sleeps)
NOT_FOUND = "Failed to retrieve task: Task not found"
"""What tasks/* answer (-32602) for unknown, purged and other principals' task ids."""

SERVICE = {"type": "object", "required": ["service"], "properties": {"service": {"type": "string"}}}
CONFIRM = {
    "type": "object",
    "required": ["confirm"],
    "properties": {"confirm": {"type": "boolean"}},
}
INCIDENT = {
    "type": "object",
    "required": ["incident_id"],
    "properties": {"incident_id": {"type": "string", "pattern": "^INC-[0-9]+$"}},
}


def build_app(app: Keel) -> Keel:
    """Register the tasks the extension tests drive on ``app`` (whose store they choose).

    | task | behaviour |
    |---|---|
    | ``ask`` | asks which service (SERVICE), returns it with the incident id |
    | ``two`` | asks two questions at once (``service``, ``confirm``) |
    | ``sequence`` | asks SERVICE, then CONFIRM, one after the other (default keys) |
    | ``slow`` | runs until cancelled |
    | ``quick`` | ``n: int`` -> ``{"n": 2n}`` |
    | ``kept`` | returns at once; its record has no TTL (``ttlMs: null``) |
    | ``tool_error`` | a tool error: completed with isError |
    | ``protocol_error`` | a JSON-RPC error -32001: failed |
    | ``required`` | task_mode="required", returns "done" |
    | ``typed`` | arguments checked by an input_schema (``incident_id`` ``INC-<n>``) |
    | ``ask_first`` | asks ``user_name`` synchronously (MRTR), then runs as a task |
    """

    @app.task("ask", poll_interval=0.05, max_attempts=1)
    async def ask(ctx: TaskContext, incident_id: str) -> dict[str, str]:
        answer = await ctx.elicit("Which service is affected?", SERVICE, key="service")
        return {"incident": incident_id, "service": answer["service"]}

    @app.task("two", poll_interval=0.05, max_attempts=1)
    async def two(ctx: TaskContext) -> dict[str, Any]:
        answers = await ctx.elicit_many(
            {"service": ("Which service?", SERVICE), "confirm": ("Proceed?", CONFIRM)}
        )
        return {"service": answers["service"]["service"], "confirm": answers["confirm"]["confirm"]}

    @app.task("sequence", poll_interval=0.05, max_attempts=1)
    async def sequence(ctx: TaskContext) -> dict[str, Any]:
        first = await ctx.elicit("Which service?", SERVICE)
        second = await ctx.elicit("Restart it?", CONFIRM)
        return {"service": first["service"], "restart": second["confirm"]}

    @app.task("slow", poll_interval=0.05, max_attempts=1)
    async def slow(ctx: TaskContext) -> str:
        await ctx.status("working on it")
        await anyio.sleep_forever()
        return "never"  # pragma: no cover

    @app.task("quick", poll_interval=0.05)
    async def quick(ctx: TaskContext, n: int) -> dict[str, int]:
        return {"n": n * 2}

    @app.task("kept", poll_interval=0.05, ttl_seconds=None)
    async def kept(ctx: TaskContext) -> str:
        return "kept for good"

    @app.task("tool_error", poll_interval=0.05, max_attempts=1)
    async def tool_error(ctx: TaskContext) -> str:
        raise ToolError("no such incident")

    @app.task("protocol_error", poll_interval=0.05, max_attempts=1)
    async def protocol_error(ctx: TaskContext) -> str:
        raise TaskFailed("upstream API refused the request", code=-32001)

    @app.task("required", poll_interval=0.05, task_mode="required")
    async def required(ctx: TaskContext) -> str:
        return "done"

    @app.task("typed", poll_interval=0.05, input_schema=INCIDENT)
    async def typed(ctx: TaskContext, incident_id: str) -> str:
        return incident_id

    @app.task(
        "ask_first",
        poll_interval=0.05,
        task_mode="required",
        ask_first={"user_name": ("What is your name?", SERVICE)},
    )
    async def ask_first(ctx: TaskContext) -> str:
        answer = await ctx.elicit("What is your name?", SERVICE, key="user_name")
        return f"hello {answer['service']}"

    return app


def build_server(
    app: Keel, *, auth: bool = False, rate_limit_polls: bool = False
) -> MCPServer[Any]:
    """An MCPServer over ``app`` with its workers, a plain ``declared`` tool that reports
    the extensions the calling request declared, bearer auth if ``auth``, and poll rate
    limiting if ``rate_limit_polls``."""
    options: dict[str, Any] = (
        {"token_verifier": TokenVerifier(), "auth": auth_settings()} if auth else {}
    )
    tasks = TasksExtension(app, rate_limit_polls=rate_limit_polls)
    push = tasks.push()
    server: MCPServer[Any] = MCPServer(
        "keel-tests",
        extensions=[tasks],
        middleware=[tasks.middleware(), push],  # the 2025-11-25 tasks protocol; push
        subscriptions=push.bus,
        lifespan=push.lifespan(keel_lifespan(app, concurrency=4)),
        **options,
    )

    @server.tool(structured_output=False)
    def declared(ctx: Context) -> str:
        """The extension ids this very request declared (a plain tool, never a task)."""
        capabilities = ctx.request_context.session.client_capabilities
        extensions = capabilities.extensions if capabilities is not None else None
        return json.dumps(sorted(extensions or {}))

    return server


@dataclass(frozen=True)
class Answer:
    """One HTTP exchange: the status and the JSON-RPC body."""

    status: int
    body: dict[str, Any]

    @property
    def error(self) -> dict[str, Any]:
        error = self.body.get("error")
        assert isinstance(error, dict), f"expected a JSON-RPC error, got {self.body}"
        return error

    @property
    def result(self) -> dict[str, Any]:
        result = self.body.get("result")
        assert isinstance(result, dict), f"expected a JSON-RPC result, got {self.body}"
        return result


def headers_for(
    method: str, *, name: str | None = None, token: str | None = None
) -> dict[str, str]:
    """The HTTP headers a 2026-07-28 client sends with ``method``."""
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": method,
    }
    if name is not None:
        headers["Mcp-Name"] = name
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def meta(*, declared: bool = True, capabilities: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A 2026-07-28 request's ``_meta``: the protocol version and per-request capabilities."""
    if capabilities is None:
        capabilities = {"extensions": {TASKS_EXTENSION: {}}} if declared else {}
    return {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientCapabilities": dict(capabilities),
        "io.modelcontextprotocol/clientInfo": {"name": "keel-tests", "version": "0"},
    }


async def post(
    url: str,
    method: str,
    params: Mapping[str, Any] | None = None,
    *,
    declared: bool = True,
    capabilities: Mapping[str, Any] | None = None,
    name: str | None = None,
    omit_name: bool = False,
    method_header: str | None = None,
    token: str | None = None,
) -> Answer:
    """POST one JSON-RPC request the way a 2026-07-28 client does, with control over it.

    ``name`` is the ``Mcp-Name`` header; by default ``params.taskId`` (tasks/*) or
    ``params.name`` (tools/call), as the official client sends it; ``omit_name`` sends
    none. ``method_header`` is the ``Mcp-Method`` header (default: ``method``).
    """
    body_params = dict(params or {})
    body_params["_meta"] = meta(declared=declared, capabilities=capabilities)
    if name is None and not omit_name:
        name = body_params.get("taskId") or (
            body_params.get("name") if method == "tools/call" else None
        )
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": method_header or method,
    }
    if name is not None:
        headers["Mcp-Name"] = name
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": body_params}
    async with httpx2.AsyncClient(timeout=WAIT) as http:
        response = await http.post(url, content=json.dumps(message), headers=headers)
    body = json.loads(response.text) if response.text else {}
    return Answer(response.status_code, body)


@asynccontextmanager
async def serve_http(server: MCPServer[Any], *, json_response: bool = True) -> AsyncIterator[str]:
    """Serve ``server`` over Streamable HTTP on 127.0.0.1 (JSON responses unless
    ``json_response=False``: SSE); yield its URL; stop it when the block exits."""
    app = server.streamable_http_app(json_response=json_response, host="127.0.0.1")
    async with serve_asgi(app) as base:
        yield f"{base}/mcp"


@asynccontextmanager
async def serve_asgi(app: ASGIApp, sock: socket.socket | None = None) -> AsyncIterator[str]:
    """Serve the ASGI ``app`` with uvicorn on ``sock`` (default: a new socket bound to
    127.0.0.1); yield its base URL; stop it (lifespan included) when the block ends.

    The listening socket is bound before uvicorn starts, so the port is known and
    nothing else can take it.
    """
    if sock is None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    config = uvicorn.Config(app, log_config=None, log_level="warning", lifespan="on")
    http = uvicorn.Server(config)
    stopped = anyio.Event()

    async def serve() -> None:
        try:
            await http.serve(sockets=[sock])
        finally:
            stopped.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            with anyio.fail_after(WAIT):
                while not http.started:  # noqa: ASYNC110 - uvicorn offers no event for it
                    await anyio.sleep(0.01)
            try:
                yield f"http://127.0.0.1:{port}"
            finally:
                # A graceful stop (lifespan shutdown included) even when the test failed.
                http.should_exit = True
                with anyio.CancelScope(shield=True), anyio.move_on_after(WAIT):
                    await stopped.wait()
    finally:
        sock.close()


class TokenVerifier:
    """Bearer tokens ``tok-<name>`` are principal ``<name>``; anything else is refused."""

    async def verify_token(self, token: str) -> AccessToken | None:
        if not token.startswith("tok-"):
            return None
        return AccessToken(
            token=token,
            client_id="keel-tests",
            scopes=[],
            subject=token.removeprefix("tok-"),
            claims={"iss": "http://127.0.0.1"},
        )


def auth_settings() -> AuthSettings:
    """A resource server that only verifies tokens (no authorization server of its own)."""
    return AuthSettings(issuer_url="http://127.0.0.1:9", resource_server_url=None)  # type: ignore[arg-type]


@asynccontextmanager
async def client_as(url: str, token: str | None, *, declared: bool = True) -> AsyncIterator[Client]:
    """The official client over HTTP, sending ``Authorization: Bearer <token>``."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=WAIT) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, extensions=[Tasks()] if declared else None) as client:
            yield client


async def get(client: Client, task_id: str) -> dict[str, Any]:
    """``tasks/get`` through the official client: the detailed task as wire JSON."""
    task = await client.session.send_request(
        GetTask(params=TaskIdParams(task_id=task_id)), Detailed
    )
    return task.model_dump(by_alias=True, mode="json", exclude_none=True)


async def update(client: Client, task_id: str, responses: Mapping[str, Any]) -> dict[str, Any]:
    """``tasks/update`` through the official client: the ack as wire JSON."""
    ack = await client.session.send_request(
        UpdateTask(params=UpdateParams(task_id=task_id, input_responses=dict(responses))),
        Result,
    )
    return ack.model_dump(by_alias=True, mode="json", exclude_none=True)


async def cancel(client: Client, task_id: str) -> dict[str, Any]:
    """``tasks/cancel`` through the official client: the ack as wire JSON."""
    ack = await client.session.send_request(
        CancelTask(params=TaskIdParams(task_id=task_id)), Result
    )
    return ack.model_dump(by_alias=True, mode="json", exclude_none=True)


async def wait_for(client: Client, task_id: str, *statuses: str) -> dict[str, Any]:
    """Poll ``tasks/get`` until the task has one of ``statuses`` (bounded by WAIT)."""
    with anyio.fail_after(WAIT):
        while True:
            task = await get(client, task_id)
            if task["status"] in statuses:
                return task
            await anyio.sleep(0.02)


async def poll(url: str, task_id: str, *statuses: str, token: str | None = None) -> dict[str, Any]:
    """Raw ``tasks/get`` over HTTP until the task has one of ``statuses`` (bounded)."""
    with anyio.fail_after(WAIT):
        while True:
            answer = await post(url, "tasks/get", {"taskId": task_id}, token=token)
            if answer.result["status"] in statuses:
                return answer.result
            await anyio.sleep(0.02)


class Listen:
    """One raw ``subscriptions/listen`` exchange: the HTTP status and content type, and
    its frames (JSON-RPC messages) read one by one from the SSE body."""

    def __init__(self, response: httpx2.Response) -> None:
        self.response = response
        self.status = response.status_code
        self.content_type = response.headers.get("content-type", "")
        self._lines = response.aiter_lines()

    async def body(self) -> dict[str, Any]:
        """A JSON (not SSE) answer: an error refused before the stream opened."""
        body: dict[str, Any] = json.loads(await self.response.aread())
        return body

    async def frame(self, within: float = WAIT) -> dict[str, Any] | None:
        """The next frame (bounded by ``within`` seconds), None once the stream has ended;
        SSE comments (the SDK's keep-alive pings) are skipped."""
        data: list[str] = []
        with anyio.fail_after(within):
            async for line in self._lines:
                if line.startswith("data:"):
                    data.append(line[5:].strip())
                elif not line and data:
                    frame: dict[str, Any] = json.loads("\n".join(data))
                    return frame
        return None

    async def notification(self, within: float = WAIT) -> dict[str, Any]:
        """The next frame, which must be a notification."""
        frame = await self.frame(within)
        assert frame is not None, "the stream ended"
        assert "method" in frame, f"expected a notification, got {frame}"
        return frame


@asynccontextmanager
async def listen(
    url: str,
    notifications: Mapping[str, Any],
    *,
    request_id: int | str = "listen-1",
    declared: bool = True,
    token: str | None = None,
) -> AsyncIterator[Listen]:
    """POST ``subscriptions/listen`` with ``notifications`` as a 2026-07-28 client does
    and yield the open exchange; leaving the block disconnects."""
    params = {"notifications": dict(notifications), "_meta": meta(declared=declared)}
    message = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "subscriptions/listen",
        "params": params,
    }
    timeout = httpx2.Timeout(WAIT, read=None)
    async with (
        httpx2.AsyncClient(timeout=timeout) as http,
        http.stream(
            "POST",
            url,
            content=json.dumps(message),
            headers=headers_for("subscriptions/listen", token=token),
        ) as response,
    ):
        yield Listen(response)
