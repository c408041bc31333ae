"""A 2025-11-25 tasks client over plain HTTP (``httpx2``, the SDK's own HTTP client).

The official Python client rejects a 2025-11-25 ``CreateTaskResult`` (its result sieve
knows only the 2026 shapes), so this speaks that protocol itself: the ``initialize``
handshake (session id, ``notifications/initialized``), JSON-RPC requests whose answers come
as JSON or as an SSE stream, and the server's own requests (``elicitation/create``),
wherever they arrive: on a request's SSE stream or on the session's GET stream, which it
keeps open when it can answer questions::

    async def on_input(message: str, schema: dict[str, Any], task_id: str | None):
        return {"service": "payments"}  # None declines

    async with LegacyClient(url, on_input=on_input) as client:
        task = await client.call_task("diagnose_root_cause", {"incident_id": "INC-7"})
        result = await client.request("tasks/result", {"taskId": task["taskId"]})

Without ``on_input`` the client declares no ``elicitation`` capability.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import anyio
import httpx2

from keel.errors import KeelError
from keel.mcp.v2025 import V2025
from keel.mcp.wire import RELATED_TASK, method_not_found

__all__ = ["InputCallback", "LegacyClient", "RpcError"]

InputCallback = Callable[[str, dict[str, Any], str | None], Awaitable[dict[str, Any] | None]]
"""``async (message, requested_schema, related_task_id) -> content``; None declines."""

SESSION = "mcp-session-id"


class RpcError(KeelError):
    """A JSON-RPC error answer: ``code``, ``message`` and ``data`` as the server sent them."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(f"{error.get('code')}: {error.get('message')}")
        self.code: int = error.get("code", 0)
        self.data: Any = error.get("data")
        self.error = error


