"""``keel worker``: run an app's task handlers as a process of their own."""

from __future__ import annotations

import os
import signal
import socket
from typing import TYPE_CHECKING

import anyio
import click

from keel.cli.common import (
    CliState,
    KeelCliError,
    chosen_location,
    log_format_option,
    settle_heap,
    store_option,
    store_timeout_option,
)
from keel.store import ENV_VAR, parse_location
from keel.store.maintenance import verify

if TYPE_CHECKING:
    from keel.runtime import Worker
    from keel.telemetry import Telemetry

__all__ = ["worker"]


@click.command(short_help="Run an app's task handlers from the store.")
@click.option(
    "--app",
    "app_spec",
    required=True,
    metavar="MODULE:ATTR",
    help="The Keel app whose tasks to run: a module path and the Keel object in it.",
)
@click.option(
    "--concurrency",
    default=4,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="Attempts run at once.",
)
@click.option(
    "--prefetch",
    default=None,
    type=click.IntRange(0, 10_000),
    help="Tasks claimed beyond the free slots at most: as many as handlers ended in the last "
    "0.25 s, each waiting for a slot (given back after 1 s)  "
    "[default: twice --concurrency; 0: none]",
)
@click.option("--worker-id", default=None, help="Name in leases and history (default host:pid).")
@click.option("-v", "--verbose", is_flag=True, help="Log what the worker does.")
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    envvar="KEEL_METRICS_PORT",
    help="Serve /metrics, /healthz and /readyz on this port (0: any free one).",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    envvar="KEEL_METRICS_HOST",
    help="The address --metrics-port listens on.",
)
@log_format_option
@store_option
@store_timeout_option
@click.pass_context
def worker(  # noqa: PLR0917 - click passes every option as an argument
    ctx: click.Context,
    app_spec: str,
    concurrency: int,
    prefetch: int | None,
    worker_id: str | None,
    verbose: bool,
    metrics_port: int | None,
    metrics_host: str,
    log_format: str,
    store_timeout: float,
) -> None:
    """Claim and run the tasks the app registers until SIGTERM or Ctrl-C.

    On stop, running attempts are stopped and their tasks given back (ready again at once,
    not counted as failed attempts); a worker killed outright leaves leases that expire and
    are recovered by any other worker.
    """
    from keel.runtime import Worker, load_app
    from keel.telemetry import Telemetry
    from keel.telemetry.logs import configure
    from keel.telemetry.tracing import configure_from_environment

    configure(log_format, verbose=verbose)
    configure_from_environment("keel-worker")  # OTEL_EXPORTER_OTLP_*: spans exported
    if ":" not in app_spec or app_spec.startswith(":") or app_spec.endswith(":"):
        raise click.BadParameter(f"must be MODULE:ATTR, not {app_spec!r}", param_hint="--app")
    app = load_app(app_spec)
    if not app.tasks:
        raise KeelCliError(f"app {app_spec} registers no tasks: there is nothing to run")
    # --store or $KEEL_STORE win; otherwise the app's own store (default keel-data/keel.db).
    state = ctx.find_object(CliState)
    if (state is not None and state.store) or os.environ.get(ENV_VAR):
        location = chosen_location(ctx)
        app.use_store(location.url or str(location.path))
    if app.location is not None:  # the app opens it: with the timeout
        app.use_store(app.location, timeout=store_timeout)
    if app.location is not None and parse_location(app.location).kind == "memory":
        raise KeelCliError("keel worker cannot use memory://: no other process could see its tasks")
    verify(app.store)  # open the store now: one clear error if it cannot be served from
    telemetry = Telemetry(expect_workers=True)
    telemetry.attach(app.store)  # counts and logs what it commits; /readyz reads it
    sock = None if metrics_port is None else _listen(metrics_host, metrics_port)
    runner = Worker(app, concurrency=concurrency, prefetch=prefetch, worker_id=worker_id)

    async def run() -> None:
        stop, finished = anyio.Event(), anyio.Event()
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with anyio.create_task_group() as tg:

                async def wait_for_signal() -> None:
                    async for _ in signals:
                        stop.set()
                        return

                async def run_worker() -> None:
                    try:
                        await runner.run(stop=stop)
                    finally:
                        finished.set()

                tg.start_soon(wait_for_signal)
                tg.start_soon(run_worker)
                if sock is not None:
                    tg.start_soon(_serve_metrics, telemetry, sock, finished)
                await runner.started.wait()
                _started(runner, app.location, sock)
                await stop.wait()
                # The worker gives its tasks back within its grace; then it is cut short.
                tg.cancel_scope.deadline = anyio.current_time() + runner.shutdown_grace + 1
        await app.close()  # folds a SQLite store's WAL in: the file alone is the store

    anyio.run(run)


def _started(runner: Worker, location: str | None, sock: socket.socket | None) -> None:
    """The worker runs: settle the heap, then say so (the line scripts wait for)."""
    settle_heap()
    click.echo(
        f"keel worker {runner.worker_id}: tasks {', '.join(sorted(runner.app.tasks))} "
        f"from {location or 'the given store'}; concurrency {runner.concurrency}",
        err=True,
    )
    if sock is not None:
        host, port = sock.getsockname()[:2]
        click.echo(f"  metrics: http://{host}:{port}/metrics (/healthz, /readyz)", err=True)


def _listen(host: str, port: int) -> socket.socket:
    from keel.telemetry.routes import listen

    try:
        return listen(host, port)
    except OSError as exc:
        raise KeelCliError(
            f"cannot listen on {host}:{port} for metrics: {exc.strerror or exc}"
        ) from exc


async def _serve_metrics(telemetry: Telemetry, sock: socket.socket, finished: anyio.Event) -> None:
    """Readiness reads and the metrics endpoints, until the worker has finished (while it
    gives its tasks back, /readyz says it is stopping)."""
    from keel.telemetry.routes import serve_http

    async with anyio.create_task_group() as tg:
        tg.start_soon(telemetry.run)
        await serve_http(telemetry, sock, stop=finished)
        tg.cancel_scope.cancel()
