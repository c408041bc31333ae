"""``/healthz``, ``/readyz`` and ``/metrics`` over HTTP (Starlette, served by uvicorn).

:func:`add_routes` puts them on an MCP server's HTTP app through the SDK's
``custom_route`` (``keel serve``); :func:`serve_http` serves them alone (``keel worker
--metrics-port``). ``/healthz`` answers ``ok`` while the process runs; ``/readyz``
answers 200 or 503 with a JSON body saying why (see :mod:`keel.telemetry.health`);
``/metrics`` is the Prometheus text.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from keel.telemetry import Telemetry
from keel.telemetry.metrics import CONTENT_TYPE

__all__ = ["PATHS", "add_routes", "endpoints", "http_app", "listen", "serve_http"]

PATHS = ("/healthz", "/readyz", "/metrics")

Endpoint = Callable[[Request], Awaitable[Response]]


def endpoints(telemetry: Telemetry) -> dict[str, Endpoint]:
    """The three endpoints, by path."""

    async def healthz(_request: Request) -> Response:
        return PlainTextResponse("ok\n")

    async def readyz(_request: Request) -> Response:
        readiness = telemetry.readiness()
        return JSONResponse(readiness.to_json(), status_code=200 if readiness.ready else 503)

    async def metrics(_request: Request) -> Response:
        return Response(await telemetry.exposition(), media_type=CONTENT_TYPE)

    return {"/healthz": healthz, "/readyz": readyz, "/metrics": metrics}


def add_routes(server: Any, telemetry: Telemetry) -> None:
    """Put the endpoints on ``server`` (an ``mcp`` ``MCPServer``), by its public
    ``custom_route``: they take no authorization, as health checks must not."""
    for path, endpoint in endpoints(telemetry).items():
        server.custom_route(path, methods=["GET"], include_in_schema=False)(endpoint)


def http_app(telemetry: Telemetry) -> Starlette:
    """A Starlette app of the endpoints alone."""
    routes = [Route(p, e, methods=["GET"]) for p, e in endpoints(telemetry).items()]
    return Starlette(routes=routes)


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: one the system chooses).

    Raises:
        OSError: the address cannot be listened on.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


async def serve_http(telemetry: Telemetry, sock: socket.socket, *, stop: anyio.Event) -> None:
    """Serve :func:`http_app` on the listening ``sock`` until ``stop`` is set."""
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server without its signal handlers: the worker owns SIGTERM and
        SIGINT, which uvicorn's would take from it (``capture_signals`` is the method its
        ``serve`` enters for them; overriding it is the seam a subclass has)."""

        @contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    config = uvicorn.Config(http_app(telemetry), log_level="warning", lifespan="off")
    server = Server(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        await stop.wait()
        server.should_exit = True
