"""``keel serve``: Incident Bridge (or another app) as an MCP server, workers included.

Settings come, strongest first, from the command line, the environment (``KEEL_HOST``,
``KEEL_PORT``, ``KEEL_DATA_DIR`` …, listed in ``keel serve --help``), a TOML file
(``--config``, ``$KEEL_CONFIG``, else ``keel.toml`` in the current directory if there is
one), then the defaults. The TOML file holds a ``[serve]`` table whose keys are the
option names with underscores::

    [serve]
    port = 8080
    data_dir = "/var/lib/keel"
    pace = "fast"
    traces = ["/exports/otel"]
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
import tomllib
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from keel.cli.common import CliState, KeelCliError, data_dir_option, store_option_helped
from keel.store import ENV_VAR, Location, parse_location

__all__ = ["CONFIG_KEYS", "serve"]

BUILT_IN = {"conformance": "keel.conformance:app"}
DEFAULT_CONFIG = "keel.toml"
CONFIG_KEYS = frozenset(
    {
        "app", "transport", "host", "port", "no_worker", "concurrency", "data_dir", "store",
        "pace", "incidents", "traces", "deploys", "rate_limit_polls", "verbose",
    }
)  # fmt: skip


def _read_config(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """Load the TOML file into the command's defaults (below flags and environment)."""
    explicit = value is not None
    path = Path(value) if value is not None else Path(DEFAULT_CONFIG)
    if not path.exists():
        if explicit:
            raise click.BadParameter(f"no such file: {path}", param_hint="--config")
        return None
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise click.BadParameter(f"cannot read {path}: {exc}", param_hint="--config") from exc
    table = data.get("serve", {})
    unknown_tables = sorted(set(data) - {"serve"})
    if not isinstance(table, dict) or unknown_tables:
        raise click.BadParameter(
            f"{path}: expected only a [serve] table"
            + (f", found {', '.join(unknown_tables)}" if unknown_tables else ""),
            param_hint="--config",
        )
    unknown = sorted(set(table) - CONFIG_KEYS)
    if unknown:
        raise click.BadParameter(
            f"{path}: unknown key(s) in [serve]: {', '.join(unknown)} "
            f"(known: {', '.join(sorted(CONFIG_KEYS))})",
            param_hint="--config",
        )
    for key, setting in table.items():
        problem = _type_problem(key, setting)
        if problem:
            raise click.BadParameter(f"{path}: [serve] {key} {problem}", param_hint="--config")
    defaults = dict(table)
    ctx.meta["keel.config_store"] = defaults.pop("store", None)
    ctx.meta["keel.config_path"] = str(path)
    if "traces" in defaults and isinstance(defaults["traces"], str):
        defaults["traces"] = [defaults["traces"]]
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return str(path)


_STRINGS = frozenset({"app", "transport", "host", "data_dir", "store", "incidents", "deploys"})
_NUMBERS = frozenset({"port", "concurrency"})
_FLAGS = frozenset({"no_worker", "rate_limit_polls", "verbose"})


def _type_problem(key: str, value: object) -> str | None:
    """What is wrong with a TOML value's type for ``key`` (None: nothing)."""
    if key in _STRINGS and not isinstance(value, str):
        return f"must be a string, not {value!r}"
    if key in _NUMBERS and (isinstance(value, bool) or not isinstance(value, int)):
        return f"must be an integer, not {value!r}"
    if key in _FLAGS and not isinstance(value, bool):
        return f"must be true or false, not {value!r}"
    if key == "pace" and (isinstance(value, bool) or not isinstance(value, str | int | float)):
        return f"must be a preset name or seconds, not {value!r}"
    if key == "traces" and not (
        isinstance(value, str)
        or (isinstance(value, list) and all(isinstance(v, str) for v in value))
    ):
        return f"must be a path or a list of paths, not {value!r}"
    return None


def _store_location(ctx: click.Context, data_dir: Path) -> Location:
    """--store (here or on ``keel``), then $KEEL_STORE, then the config file, then the
    data directory's keel.db."""
    state = ctx.find_object(CliState)
    chosen = (
        (state.store if state is not None else None)
        or os.environ.get(ENV_VAR)
        or ctx.meta.get("keel.config_store")
        or str(data_dir.absolute() / "keel.db")
    )
    return parse_location(chosen)  # a bad location fails here, with its own message


