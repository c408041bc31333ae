"""Every request path that reads or writes the store, for the tests that break the store.

A broken store (PostgreSQL stopped, a SQLite file with damaged pages) must be answered
by the one error table on every path of both protocol generations, never as ``-32603``.
:func:`store_errors` sends one request down each path of :data:`PATHS` to a server
whose store is broken and returns the JSON-RPC error each one got; the tests assert the
code (``-32050`` unavailable, ``-32051`` damaged) for all of them.

The server is :func:`server_without_workers` (bearer auth, so that 2025-11-25
``tasks/list`` is served; no workers, which would only fill the log with the same
failure).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from mcp.server import MCPServer

from keel.mcp.client_v2025 import LegacyClient, RpcError
from keel.mcp.server import TasksExtension, keel_lifespan
from keel.runtime import Keel
from tasks_extension.support import TokenVerifier, auth_settings, post

__all__ = ["OWNER", "PATHS", "TOKEN", "server_without_workers", "store_errors"]

OWNER = "alice"
"""The principal of :data:`TOKEN`: the owner of the tasks to look up."""
TOKEN = f"tok-{OWNER}"  # TokenVerifier's bearer token for OWNER
ANSWER_WITHIN = 30.0  # seconds one refused request may take at most (well over any timeout)

Path = Callable[[str, LegacyClient, str], Awaitable[dict[str, Any]]]
"""``(url, legacy_client, task_id) -> the JSON-RPC error``."""


def server_without_workers(app: Keel) -> MCPServer[Any]:
    """An authenticating MCPServer over ``app`` serving both task protocols, no workers."""
    tasks = TasksExtension(app)
    return MCPServer(
        "keel-broken-store",
        extensions=[tasks],
        middleware=[tasks.middleware()],
        lifespan=keel_lifespan(app, run_workers=False),
        token_verifier=TokenVerifier(),
        auth=auth_settings(),
    )


def _modern(method: str, params: Callable[[str], dict[str, Any]], *, declared: bool = True) -> Path:
    async def send(url: str, _legacy: LegacyClient, task_id: str) -> dict[str, Any]:
        answer = await post(url, method, params(task_id), token=TOKEN, declared=declared)
        return answer.error

    return send


def _legacy(method: str, params: Callable[[str], dict[str, Any]]) -> Path:
    async def send(_url: str, legacy: LegacyClient, task_id: str) -> dict[str, Any]:
        try:
            result = await legacy.request(method, params(task_id))
        except RpcError as exc:
            return exc.error
        raise AssertionError(f"{method} succeeded on a broken store: {result}")

    return send


PATHS: dict[str, Path] = {
    "2026 tools/call (task)": _modern(
        "tools/call", lambda _: {"name": "quick", "arguments": {"n": 1}}
    ),
    "2026 tools/call (inline)": _modern(
        "tools/call", lambda _: {"name": "quick", "arguments": {"n": 1}}, declared=False
    ),
    "2026 tasks/get": _modern("tasks/get", lambda task_id: {"taskId": task_id}),
    "2026 tasks/update": _modern(
        "tasks/update",
        lambda task_id: {"taskId": task_id, "inputResponses": {"k": {"action": "decline"}}},
    ),
    "2026 tasks/cancel": _modern("tasks/cancel", lambda task_id: {"taskId": task_id}),
    "2025 tools/call (task)": _legacy(
        "tools/call", lambda _: {"name": "quick", "arguments": {"n": 1}, "task": {}}
    ),
    "2025 tools/call (inline)": _legacy(
        "tools/call", lambda _: {"name": "quick", "arguments": {"n": 1}}
    ),
    "2025 tasks/get": _legacy("tasks/get", lambda task_id: {"taskId": task_id}),
    "2025 tasks/result": _legacy("tasks/result", lambda task_id: {"taskId": task_id}),
    "2025 tasks/cancel": _legacy("tasks/cancel", lambda task_id: {"taskId": task_id}),
    "2025 tasks/list": _legacy("tasks/list", lambda _: {}),
    "2025 tasks/list (cursor)": _legacy("tasks/list", lambda task_id: {"cursor": task_id}),
}


async def store_errors(
    url: str,
    task_id: str,
    *,
    before: Callable[[], Awaitable[object]] | None = None,
    took: dict[str, float] | None = None,
) -> dict[str, dict[str, Any]]:
    """The JSON-RPC error of each of :data:`PATHS` for ``task_id`` (one of :data:`OWNER`'s
    tasks) on the server at ``url``; ``before`` breaks the store once the 2025-11-25
    session is open (its handshake does not touch the store); ``took`` receives the
    seconds each answer took."""
    errors: dict[str, dict[str, Any]] = {}
    async with LegacyClient(url, token=TOKEN, timeout=ANSWER_WITHIN) as legacy:
        if before is not None:
            await before()
        for name, path in PATHS.items():
            started = time.monotonic()
            with anyio.fail_after(ANSWER_WITHIN):
                errors[name] = await path(url, legacy, task_id)
            if took is not None:
                took[name] = time.monotonic() - started
    return errors