class LegacyClient:
    """One 2025-11-25 session with a server (see the module docstring).

    Args:
        url: the server's Streamable HTTP endpoint.
        on_input: answers ``elicitation/create``; also declares the capability.
        token: a bearer token sent on every request.
        timeout: seconds any one HTTP read may take (``tasks/result`` blocks).
    """

    def __init__(
        self,
        url: str,
        *,
        on_input: InputCallback | None = None,
        token: str | None = None,
        timeout: float = 300.0,
    ) -> None:
        self.url = url
        self.on_input = on_input
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = timeout
        self.session_id: str | None = None
        self.capabilities: dict[str, Any] = {}
        self.notifications: list[dict[str, Any]] = []
        """Every notification the server sent (on any stream), in arrival order."""
        self.questions: list[tuple[str, dict[str, Any]]] = []
        """Every ``elicitation/create`` the server sent, in arrival order: the stream it
        came on (the method of the request whose answer carried it, or ``"GET"``) and its
        params."""
        self._ids = 0
        self._stack = AsyncExitStack()
        self._http: httpx2.AsyncClient | None = None

    async def __aenter__(self) -> LegacyClient:
        self._http = await self._stack.enter_async_context(
            httpx2.AsyncClient(timeout=self.timeout, headers=self.headers)
        )
        capabilities: dict[str, Any] = {"tasks": {"cancel": {}, "list": {}}}
        if self.on_input is not None:
            capabilities["elicitation"] = {"form": {}}
        result = await self.request(
            "initialize",
            {
                "protocolVersion": V2025,
                "capabilities": capabilities,
                "clientInfo": {"name": "keel-2025-client", "version": "0"},
            },
        )
        self.capabilities = result.get("capabilities", {})
        await self._post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        if self.on_input is not None:
            group = await self._stack.enter_async_context(anyio.create_task_group())
            self._stack.callback(group.cancel_scope.cancel)
            await group.start(self._listen)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    @property
    def http(self) -> httpx2.AsyncClient:
        assert self._http is not None, "use the client in `async with`"
        return self._http

    def _headers(self) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        }
        if self.session_id:
            headers[SESSION] = self.session_id
            headers["MCP-Protocol-Version"] = V2025
        return headers

    async def _post(self, message: dict[str, Any]) -> None:
        response = await self.http.post(
            self.url, content=json.dumps(message), headers=self._headers()
        )
        if response.status_code >= 400:
            raise KeelError(f"HTTP {response.status_code} for {message.get('method', 'a reply')}")

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send one request and return its result; server requests and notifications that
        come on its stream are handled on the way.

        Raises:
            RpcError: the server answered with a JSON-RPC error.
        """
        self._ids += 1
        message = {"jsonrpc": "2.0", "id": self._ids, "method": method, "params": params or {}}
        async with self.http.stream(
            "POST", self.url, content=json.dumps(message), headers=self._headers()
        ) as response:
            if SESSION in response.headers:
                self.session_id = response.headers[SESSION]
            if response.status_code >= 400 and "json" not in response.headers.get(
                "content-type", ""
            ):
                raise KeelError(f"HTTP {response.status_code} for {method}")
            if "text/event-stream" in response.headers.get("content-type", ""):
                async for event in _events(response):
                    if event.get("id") == self._ids and "method" not in event:
                        return _unwrap(event)
                    await self._handle(event, method)
                raise KeelError(f"the stream of {method} ended without an answer")
            return _unwrap(json.loads(await response.aread()))

    async def _listen(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """The session's GET stream: where a JSON-answering server sends its requests."""
        headers = {**self._headers(), "Accept": "text/event-stream"}
        async with self.http.stream("GET", self.url, headers=headers) as response:
            task_status.started()
            if response.status_code != 200:
                return
            async for event in _events(response):
                await self._handle(event, "GET")

    async def _handle(self, event: dict[str, Any], stream: str) -> None:
        method = event.get("method")
        if method is None:
            return
        if "id" not in event:
            self.notifications.append(event)
            return
        if method == "elicitation/create" and self.on_input is not None:
            params = event.get("params") or {}
            self.questions.append((stream, params))
            related = (params.get("_meta") or {}).get(RELATED_TASK) or {}
            content = await self.on_input(
                params.get("message", ""),
                params.get("requestedSchema") or {},
                related.get("taskId"),
            )
            answer: dict[str, Any] = (
                {"action": "decline"}
                if content is None
                else {"action": "accept", "content": content}
            )
            await self._post({"jsonrpc": "2.0", "id": event["id"], "result": answer})
        elif method == "ping":
            await self._post({"jsonrpc": "2.0", "id": event["id"], "result": {}})
        else:
            error = method_not_found()
            await self._post({"jsonrpc": "2.0", "id": event["id"], "error": error})

    # --- tasks ------------------------------------------------------------------------

    async def call_task(
        self, name: str, arguments: dict[str, Any], *, ttl_ms: int | None = None
    ) -> dict[str, Any]:
        """``tools/call`` with ``params.task``: the created ``Task``."""
        task: dict[str, Any] = {} if ttl_ms is None else {"ttl": ttl_ms}
        created = await self.request(
            "tools/call", {"name": name, "arguments": arguments, "task": task}
        )
        answer: dict[str, Any] = created["task"]
        return answer

    async def get(self, task_id: str) -> dict[str, Any]:
        return await self.request("tasks/get", {"taskId": task_id})

    async def result(self, task_id: str) -> dict[str, Any]:
        """``tasks/result``: blocks until the task ends (questions answered meanwhile)."""
        return await self.request("tasks/result", {"taskId": task_id})

    async def cancel(self, task_id: str) -> dict[str, Any]:
        return await self.request("tasks/cancel", {"taskId": task_id})

    async def until(self, task_id: str, *statuses: str, limit: float = 120.0) -> dict[str, Any]:
        """Poll ``tasks/get`` (at its ``pollInterval``) until one of ``statuses``."""
        with anyio.fail_after(limit):
            while True:
                task = await self.get(task_id)
                if task["status"] in statuses:
                    return task
                await anyio.sleep(min(task.get("pollInterval", 500), 500) / 1000)


def _unwrap(message: dict[str, Any]) -> dict[str, Any]:
    if "error" in message:
        raise RpcError(message["error"])
    result: dict[str, Any] = message.get("result", {})
    return result


async def _events(response: httpx2.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON-RPC messages of an SSE stream (``data:`` lines; blank line ends one)."""
    data: list[str] = []
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif not line and data:
            text = "\n".join(data)
            data = []
            if text.strip():
                yield json.loads(text)