@click.command(short_help="Serve Incident Bridge (or an app) over MCP: HTTP /mcp or stdio.")
@click.option(
    "--config",
    metavar="FILE",
    envvar="KEEL_CONFIG",
    is_eager=True,
    expose_value=False,
    callback=_read_config,
    help=f"TOML settings ([serve] table). Default: ./{DEFAULT_CONFIG} if it exists.",
)
@click.option(
    "--app",
    "app_spec",
    default="bridge",
    show_default=True,
    envvar="KEEL_APP",
    metavar="NAME|MODULE:ATTR",
    help="bridge, conformance, or a module path and the Keel app in it.",
)
@click.option(
    "--transport",
    type=click.Choice(["http", "stdio"]),
    default="http",
    show_default=True,
    envvar="KEEL_TRANSPORT",
)
@click.option("--host", default="127.0.0.1", show_default=True, envvar="KEEL_HOST")
@click.option(
    "--port", default=8000, show_default=True, type=click.IntRange(0, 65535), envvar="KEEL_PORT"
)
@data_dir_option("Where the store (keel.db) and the Bridge's data and index live.")
@store_option_helped(
    f"Store location. Default: ${ENV_VAR}, then the config file, then DATA_DIR/keel.db."
)
@click.option(
    "--no-worker", is_flag=True, envvar="KEEL_NO_WORKER", help="Front end only: run no workers."
)
@click.option(
    "--concurrency",
    default=4,
    show_default=True,
    type=click.IntRange(1, 10_000),
    envvar="KEEL_CONCURRENCY",
    help="Tasks run at once by this process's workers.",
)
@click.option(
    "--pace",
    default=None,
    envvar="KEEL_BRIDGE_PACE",
    help="Bridge: how long each diagnosis phase takes (a preset name or seconds).",
)
@click.option(
    "--incidents",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="KEEL_BRIDGE_INCIDENTS",
    help="Bridge: incidents JSON file (default: the sample dataset).",
)
@click.option(
    "--traces",
    multiple=True,
    type=click.Path(path_type=Path),
    envvar="KEEL_BRIDGE_TRACES",
    help="Bridge: OTLP/JSON trace export file or folder (repeatable).",
)
@click.option(
    "--deploys",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="KEEL_BRIDGE_DEPLOYS",
    help="Bridge: deploy records, JSON or CSV.",
)
@click.option(
    "--rate-limit-polls",
    is_flag=True,
    envvar="KEEL_RATE_LIMIT_POLLS",
    help="Refuse tasks/get polls faster than half the task's pollIntervalMs.",
)
@click.option("-v", "--verbose", is_flag=True, help="Log requests and worker activity.")
@click.option(
    "--check",
    is_flag=True,
    help="Prepare everything (store, data, index), print the settings, and exit.",
)
@click.pass_context
def serve(  # noqa: PLR0917 - click passes every option as an argument
    ctx: click.Context,
    app_spec: str,
    transport: str,
    host: str,
    port: int,
    data_dir: Path,
    no_worker: bool,
    concurrency: int,
    pace: str | None,
    incidents: Path | None,
    traces: tuple[Path, ...],
    deploys: Path | None,
    rate_limit_polls: bool,
    verbose: bool,
    check: bool,
) -> None:
    """Serve Incident Bridge's tools and its durable diagnosis task over MCP.

    With no sources given, the Bridge generates a sample dataset in DATA_DIR on first
    start. Tasks are kept in DATA_DIR/keel.db (SQLite, synchronous=FULL) unless --store
    says otherwise; with PostgreSQL, several `keel serve --no-worker` front ends and
    `keel worker` processes can share one database.
    """
    from mcp.server import MCPServer

    from keel.mcp.serving import app_server
    from keel.runtime import Keel, load_app

    started = time.monotonic()
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)
    location = _store_location(ctx, data_dir)
    if location.kind == "memory" and no_worker:
        raise KeelCliError("--no-worker with memory:// could never run a task")
    lines: list[str] = []
    server: MCPServer[Any]
    app: Keel
    if app_spec == "bridge":
        app, server, lines = _bridge(
            location.url,
            data_dir,
            pace=pace,
            incidents=incidents,
            traces=list(traces),
            deploys=deploys,
            rate_limit_polls=rate_limit_polls,
            concurrency=concurrency,
            run_workers=not no_worker,
        )
        title = "Incident Bridge"
    else:
        given = [
            f"--{name}"
            for name in ("pace", "incidents", "traces", "deploys")
            if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE
        ]
        if given:  # (from the environment or a shared config file they are ignored here)
            raise click.UsageError(f"{', '.join(given)}: Bridge settings, not for --app {app_spec}")
        spec = BUILT_IN.get(app_spec, app_spec)
        if ":" not in spec:
            raise click.BadParameter(
                f"must be bridge, conformance or MODULE:ATTR, not {app_spec!r}", param_hint="--app"
            )
        app = load_app(spec)
        app.use_store(location.url)
        if app_spec == "conformance":
            from keel.conformance import build_server

            server = build_server(
                app,
                run_workers=not no_worker,
                rate_limit_polls=rate_limit_polls,
                state_dir=data_dir,
            )
        else:
            server = app_server(
                app,
                app_spec,
                rate_limit_polls=rate_limit_polls,
                concurrency=concurrency,
                run_workers=not no_worker,
                state_dir=data_dir,
            )
        title = f"app {app_spec}"
    app.store  # noqa: B018 - open the store now: one clear error if it cannot be opened
    if transport == "http" and not check:
        _check_port(host, port)
    endpoint = "stdio" if transport == "stdio" else f"http://{host}:{port}/mcp"
    config = ctx.meta.get("keel.config_path")
    for line in [
        f"keel serve: {title} at {endpoint}",
        f"  store:   {location.describe()}",
        *lines,
        f"  workers: {'none (front end only)' if no_worker else concurrency}",
        f"  polls:   {'rate-limited' if rate_limit_polls else 'not rate-limited'}",
        *([f"  config:  {config}"] if config else []),
        f"  prepared in {time.monotonic() - started:.2f} s",
    ]:
        click.echo(line, err=True)
    if check:
        return
    if transport == "stdio":
        server.run("stdio")
        return
    server.run(
        "streamable-http", host=host, port=port, streamable_http_path="/mcp", json_response=True
    )


