"""``keel worker``: run an app's task handlers as a process of their own."""

from __future__ import annotations

import logging
import os
import signal

import anyio
import click

from keel.cli.common import (
    CliState,
    KeelCliError,
    chosen_location,
    store_option,
    store_timeout_option,
)
from keel.store import ENV_VAR, parse_location

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
@click.option("--worker-id", default=None, help="Name in leases and history (default host:pid).")
@click.option("-v", "--verbose", is_flag=True, help="Log what the worker does.")
@store_option
@store_timeout_option
@click.pass_context
def worker(  # noqa: PLR0917 - click passes every option as an argument
    ctx: click.Context,
    app_spec: str,
    concurrency: int,
    worker_id: str | None,
    verbose: bool,
    store_timeout: float,
) -> None:
    """Claim and run the tasks the app registers until SIGTERM or Ctrl-C.

    On stop, running attempts are stopped and their tasks given back (ready again at once,
    not counted as failed attempts); a worker killed outright leaves leases that expire and
    are recovered by any other worker.
    """
    from keel.runtime import Worker, load_app

    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
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
    app.store  # noqa: B018 - open the store now: one clear error if it cannot be opened
    runner = Worker(app, concurrency=concurrency, worker_id=worker_id)

    async def run() -> None:
        stop = anyio.Event()
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with anyio.create_task_group() as tg:

                async def wait_for_signal() -> None:
                    async for _ in signals:
                        stop.set()
                        return

                tg.start_soon(wait_for_signal)
                tg.start_soon(lambda: runner.run(stop=stop))
                await runner.started.wait()
                click.echo(
                    f"keel worker {runner.worker_id}: tasks {', '.join(sorted(app.tasks))} "
                    f"from {app.location or 'the given store'}; concurrency {concurrency}",
                    err=True,
                )
                await stop.wait()
                tg.cancel_scope.deadline = anyio.current_time() + 35
        await app.close()

    anyio.run(run)
