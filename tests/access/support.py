"""Helpers for the access tests: a Keel server behind :mod:`keel.mcp.access`, served by
uvicorn in the test's event loop on a socket bound to 127.0.0.1, and raw HTTP requests.

``serve_guarded(server, access)`` serves the same ASGI app ``keel serve`` runs
(:meth:`HttpAccess.app`), so the allow-lists, session limits and authentication under
test are the real ones; the socket is bound before uvicorn starts, so the port is known
and nothing else can take it.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp.server import MCPServer

from keel.mcp.access import HttpAccess, ServerAuth
from keel.mcp.admission import SessionGate
from keel.mcp.serving import app_server
from keel.runtime import Keel
from keel.store import SqliteStore
from tasks_extension.support import build_app, serve_asgi

__all__ = ["WAIT", "ManualClock", "Raw", "build", "raw", "serve_asgi", "serve_guarded"]

WAIT = 15.0  # seconds any one step may take (bounded waits, never sleeps)
HOST = "127.0.0.1"


def build(folder: Path, auth: ServerAuth | None = None) -> MCPServer[Any]:
    """The tasks of the extension tests on a fresh SQLite store in ``folder``, served as
    ``keel serve`` serves an app (:func:`keel.mcp.serving.app_server`)."""
    app = build_app(Keel(SqliteStore(folder / "keel.db")))
    return app_server(app, "keel-access-tests", state_dir=folder, auth=auth)


@asynccontextmanager
async def serve_guarded(
    server: MCPServer[Any], access: HttpAccess | None = None, gate: SessionGate | None = None
) -> AsyncIterator[str]:
    """Serve ``server`` behind ``access`` (default: the defaults of a loopback bind) on
    127.0.0.1, new sessions admitted by ``gate`` (default: ``access``'s, on the real
    clock); yield the MCP endpoint's URL; stop the server when the block ends."""
    sock = socket.socket()
    sock.bind((HOST, 0))
    port = int(sock.getsockname()[1])
    access = access or HttpAccess.for_bind(HOST, port)
    app = access.app(server, host=HOST, gate=gate, streamable_http_path="/mcp", json_response=True)
    async with serve_asgi(app, sock) as base:
        yield f"{base}/mcp"


class ManualClock:
    """A :class:`keel.mcp.admission.Clock` that moves only when a test says so."""

    def __init__(self) -> None:
        self.time = 0.0
        self.sleepers: list[tuple[float, anyio.Event]] = []

    def now(self) -> float:
        return self.time

    async def sleep_until(self, deadline: float) -> None:
        if deadline <= self.time:
            return
        woken = anyio.Event()
        self.sleepers.append((deadline, woken))
        await woken.wait()

    def advance(self, seconds: float) -> None:
        """Move on by ``seconds``; wake whoever slept until then."""
        self.time += seconds
        due = [s for s in self.sleepers if s[0] <= self.time]
        self.sleepers = [s for s in self.sleepers if s[0] > self.time]
        for _, woken in due:
            woken.set()


@dataclass(frozen=True)
class Raw:
    """One raw HTTP exchange: status, headers and body text."""

    status: int
    headers: Mapping[str, str]
    text: str

    @property
    def json(self) -> Any:
        return json.loads(self.text)


INITIALIZE_2025 = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "keel-access-tests", "version": "0"},
    },
}
"""An old-protocol ``initialize``: it opens a session that the server keeps."""


async def raw(
    url: str,
    *,
    method: str = "POST",
    body: Any = INITIALIZE_2025,
    headers: Mapping[str, str] | None = None,
) -> Raw:
    """One HTTP request with exactly ``headers`` (plus JSON content negotiation); the
    ``Host`` header is the URL's unless ``headers`` names another."""
    sent = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    sent.update(headers or {})
    async with httpx2.AsyncClient(timeout=WAIT) as client:
        response = await client.request(
            method, url, content=None if body is None else json.dumps(body), headers=sent
        )
    return Raw(response.status_code, dict(response.headers), response.text)