def _check_port(host: str, port: int) -> None:
    """Fail with one clear line if the address cannot be listened on (before uvicorn
    would, with a log line and exit code 3)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise KeelCliError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise KeelCliError(
                f"cannot listen on {host}:{port}: {exc.strerror or exc} "
                "(another keel serve? choose one with --port)"
            ) from exc


def _bridge(
    location: str,
    data_dir: Path,
    *,
    pace: str | None,
    incidents: Path | None,
    traces: list[Path],
    deploys: Path | None,
    rate_limit_polls: bool,
    concurrency: int,
    run_workers: bool,
) -> tuple[Any, Any, list[str]]:
    """The Bridge's app and server, its data prepared; and lines for the startup message."""
    from keel.bridge import BridgeSettings, add_tools, build_app, prepare
    from keel.bridge.settings import DATA_ENV as BRIDGE_DATA_ENV
    from keel.mcp.serving import app_server

    # The same environment as `keel worker --app keel.bridge:app` reads (so that front
    # ends and workers agree), then the flags and the config file on top.
    base = BridgeSettings.from_env()
    options: dict[str, Any] = {}
    if not os.environ.get(BRIDGE_DATA_ENV):
        options["data_dir"] = data_dir.absolute() / "bridge"
    if pace is not None:
        options["pace"] = pace
    if incidents is not None:
        options["incidents"] = incidents
    if traces:
        options["traces"] = traces
    if deploys is not None:
        options["deploys"] = deploys
    settings = dataclasses.replace(base, **options)
    messages: list[str] = []
    paths = prepare(settings, log=messages.append)
    app = build_app(settings, store=location)
    server = app_server(
        app,
        "incident-bridge",
        rate_limit_polls=rate_limit_polls,
        concurrency=concurrency,
        run_workers=run_workers,
        state_dir=data_dir,
    )
    add_tools(server, settings)
    lines = [f"  {line}" for line in paths.describe().splitlines()]
    lines += [f"  {message}" for message in messages]
    return app, server, lines
