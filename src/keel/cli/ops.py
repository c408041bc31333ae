"""``keel ops``: the operator console (:mod:`keel.ops`) served alone, over a store.

It reads the same store as ``keel serve`` and ``keel tasks`` (``--store``, ``$KEEL_STORE``,
default ``keel-data/keel.db``). Without ``--auth`` it listens on loopback only (another
host is refused with one line); with ``--auth tokens:FILE`` or ``--auth jwt`` (the same
verifiers as ``keel serve --auth``) it asks for a token and may listen anywhere.
"""

from __future__ import annotations

import signal
from typing import Any

import anyio
import click

from keel.cli.access import AUTH_OPTIONS, console_auth
from keel.cli.common import KeelCliError, chosen_location, store_option, store_timeout_option

__all__ = ["ops"]


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
@store_option
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
def ops(
    ctx: click.Context, /, host: str, port: int, store_timeout: float, check: bool, **auth: Any
) -> None:
    """Serve the operator console at http://HOST:PORT/ops: every task of the store,
    newest first; answer, cancel, retry tasks. Without --auth it listens on loopback only
    and actions are recorded as made by "local operator"; with --auth (as keel serve's)
    it asks for a token and records the token's name. See docs/ops.md.
    """
    import uvicorn

    from keel.cli.serve import check_port
    from keel.ops import MOUNT, standalone_app
    from keel.store import open_store
    from keel.store.maintenance import verify

    server_auth = console_auth(host, port, auth)
    if server_auth is None:
        refuse_off_loopback(host)
    location = chosen_location(ctx)
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
    if check:
        anyio.run(store.close)
        return
    config = uvicorn.Config(
        standalone_app(store, auth=None if server_auth is None else server_auth.verifier),
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
