"""``keel serve``: an app (Incident Bridge by default) as an MCP server, workers included.

Which app: ``--app NAME`` for a built-in app (``bridge``, ``conformance``), ``--app
MODULE`` for an app module of your own, or ``--app MODULE:ATTR`` for any Keel app. An app
module (each built-in app is one) builds its own server and may bring its own options
(the Bridge's ``--pace``, ``--traces`` …): the seam is described in
:mod:`keel.mcp.serving`. This command knows no app's options itself; it shows those of
every built-in app and of the app module that ``--app`` (or ``$KEEL_APP``) names, and
refuses one given for another app.

Settings come, strongest first, from the command line, the environment (``KEEL_HOST``,
``KEEL_PORT``, ``KEEL_DATA_DIR`` …, listed in ``keel serve --help``), a TOML file
(``--config``, ``$KEEL_CONFIG``, else ``keel.toml`` in the current directory if there is
one), then the defaults. The TOML file holds a ``[serve]`` table whose keys are the
option names with underscores (an app's options too)::

    [serve]
    port = 8080
    data_dir = "/var/lib/keel"
    pace = "fast"
    traces = ["/exports/otel"]
"""

from __future__ import annotations

import importlib
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from keel.cli.access import (
    ACCESS_KEYS,
    ACCESS_OPTIONS,
    ServeAccess,
    access_problem,
    check_served,
    operators_line,
    refuse_over_stdio,
    serve_access,
)
from keel.cli.common import (
    CliState,
    KeelCliError,
    data_dir_option,
    log_format_option,
    settle_heap,
    store_option_helped,
    store_timeout_option,
)
from keel.cli.config import DEFAULT_CONFIG, config_option, read_table
from keel.store import ENV_VAR, Location, parse_location

if TYPE_CHECKING:
    from keel.mcp.serving import Served, ServeSettings

__all__ = [
    "BUILT_IN",
    "OWN_KEYS",
    "AppModule",
    "check_port",
    "config_table",
    "serve",
    "served_apps",
    "store_location",
]

BUILT_IN = {"bridge": "keel.bridge", "conformance": "keel.conformance"}
"""The apps served by name: each a module with ``build_server`` (see keel.mcp.serving)."""
OPTIONS_OF = {"bridge": "keel.bridge.serving"}
"""Where a built-in app's own options (``serve_options``, ``config_problem``) live, if it
has any: a light module, read when keel serve parses its arguments (and for --help).
The app itself is imported only when it is served: importing the conformance app to
serve the Bridge cost a third of a second (its schemas load jsonschema)."""
DEFAULT_APP = "bridge"
OWN_KEYS = frozenset(
    {
        "app", "transport", "host", "port", "no_worker", "concurrency", "data_dir", "store",
        "rate_limit_polls", "verbose", "store_timeout", "log_format",
    }
) | ACCESS_KEYS  # fmt: skip
"""The ``[serve]`` keys of keel serve's own settings (each app's options add theirs)."""


@dataclass(frozen=True, slots=True)
class AppModule:
    """An app module as ``keel serve`` sees it (a built-in app, or ``--app MODULE``): its
    module's name and its own options."""

    name: str
    module_name: str
    options: tuple[click.Option, ...]
    checks: ModuleType | None  # the module of its options, for config_problem

    @property
    def module(self) -> ModuleType:
        """The app's module (imported now, when it is served)."""
        return importlib.import_module(self.module_name)

    def config_problem(self, key: str, value: object) -> str | None:
        """What is wrong with a TOML value for one of its options (None: nothing)."""
        check: Callable[[str, object], str | None] | None
        check = getattr(self.checks, "config_problem", None)
        return None if check is None else check(key, value)


@cache
def built_in_apps() -> dict[str, AppModule]:
    """The built-in apps and their options, read on first use (``keel serve`` parsing or
    help), so that no other command pays for importing them."""
    apps = {}
    for name, module_name in BUILT_IN.items():
        checks = importlib.import_module(OPTIONS_OF[name]) if name in OPTIONS_OF else None
        options = tuple(getattr(checks, "serve_options", ()))
        apps[name] = AppModule(name, module_name, options, checks)
    return apps


@cache
def app_module(module_name: str) -> AppModule:
    """``--app MODULE``: a module of the user's with ``build_server`` (and perhaps
    ``serve_options``), imported when keel serve parses its arguments, to know them."""
    from keel.errors import ConfigurationError
    from keel.runtime.app import import_user_module

    try:
        module = import_user_module(module_name, "--app")
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param_hint="--app") from exc
    if not callable(getattr(module, "build_server", None)):
        raise click.BadParameter(
            f"module {module_name!r} has no build_server (the seam of keel.mcp.serving); "
            f"for a Keel app in it, name it: --app {module_name}:ATTR",
            param_hint="--app",
        )
    options = tuple(getattr(module, "serve_options", ()))
    return AppModule(module_name, module_name, options, module)


