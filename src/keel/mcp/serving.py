"""The MCP server of a Keel app, and the seam through which ``keel serve`` serves an app.

:func:`app_server` builds the server of a Keel app; the Bridge, the conformance app and
``keel serve --app MODULE:ATTR`` all go through it, so that every one of them says who it
is the same way.

An app module, served by ``keel serve --app NAME`` (the built-in ``bridge`` and
``conformance``: ``keel.bridge``, ``keel.conformance``) or ``keel serve --app MODULE``
(one of your own), is a module with:

``build_server(settings: ServeSettings, **options) -> Served``
    Required. Builds the app on ``settings.store`` and its server (with
    :meth:`ServeSettings.server_for`), preparing whatever data it needs; ``options`` are
    the values of its ``serve_options``, by parameter name.

``serve_options: Sequence[click.Option]``
    Optional. The app's own ``keel serve`` options (each with its environment variable);
    ``keel serve`` shows them in its help, reads them from the ``[serve]`` table of its
    TOML file too, and refuses them on the command line of another app. A module of your
    own is imported while keel serve parses its arguments, when ``--app`` or
    ``$KEEL_APP`` names it, so that its options are known.

``config_problem(key: str, value: object) -> str | None``
    Optional. What is wrong with the type of a TOML value for one of its options (None:
    nothing), for a clear refusal before click converts it.

A built-in app whose options are read from a lighter module than the app itself (so
that parsing ``keel serve``'s arguments does not import every app) names that module in
``keel.cli.serve.OPTIONS_OF``: the Bridge's live in ``keel.bridge.serving``.

A plain Keel app (``--app MODULE:ATTR``) needs none of these: :func:`serve_keel_app`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from mcp.server import MCPServer
from mcp_types import RequestId
from starlette.types import ASGIApp

from keel.mcp.access import HttpAccess, ServerAuth
from keel.mcp.plain_tools import plain_tool_arguments
from keel.mcp.server import TasksExtension, keel_lifespan
from keel.mcp.state_key import request_state_security
from keel.mcp.stdio_relay import StdoutRelay
from keel.mcp.trace_polls import TracePolls
from keel.mcp.version import keel_version
from keel.runtime import Keel
from keel.telemetry import Telemetry

__all__ = [
    "ServeSettings",
    "Served",
    "app_server",
    "run_http",
    "run_stdio",
    "serve_keel_app",
]

STOP_WAIT = 9.0  # seconds a signalled stdio server waits for its lifespan to close the store
STREAMS_WAIT = 3.0  # seconds a signalled stdio server waits for its listen streams' results
FLUSH_WAIT = 2.0  # seconds a stdio server waits for what it wrote last to reach stdout
REQUEST_GRACE = 2  # seconds (uvicorn takes whole ones) open requests get after a signal

Lifespan = Callable[[MCPServer[Any]], AbstractAsyncContextManager[dict[str, Any]]]
Draining = Callable[[], Awaitable[Collection[RequestId]]]
"""Waits until something that answers requests has ended; the ids of the requests whose
answers it left to the transport to write (:meth:`keel.mcp.push.TaskPush.wait_closed`)."""


def app_server(
    app: Keel,
    name: str,
    *,
    rate_limit_polls: bool = False,
    concurrency: int = 4,
    run_workers: bool = True,
    state_dir: Path | None = None,
    close_store: bool = False,
    closed: threading.Event | None = None,
    auth: ServerAuth | None = None,
    stopping: list[Callable[[], None]] | None = None,
    draining: list[Draining] | None = None,
    telemetry: Telemetry | None = None,
) -> MCPServer[Any]:
    """An ``MCPServer`` named ``name`` serving ``app``'s tasks through the tasks extension
    (and the 2025-11-25 tasks protocol, :mod:`keel.mcp.v2025`), with ``concurrency``
    workers in its lifespan (none unless ``run_workers``); its ``serverInfo.version`` is
    Keel's version. Plain tools may be added to it; they refuse arguments they do not
    take (:mod:`keel.mcp.plain_tools`).

    ``state_dir`` keeps the key that seals ``requestState`` (see ``keel.mcp.state_key``),
    so a client asked for input before a restart can still answer after it; without one
    the key lives in this process only.

    ``close_store``: the lifespan closes the app's store when it ends, once the workers
    have given their tasks back (``keel serve``, whose process ends with it: closing a
    SQLite store folds its WAL into the file). Off for servers that tests connect to
    several times. ``closed``, if given, is set once the store is closed.

    ``auth``: bearer tokens required on every HTTP request (:mod:`keel.mcp.access`); the
    token's principal owns the tasks it creates.
    ``stopping``, if given, gets what must run when a signal stops the server, before
    open requests get their grace: ending the listen streams gracefully
    (:meth:`keel.mcp.push.TaskPush.close`); :func:`run_http` takes it as ``on_stop``.
    ``draining``, if given, gets what to wait for after that, before the server stops
    serving (:meth:`~keel.mcp.push.TaskPush.wait_closed`); :func:`run_stdio` takes both.
    ``telemetry``: its ``/healthz``, ``/readyz`` and ``/metrics`` on the HTTP app, and its
    readiness reads in the lifespan (:mod:`keel.telemetry`).

    Raises:
        ConfigurationError: the request-state key cannot be read or is too short.
    """
    tasks = TasksExtension(app, rate_limit_polls=rate_limit_polls)
    push = tasks.push()  # notifications/tasks on subscriptions/listen (keel.mcp.push)
    if stopping is not None:
        stopping.append(push.close)
    if draining is not None:
        draining.append(push.wait_closed)
    lifespan = keel_lifespan(app, concurrency=concurrency, run_workers=run_workers)
    if telemetry is not None:
        lifespan = telemetry.lifespan(lifespan)
        telemetry.stream_counts.append(lambda: push.streams)
    lifespan = push.lifespan(lifespan)
    server: MCPServer[Any] = MCPServer(
        name,
        version=keel_version(),
        request_state_security=request_state_security(state_dir),
        extensions=[tasks],
        # The 2025-11-25 tasks protocol on the same tasks, then task push notifications.
        middleware=[tasks.middleware(), push],
        subscriptions=push.bus,
        lifespan=_closing(lifespan, app, closed) if close_store else lifespan,
        auth=None if auth is None else auth.settings,
        token_verifier=None if auth is None else auth.verifier,
    )
    # Plain tools added later refuse arguments they do not take (keel.mcp.plain_tools).
    server.middleware.append(plain_tool_arguments(server, app.tasks))
    # Before the SDK's OpenTelemetry middleware: polls of a task join the task's trace.
    server.middleware.insert(0, TracePolls(app))
    if telemetry is not None:
        from keel.telemetry.routes import add_routes

        add_routes(server, telemetry)
    return server


def _closing(lifespan: Lifespan, app: Keel, closed: threading.Event | None) -> Lifespan:
    """``lifespan``, then the app's store closed (shielded: a cancelled server closes it
    too), then ``closed`` set."""

    @asynccontextmanager
    async def closing(server: MCPServer[Any]) -> AsyncIterator[dict[str, Any]]:
        try:
            async with lifespan(server) as state:
                yield state
        finally:
            with anyio.CancelScope(shield=True):
                await app.close()
            if closed is not None:
                closed.set()

    return closing


def run_http(
    server: MCPServer[Any],
    *,
    host: str,
    port: int,
    access: HttpAccess | None = None,
    on_stop: Iterable[Callable[[], None]] = (),
    mounts: Mapping[str, ASGIApp] | None = None,
    json_logs: bool = False,
    **options: Any,
) -> None:
    """Serve ``server`` over streamable HTTP until SIGTERM / SIGINT, then exit 0 within
    10 s: requests still open :data:`REQUEST_GRACE` seconds after the signal (a plain
    client's ``tools/call`` waiting for a long task) are cut, then the lifespan ends (the
    workers give their tasks back, the store is closed). ``on_stop`` runs first, as the
    stop begins (listen streams end gracefully, not cut by the grace's end). ``options``
    go to the SDK's ``streamable_http_app``; ``access`` (default:
    :meth:`HttpAccess.for_bind`) sets the Host / Origin allow-lists and the session
    limits (:mod:`keel.mcp.access`).
    ``mounts`` are other apps served beside it, by path (the operator console at
    ``/ops``), outside the MCP endpoint, behind the same allow-lists. ``json_logs``:
    uvicorn's loggers keep no handlers of their
    own, so that its lines go through the root's (JSON, :mod:`keel.telemetry.logs`).

    The SDK's ``run("streamable-http")`` builds its own uvicorn config, without a bound
    on the graceful shutdown: an open request kept the process from ever exiting. Its
    lowest public seam, ``streamable_http_app``, is served here with uvicorn as it does.
    """
    import uvicorn  # the SDK's own HTTP server, imported as it does: only when serving

    access = access or HttpAccess.for_bind(host, port)
    app = access.app(server, host=host, mounts=mounts, **options)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=server.settings.log_level.lower(),
        timeout_graceful_shutdown=REQUEST_GRACE,
        log_config=None if json_logs else uvicorn.config.LOGGING_CONFIG,
    )
    hooks = list(on_stop)

    class Stopping(uvicorn.Server):
        # uvicorn waits for open responses before the lifespan ends: a listen stream
        # would hold the stop for the whole grace, then be cut. ``shutdown`` is public.
        async def shutdown(self, sockets: Any = None) -> None:
            for hook in hooks:
                hook()
            await super().shutdown(sockets)

    _exit_zero_on_signals()
    anyio.run(Stopping(config).serve)


def _exit_zero_on_signals() -> None:
    """SIGTERM and SIGINT end the process with exit code 0, wherever they come.

    While uvicorn serves, it holds both signals itself: it stops gracefully, then puts
    these handlers back and raises the signal again, which now ends the process with
    code 0, not a death by SIGTERM or a KeyboardInterrupt traceback.
    """
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit_zero)


def _exit_zero(_signum: int, _frame: object) -> None:
    raise SystemExit(0)


def run_stdio(
    server: MCPServer[Any],
    closed: threading.Event,
    *,
    on_stop: Iterable[Callable[[], None]] = (),
    draining: Iterable[Draining] = (),
) -> None:
    """Serve ``server`` over stdio until stdin ends or SIGTERM / SIGINT comes; ``closed``
    is set when its lifespan has closed the store (:attr:`ServeSettings.closed`).

    The SDK's ``run("stdio")`` leaves SIGTERM to Python's default, which ends the process
    at once: no task given back, the store never closed. Here a signal first runs
    ``on_stop`` (the listen streams are told to end), waits for ``draining`` (they have
    ended, each returning its result) and for those results to be written to stdout
    (:class:`~keel.mcp.stdio_relay.StdoutRelay`: the SDK has no event for a message
    written), then cancels the serving, so its lifespan ends as at the end of stdin (the
    workers give their tasks back, the store is closed); then the process exits, since
    the SDK's stdin reader stays blocked in a thread until a line or the end of stdin
    comes.
    """
    relay = StdoutRelay()  # before the SDK claims fd 1

    async def until_signal() -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with anyio.create_task_group() as tg:

                async def stop_on_signal() -> None:
                    async for _ in signals:
                        with anyio.CancelScope(shield=True):
                            await _drain(on_stop, draining, relay)
                        tg.cancel_scope.cancel()
                        with anyio.CancelScope(shield=True):
                            await anyio.to_thread.run_sync(closed.wait, STOP_WAIT)
                        sys.stdout.flush()
                        sys.stderr.flush()
                        relay.finish(FLUSH_WAIT)
                        os._exit(0)

                tg.start_soon(stop_on_signal)
                await server.run_stdio_async()
                tg.cancel_scope.cancel()

    anyio.run(until_signal)
    relay.finish(FLUSH_WAIT)


async def _drain(
    on_stop: Iterable[Callable[[], None]], draining: Iterable[Draining], relay: StdoutRelay
) -> None:
    """Run ``on_stop``, then wait (at most :data:`STREAMS_WAIT` s in all) for
    ``draining``, and for the answers it names to be written to stdout."""
    relay.watch()  # before the answers can come
    for hook in on_stop:
        hook()
    with anyio.move_on_after(STREAMS_WAIT) as scope:
        ids = [i for wait in draining for i in await wait()]
        if ids:
            left = max(scope.deadline - anyio.current_time(), 0.0)
            await anyio.to_thread.run_sync(relay.written, ids, left, abandon_on_cancel=True)


@dataclass(frozen=True, slots=True)
class ServeSettings:
    """What ``keel serve`` settles for every app it serves, whichever it is."""

    store: str
    """The task store's location, as :func:`keel.store.open_store` takes it."""
    data_dir: Path
    """``keel serve --data-dir``: the request-state key lives here; an app may keep its
    own data below it."""
    run_workers: bool = True
    concurrency: int = 4  # tasks run at once by this process's workers
    rate_limit_polls: bool = False
    closed: threading.Event = field(default_factory=threading.Event, compare=False)
    """Set once the server's lifespan has closed the store (see :func:`run_stdio`)."""
    auth: ServerAuth | None = None  # keel serve --auth (HTTP only)
    stopping: list[Callable[[], None]] = field(default_factory=list, compare=False)
    """What :func:`run_http` and :func:`run_stdio` run as a signal stops the server
    (``on_stop``)."""
    draining: list[Draining] = field(default_factory=list, compare=False)
    """What :func:`run_stdio` then waits for (``draining``)."""
    telemetry: Telemetry | None = field(default=None, compare=False)
    """Metrics, health and logs of the process (``keel serve`` attaches its store)."""

    def server_for(self, app: Keel, name: str) -> MCPServer[Any]:
        """:func:`app_server` of ``app`` with these settings.

        Raises:
            ConfigurationError: the request-state key cannot be read or is too short.
        """
        return app_server(
            app,
            name,
            rate_limit_polls=self.rate_limit_polls,
            concurrency=self.concurrency,
            run_workers=self.run_workers,
            state_dir=self.data_dir,
            close_store=True,  # keel serve: the process ends with the server
            closed=self.closed,
            auth=self.auth,
            stopping=self.stopping,
            draining=self.draining,
            telemetry=self.telemetry,
        )


@dataclass(frozen=True, slots=True)
class Served:
    """An app ready to serve: what ``build_server`` gives ``keel serve``."""

    app: Keel
    server: MCPServer[Any]
    title: str
    """How ``keel serve``'s startup message names it (``Incident Bridge``)."""
    lines: tuple[str, ...] = ()
    """More lines for that message: where its data is, what was prepared."""


def serve_keel_app(app: Keel, name: str, settings: ServeSettings) -> Served:
    """A plain Keel app (``keel serve --app MODULE:ATTR``) on ``settings.store``.

    Raises:
        KeelError: the store or the request-state key cannot be used.
    """
    app.use_store(settings.store)
    return Served(app, settings.server_for(app, name), f"app {name}")
