"""The ``keel`` command group: global options, error handling, and where commands plug in.

Commands live in their own modules, named here in :data:`COMMANDS` and imported when
one is run (or listed, by ``--help``): ``keel worker`` does not import what ``keel serve``
or ``keel tasks`` need, and its start-up is counted in every worker process (issue 19).
Exit codes: 0 ok; 1 an operational error, printed as one line
``keel: error: …`` (every :class:`~keel.errors.KeelError`, never a traceback); 2 a usage
error (click's own).

Anything else escaping a command is a bug of Keel's; it too ends in one line, ``keel:
error: internal error: <type>: <message> (please report)``, exit code 1, unless
``$KEEL_DEBUG`` is set (``KEEL_DEBUG=1 keel …``), which shows the traceback instead.
"""

from __future__ import annotations

import errno
import importlib
import io
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from keel.cli.common import (
    CliState,
    KeelCliError,
    chosen_location,
    data_dir_option,
    store_option,
)
from keel.errors import KeelError
from keel.store import ENV_VAR

__all__ = ["COMMANDS", "DEBUG_ENV", "cli", "main"]

DEBUG_ENV = "KEEL_DEBUG"
"""Set (to anything but empty or 0), an unexpected exception shows its traceback."""

COMMANDS = {
    "auth": "keel.cli.auth:auth",
    "backup": "keel.cli.maintenance:backup",
    "bridge": "keel.cli.bridge:bridge",
    "check": "keel.cli.maintenance:check",
    "db": "keel.cli.db:db",
    "ops": "keel.cli.ops:ops",
    "serve": "keel.cli.serve:serve",
    "tasks": "keel.cli.tasks:tasks",
    "worker": "keel.cli.worker:worker",
}
"""The commands of ``keel`` defined in modules of their own: name -> ``module:attribute``."""


def _show_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        from keel.mcp.version import keel_version  # read on first use, not by every command

        click.echo(f"keel, version {keel_version()}")
        ctx.exit()


class KeelGroup(click.Group):
    """A group that reports Keel's own errors as one line and exit code 1.

    Its ``make_context`` parses the root options and its ``invoke`` runs every subcommand
    (their parsing included), so between them they see every error of every command.

    Args:
        lazy: commands imported on first use, by name (``module:attribute``).
    """

    def __init__(self, *args: Any, lazy: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        spec = self.lazy.pop(cmd_name, None)
        if spec is not None and cmd_name not in self.commands:
            module, _, attribute = spec.partition(":")
            self.add_command(getattr(importlib.import_module(module), attribute), cmd_name)
        return super().get_command(ctx, cmd_name)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        # What a command prints may hold a file name that is not UTF-8 (a lone surrogate
        # in Python): escape it, as Python's stderr does, rather than fail on stdout.
        if isinstance(sys.stdout, io.TextIOWrapper) and sys.stdout.errors == "strict":
            sys.stdout.reconfigure(errors="backslashreplace")
        return super().main(*args, **kwargs)

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        with _one_line_errors():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with _one_line_errors():
            return super().invoke(ctx)


_CLICKS_OWN: tuple[type[BaseException], ...] = (
    click.ClickException,  # usage errors (exit 2) and KeelCliError
    click.exceptions.Exit,
    click.Abort,
    EOFError,  # click turns it into "Aborted!"
)


@contextmanager
def _one_line_errors() -> Iterator[None]:
    try:
        yield
    except KeelError as exc:
        raise KeelCliError(str(exc)) from exc
    except _CLICKS_OWN:
        raise
    except Exception as exc:
        if isinstance(exc, OSError) and exc.errno == errno.EPIPE:
            raise  # a closed pipe (keel tasks list | head): click exits quietly
        if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            raise
        # The last resort: a bug of Keel's. The cause is fixed where it is; until then
        # the user sees one line to report, not a traceback.
        message = str(exc)
        if len(message) > 300:
            message = f"{message[:300]}…"
        raise KeelCliError(
            f"internal error: {type(exc).__name__}: {message} (please report; "
            f"{DEBUG_ENV}=1 shows the traceback)"
        ) from exc


@click.group(cls=KeelGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_show_version,
    help="Show the version and exit.",
)
@store_option
def cli() -> None:
    """Keel: durable long-running tasks for MCP servers.

    The store is chosen by --store URL (here or on any subcommand), else $KEEL_STORE,
    else keel-data/keel.db under the current directory.
    """


@cli.command(short_help="Play the seed's incident over MCP: ask, kill, restart, answer.")
@data_dir_option("The data directory of the keel serve it starts.")
@click.option(
    "--store-only",
    is_flag=True,
    help="Play it against the task store alone (no server), with the seed's injections 8A-8E.",
)
@click.option(
    "--protocol",
    type=click.Choice(["2026-07-28", "2025-11-25"]),
    default="2026-07-28",
    show_default=True,
    help="The MCP tasks protocol the demo's client speaks.",
)
@store_option
@click.pass_context
def demo(ctx: click.Context, data_dir: Path, store_only: bool, protocol: str) -> None:
    """Play the seed's incident over MCP against a real `keel serve`.

    Starts `keel serve` (Incident Bridge) on a free port, asks for a root-cause
    diagnosis without naming the service, SIGKILLs the server while the task waits for
    that input, restarts it, answers through tasks/update (with --protocol 2025-11-25:
    through tasks/result and elicitation/create), and prints the cited conclusion. The
    task stays in DATA_DIR/keel.db for `keel tasks show`.
    """
    if store_only:
        from keel.cli.store_demo import run_demo as run_store_demo

        run_store_demo(chosen_location(ctx), click.echo)
        return
    from keel.cli.demo import run_demo

    state = ctx.find_object(CliState)
    run_demo(
        data_dir,
        (state.store if state else None) or os.environ.get(ENV_VAR) or None,
        click.echo,
        protocol=protocol,
    )


def main() -> None:
    """Run the ``keel`` command line."""
    cli(prog_name="keel")