def served_apps(named: str | None) -> dict[str, AppModule]:
    """The app modules whose options keel serve knows: every built-in app, and the app
    module that ``--app`` names if it names one (not a built-in, not ``MODULE:ATTR``)."""
    apps = built_in_apps()
    if not named or named in apps or ":" in named:
        return apps
    return {**apps, named: app_module(named)}


def _app_named(args: list[str]) -> str | None:
    """The app that the command line, else ``$KEEL_APP``, names: read before parsing, since
    an app module's options must be known to parse them (one named only in the config
    file brings none)."""
    for at, arg in enumerate(args):
        if arg == "--":
            break
        if arg == "--app" and at + 1 < len(args):
            return args[at + 1]
        if arg.startswith("--app="):
            return arg.removeprefix("--app=")
    return os.environ.get("KEEL_APP")


def _apps(ctx: click.Context) -> dict[str, AppModule]:
    return served_apps(ctx.meta.get("keel.app_named"))


class ServeCommand(click.Command):
    """``keel serve``: its own options, then those of every built-in app (and of the app
    module that ``--app`` names)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["keel.app_named"] = _app_named(args)
        return super().parse_args(ctx, args)

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        params = super().get_params(ctx)
        at = len(self.params)  # after its own options, before --help
        extra = [option for app in _apps(ctx).values() for option in app.options]
        return [*params[:at], *extra, *params[at:]]


def config_table(ctx: click.Context, value: str | None) -> tuple[Path, dict[str, Any]] | None:
    """The checked ``[serve]`` table of the TOML file ``value`` names (``--config``), else
    of ``./keel.toml`` if there is one; None without a file (``keel ops`` reads it too).

    Raises:
        click.BadParameter: a file named that is not there or cannot be read, a table
            other than ``[serve]``, an unknown key or a value of the wrong type.
    """
    found = read_table(value)
    if found is None:
        return None
    path, table = found
    problem = _table_problem(table, _apps(ctx))
    if problem:
        raise click.BadParameter(f"{path}: {problem}", param_hint="--config")
    return path, table


def _read_config(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """Load the TOML file into the command's defaults (below flags and environment)."""
    found = config_table(ctx, value)
    if found is None:
        return None
    path, table = found
    defaults = dict(table)
    ctx.meta["keel.config_store"] = defaults.pop("store", None)
    if "app" in defaults:  # the key is the option's name; click's default map wants the
        defaults["app_spec"] = defaults.pop("app")  # parameter's (it was ignored before)
    ctx.meta["keel.config_path"] = str(path)
    for app in _apps(ctx).values():
        for option in app.options:  # one path for a repeatable option is a list of one
            if option.multiple and isinstance(defaults.get(str(option.name)), str):
                defaults[str(option.name)] = [defaults[str(option.name)]]
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return str(path)


def _table_problem(table: dict[str, Any], apps: dict[str, AppModule]) -> str | None:
    """What is wrong with the keys or value types of a ``[serve]`` table (None: nothing)."""
    owners = {str(option.name): app for app in apps.values() for option in app.options}
    known = OWN_KEYS | set(owners)
    unknown = sorted(set(table) - known)
    if unknown:
        return (
            f"unknown key(s) in [serve]: {', '.join(unknown)} (known: {', '.join(sorted(known))})"
        )
    for key, setting in table.items():
        owner = owners.get(key)
        problem = (
            _type_problem(key, setting) if owner is None else owner.config_problem(key, setting)
        )
        if problem:
            return f"[serve] {key} {problem}"
    return None


_STRINGS = frozenset({"app", "transport", "host", "data_dir", "store", "log_format"})
_NUMBERS = frozenset({"port", "concurrency"})
_FLAGS = frozenset({"no_worker", "rate_limit_polls", "verbose"})


def _type_problem(key: str, value: object) -> str | None:
    """What is wrong with a TOML value's type for one of keel serve's own keys."""
    if key in _STRINGS and not isinstance(value, str):
        return f"must be a string, not {value!r}"
    if key in _NUMBERS and (isinstance(value, bool) or not isinstance(value, int)):
        return f"must be an integer, not {value!r}"
    if key in _FLAGS and not isinstance(value, bool):
        return f"must be true or false, not {value!r}"
    if key == "store_timeout" and (isinstance(value, bool) or not isinstance(value, int | float)):
        return f"must be a number of seconds, not {value!r}"
    return access_problem(key, value)


def store_location(ctx: click.Context, data_dir: Path) -> Location:
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


