"""``keel serve``: an app's tasks as an MCP server (Streamable HTTP at /mcp, or stdio)."""

from __future__ import annotations

import logging
import os
from typing import Any

import click

from keel.cli.common import CliState, KeelCliError, chosen_location, store_option
from keel.store import ENV_VAR, parse_location

__all__ = ["serve"]

BUILT_IN = {"conformance": "keel.conformance:app"}


@click.command(short_help="Serve an app's tasks over MCP (HTTP /mcp or stdio).")
@click.option(
    "--app",
    "app_spec",
    default="bridge",
    show_default=True,
    metavar="NAME|MODULE:ATTR",
    help="conformance, or a module path and the Keel app in it.",
)
@click.option(
    "--transport", type=click.Choice(["http", "stdio"]), default="http", show_default=True
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option("--no-worker", is_flag=True, help="Front end only: run no workers here.")
@click.option("--concurrency", default=4, show_default=True, type=click.IntRange(1, 10_000))
@click.option("-v", "--verbose", is_flag=True, help="Log requests and worker activity.")
@store_option
@click.pass_context
def serve(  # noqa: PLR0917 - click passes every option as an argument
    ctx: click.Context,
    app_spec: str,
    transport: str,
    host: str,
    port: int,
    no_worker: bool,
    concurrency: int,
    verbose: bool,
) -> None:
    """Serve the app's tasks as MCP tools with the tasks extension, workers included."""
    from mcp.server import MCPServer

    from keel.mcp.server import TasksExtension, keel_lifespan
    from keel.runtime import load_app

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)
    if app_spec == "bridge":
        raise KeelCliError("the Incident Bridge app is not built yet; use --app conformance")
    spec = BUILT_IN.get(app_spec, app_spec)
    if ":" not in spec:
        raise click.BadParameter(
            f"must be a built-in name or MODULE:ATTR, not {app_spec!r}", param_hint="--app"
        )
    app = load_app(spec)
    state = ctx.find_object(CliState)
    if (state is not None and state.store) or os.environ.get(ENV_VAR):
        location = chosen_location(ctx)
        app.use_store(location.url or str(location.path))
    if app.location is not None and parse_location(app.location).kind == "memory" and no_worker:
        raise KeelCliError("--no-worker with memory:// could never run a task")
    app.store  # noqa: B018 - open the store now: one clear error if it cannot be opened
    if app_spec == "conformance":
        from keel.conformance import build_server

        server: MCPServer[Any] = build_server(app, run_workers=not no_worker)
    else:
        server = MCPServer(
            app_spec,
            extensions=[TasksExtension(app)],
            lifespan=keel_lifespan(app, concurrency=concurrency, run_workers=not no_worker),
        )
    if transport == "stdio":
        server.run("stdio")
        return
    click.echo(
        f"keel serve: app {app_spec} at http://{host}:{port}/mcp; store "
        f"{app.location or 'given by the app'}; workers: {'none' if no_worker else concurrency}",
        err=True,
    )
    server.run(
        "streamable-http", host=host, port=port, streamable_http_path="/mcp", json_response=True
    )
