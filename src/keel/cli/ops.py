"""``keel ops``: the operator console (:mod:`keel.ops`) served alone, over a store.

It reads the same store as ``keel serve``, found the same way: ``--store``,
``$KEEL_STORE``, then keel.toml's ``store``, then ``DATA_DIR/keel.db`` (``--data-dir``,
``$KEEL_DATA_DIR``, keel.toml's ``data_dir``, default ``keel-data``). It reads the same
keel.toml (``--config``, ``$KEEL_CONFIG``, else ``./keel.toml`` if there is one, checked
as ``keel serve`` checks it) and takes from its ``[serve]`` table what applies to the
console (:data:`CONSOLE_KEYS`: the store, ``auth`` and the ``jwt_*`` settings,
``operators``, ``store_timeout``); ``host`` and ``port`` there are ``/mcp``'s, not the
console's (``--host``/``--port``, ``$KEEL_OPS_HOST``/``$KEEL_OPS_PORT``). Without
``--auth`` it listens on loopback only (another host is refused with one line); with
``--auth tokens:FILE`` or ``--auth jwt`` (the same verifiers as ``keel serve --auth``) it
asks for a token and may listen anywhere, and ``--operators`` limits who may use it.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import anyio
import click

from keel.cli.access import AUTH_OPTIONS, console_auth, console_operators, operators_line
from keel.cli.common import (
    KeelCliError,
    data_dir_option,
    store_option_helped,
    store_timeout_option,
)
from keel.cli.config import config_option

__all__ = ["CONSOLE_KEYS", "ops"]

CONSOLE_KEYS = frozenset(
    {"auth", "jwt_issuer", "jwt_audience", "jwt_jwks_url", "operators", "store_timeout",
     "data_dir"}
)  # fmt: skip
"""The ``[serve]`` keys of keel.toml that ``keel ops`` takes (``store`` too); the rest are
``keel serve``'s own."""


def _read_config(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """keel.toml's console settings into the command's defaults (below flags and
    environment), its ``store`` where :func:`~keel.cli.serve.store_location` looks."""
    from keel.cli.serve import config_table

    found = config_table(ctx, value)
    if found is None:
        return None
    path, table = found
    ctx.meta["keel.config_store"] = table.get("store")
    ctx.meta["keel.config_path"] = str(path)
    console = {key: value for key, value in table.items() if key in CONSOLE_KEYS}
    ctx.default_map = {**(ctx.default_map or {}), **console}
    return str(path)


def refuse_off_loopback(host: str) -> None:
    """Refuse to serve the console without ``--auth`` on ``host`` unless it is loopback.

    Raises:
        KeelCliError: naming the host and what to do instead.
    """
    from keel.mcp.access import is_loopback  # the SDK loads only for commands that serve

    if not is_loopback(host):
        raise KeelCliError(
            f"the operator console listens on loopback only (127.0.0.1, ::1, localhost), "
            f"not {host}, without --auth: add --auth tokens:FILE (keel auth add-token NAME) "
            "or --auth jwt, or reach it through an SSH tunnel"
        )


def _with_auth_options(command: Any) -> Any:
    for option in reversed(AUTH_OPTIONS):
        command = option(command)
    return command


@click.command(short_help="Serve the operator console (a web page).")
@config_option(
    _read_config,
    "keel serve's TOML settings: the store, auth and operators are read from its "
    "[serve] table. Default: ./keel.toml if it exists.",
)
@data_dir_option("Where keel serve keeps its store (DATA_DIR/keel.db), unless --store says.")
@store_option_helped(
    "Store location. Default: $KEEL_STORE, then the config file, then DATA_DIR/keel.db."
)
@store_timeout_option
@click.option("--host", default="127.0.0.1", show_default=True, envvar="KEEL_OPS_HOST")
@click.option(
    "--port",
    default=8001,
    show_default=True,
    type=click.IntRange(0, 65535),
    envvar="KEEL_OPS_PORT",
    help="0: any free port (named in the 'running on' line).",
)
@click.option("--check", is_flag=True, help="Open the store, print the settings, and exit.")
@_with_auth_options
@click.pass_context
def ops(  # noqa: PLR0917 - click passes every option as an argument
    ctx: click.Context,
    /,
    host: str,
    port: int,
    data_dir: Path,
    store_timeout: float,
    check: bool,
    **auth: Any,
) -> None:
    """Serve the operator console at http://HOST:PORT/ops: every task of the store,
    newest first; answer, cancel, retry tasks. Without --auth it listens on loopback only
    and actions are recorded as made by "local operator"; with --auth (as keel serve's)
    it asks for a token and records the token's name (--operators: only theirs). It reads
    the store, auth and operators of keel.toml as keel serve does. See docs/ops.md.
    """
    import uvicorn

    from keel.cli.serve import check_port, store_location
    from keel.ops import MOUNT, standalone_app
    from keel.store import open_store
    from keel.store.maintenance import verify

    server_auth = console_auth(host, port, auth)
    if server_auth is None:
        refuse_off_loopback(host)
    operators = console_operators(auth, server_auth)
    location = store_location(ctx, data_dir)
    if location.kind == "memory":
        raise KeelCliError("keel ops cannot use memory://: it would show a store of its own")
    store = open_store(location.url or str(location.path), timeout=store_timeout)
    try:
        verify(store)  # one clear error now if the store cannot be read
        if not check:
            check_port(host, port)
    except BaseException:
        anyio.run(store.close)
        raise
    where = f"{host}:{port}" if port else f"{host}:<a free port, in the 'running on' line>"
    click.echo(f"keel ops: operator console at http://{where}{MOUNT}/", err=True)
    click.echo(f"  store: {location.describe()}", err=True)
    signin = "none (loopback)" if server_auth is None else server_auth.description
    click.echo(f"  auth:  {signin}", err=True)
    if server_auth is not None:
        click.echo(f"  who:   {operators_line(operators)}", err=True)
    config_path = ctx.meta.get("keel.config_path")
    if config_path:
        click.echo(f"  config: {config_path}", err=True)
    if check:
        anyio.run(store.close)
        return
    config = uvicorn.Config(
        standalone_app(
            store,
            auth=None if server_auth is None else server_auth.verifier,
            operators=operators,
        ),
        host=host,
        port=port,
        log_level="info",  # its "running on" line names the port (--port 0)
        access_log=False,
        timeout_graceful_shutdown=2,
    )

    async def run() -> None:
        try:
            await uvicorn.Server(config).serve()
        finally:
            with anyio.CancelScope(shield=True):
                await store.close()

    for signum in (signal.SIGTERM, signal.SIGINT):  # uvicorn raises them again once stopped
        signal.signal(signum, _exit_zero)
    anyio.run(run)


def _exit_zero(_signum: int, _frame: object) -> None:
    raise SystemExit(0)