_OWN_OPTIONS = [
    config_option(
        _read_config, f"TOML settings ([serve] table). Default: ./{DEFAULT_CONFIG} if it exists."
    ),
    click.option(
        "--app",
        "app_spec",
        default=DEFAULT_APP,
        show_default=True,
        envvar="KEEL_APP",
        metavar="NAME|MODULE[:ATTR]",
        help=f"{', '.join(BUILT_IN)}; an app module (build_server); or MODULE:ATTR, a Keel app.",
    ),
    click.option(
        "--transport",
        type=click.Choice(["http", "stdio"]),
        default="http",
        show_default=True,
        envvar="KEEL_TRANSPORT",
    ),
    click.option("--host", default="127.0.0.1", show_default=True, envvar="KEEL_HOST"),
    click.option(
        "--port", default=8000, show_default=True, type=click.IntRange(0, 65535), envvar="KEEL_PORT"
    ),
    data_dir_option("Where the store (keel.db), the request-state key and an app's data live."),
    store_option_helped(
        f"Store location. Default: ${ENV_VAR}, then the config file, then DATA_DIR/keel.db."
    ),
    store_timeout_option,
    click.option(
        "--no-worker", is_flag=True, envvar="KEEL_NO_WORKER", help="Front end only: run no workers."
    ),
    click.option(
        "--concurrency",
        default=4,
        show_default=True,
        type=click.IntRange(1, 10_000),
        envvar="KEEL_CONCURRENCY",
        help="Tasks run at once by this process's workers.",
    ),
    click.option(
        "--rate-limit-polls",
        is_flag=True,
        envvar="KEEL_RATE_LIMIT_POLLS",
        help="Refuse tasks/get polls faster than half the task's pollIntervalMs.",
    ),
    *ACCESS_OPTIONS,
    click.option("-v", "--verbose", is_flag=True, help="Log requests and worker activity."),
    log_format_option,
    click.option(
        "--check",
        is_flag=True,
        help="Prepare everything (store, app data), print the settings, and exit.",
    ),
]


def _own_options(fn: click.decorators.FC) -> click.decorators.FC:
    for option in reversed(_OWN_OPTIONS):
        fn = option(fn)
    return fn


@click.command(
    cls=ServeCommand, short_help="Serve Incident Bridge (or an app) over MCP: HTTP /mcp or stdio."
)
@_own_options
@click.pass_context
def serve(  # noqa: PLR0917 - click passes every option as an argument
    ctx: click.Context,
    /,
    app_spec: str,
    transport: str,
    host: str,
    port: int,
    data_dir: Path,
    no_worker: bool,
    concurrency: int,
    rate_limit_polls: bool,
    verbose: bool,
    check: bool,
    store_timeout: float,
    log_format: str,
    **app_options: Any,
) -> None:
    """Serve an app over MCP: by default Incident Bridge's tools and its durable
    diagnosis task.

    With no sources given, the Bridge generates a sample dataset in DATA_DIR on first
    start. Tasks are kept in DATA_DIR/keel.db (SQLite, synchronous=FULL) unless --store
    says otherwise; with PostgreSQL, several `keel serve --no-worker` front ends and
    `keel worker` processes can share one database.
    """
    from keel.mcp.serving import ServeSettings, run_stdio
    from keel.telemetry import Telemetry
    from keel.telemetry.logs import configure
    from keel.telemetry.tracing import configure_from_environment

    started = time.monotonic()
    configure(log_format, verbose=verbose)
    configure_from_environment("keel-serve")  # OTEL_EXPORTER_OTLP_*: spans exported
    telemetry = Telemetry(expect_workers=not no_worker)
    location = store_location(ctx, data_dir)
    if location.kind == "memory" and no_worker:
        raise KeelCliError("--no-worker with memory:// could never run a task")
    if transport == "stdio":
        refuse_over_stdio(app_options)
    access = serve_access(host, port, app_options) if transport == "http" else None
    settings = ServeSettings(
        store=location.url,
        data_dir=data_dir,
        run_workers=not no_worker,
        concurrency=concurrency,
        rate_limit_polls=rate_limit_polls,
        auth=None if access is None else access.auth,
        telemetry=telemetry,
    )
    served = _build(ctx, app_spec, settings, app_options)
    check_served(access, served.server, app_spec)
    _open_store(served, store_timeout)
    telemetry.attach(served.app.store)  # counts and logs what it commits; /readyz reads it
    endpoint = _endpoint(transport, host, port, check=check)
    config = ctx.meta.get("keel.config_path")
    console, mounts = _console(served, host, port, access) if transport == "http" else (None, {})
    for line in [
        f"keel serve: {served.title} at {endpoint}",
        f"  store:   {location.describe()}; calls wait {store_timeout:g} s at most",
        *served.lines,
        f"  workers: {'none (front end only)' if no_worker else concurrency}",
        f"  polls:   {'rate-limited' if rate_limit_polls else 'not rate-limited'}",
        *(access.lines if access else []),
        *([f"  console: {console}"] if console else []),
        *([f"  config:  {config}"] if config else []),
        f"  prepared in {time.monotonic() - started:.2f} s",
    ]:
        click.echo(line, err=True)
    if check:
        return
    settle_heap()
    if transport == "stdio":
        # SIGTERM: listen streams closed with their result, tasks given back, store closed
        run_stdio(
            served.server, settings.closed, on_stop=settings.stopping, draining=settings.draining
        )
        return
    _run_http(served, settings, host, port, access, mounts, json_logs=log_format == "json")


def _run_http(  # noqa: PLR0917 - what serve settled, handed on
    served: Served,
    settings: ServeSettings,
    host: str,
    port: int,
    access: ServeAccess | None,
    mounts: dict[str, Any],
    *,
    json_logs: bool,
) -> None:
    """Serve ``served`` over streamable HTTP at /mcp until a signal stops it."""
    from keel.mcp.serving import run_http

    run_http(
        served.server,
        host=host,
        port=port,
        access=None if access is None else access.http,
        on_stop=settings.stopping,  # listen streams end gracefully (keel.mcp.push)
        json_logs=json_logs,
        mounts=mounts,
        streamable_http_path="/mcp",
        json_response=True,
    )


def _open_store(served: Served, store_timeout: float) -> None:
    """Open the app's store now, with the timeout: one clear error if it cannot be
    served from."""
    from keel.store.maintenance import verify

    if served.app.location is not None:  # the app opens it: with the timeout
        served.app.use_store(served.app.location, timeout=store_timeout)
    verify(served.app.store)


def _endpoint(transport: str, host: str, port: int, *, check: bool) -> str:
    """Where the server will be, for the startup message; an HTTP address that cannot
    be listened on fails here (unless only checking)."""
    if transport == "stdio":
        return "stdio"
    if not check:
        check_port(host, port)
    if port == 0:  # the system picks; uvicorn's line names it
        return f"http://{host}:<a free port, in the 'running on' line below>/mcp"
    return f"http://{host}:{port}/mcp"


def _console(
    served: Served, host: str, port: int, access: ServeAccess | None
) -> tuple[str, dict[str, Any]]:
    """The operator console mounted beside /mcp (keel.ops), and how the startup message
    names it: behind ``--auth`` when it is set (any host); without it, on loopback only."""
    from keel.mcp.access import is_loopback
    from keel.ops import MOUNT, ops_app

    auth = None if access is None else access.auth
    if auth is None and not is_loopback(host):
        return f"off ({host} is not loopback, and no --auth is set)", {}
    app = served.app
    deadlines = {
        name: task.options.deadline_seconds
        for name, task in app.tasks.items()
        if task.options.deadline_seconds is not None
    }
    console = ops_app(
        app.store,
        on_ready=app.events.ready,
        on_cancel=app.events.cancelled,
        auth=None if auth is None else auth.verifier,
        deadlines=deadlines,  # /workers judges attempts past them
        operators=None if access is None else access.operators,
    )
    signin = "" if auth is None else f" (sign in with a token; {operators_line(access)})"
    return f"http://{host}:{port if port else '<port>'}{MOUNT}/{signin}", {MOUNT: console}


def _build(
    ctx: click.Context, app_spec: str, settings: ServeSettings, app_options: dict[str, Any]
) -> Served:
    """The app ``--app`` names, built with its own options; another app's options given on
    the command line are refused (from the environment or a shared config file they are
    ignored: they are meant for that app)."""
    from keel.mcp.serving import serve_keel_app
    from keel.runtime import load_app

    apps = _apps(ctx)
    for other in apps.values():
        given = [
            option.opts[0]
            for option in other.options
            if other.name != app_spec
            and ctx.get_parameter_source(str(option.name)) is ParameterSource.COMMANDLINE
        ]
        if given:
            raise click.UsageError(
                f"{', '.join(given)}: {other.name.capitalize()} settings, not for --app {app_spec}"
            )
    if ":" in app_spec:
        return serve_keel_app(load_app(app_spec), app_spec, settings)
    if not app_spec:
        raise click.BadParameter(
            f"must be {', '.join(BUILT_IN)}, MODULE or MODULE:ATTR, not {app_spec!r}",
            param_hint="--app",
        )
    # An app module named only in the config file is imported here: its options were not
    # known when parsing, so it is built with its defaults.
    chosen = apps.get(app_spec) or app_module(app_spec)
    own = {
        str(option.name): app_options[str(option.name)]
        for option in chosen.options
        if str(option.name) in app_options
    }
    served: Served = chosen.module.build_server(settings, **own)
    return served


def check_port(host: str, port: int) -> None:
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
