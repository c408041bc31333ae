"""The ``keel`` command group: global options, error handling, and where commands plug in.

Commands live in their own modules and are added here with ``cli.add_command``; later
ones (``keel serve``, ``keel worker``, ``keel db migrate``, ``keel bridge …``) slot in the
same way. Exit codes: 0 ok; 1 an operational error, printed as one line
``keel: error: …`` (every :class:`~keel.errors.KeelError`, never a traceback); 2 a usage
error (click's own).
"""

from __future__ import annotations

from typing import Any

import click

from keel import __version__
from keel.cli.common import KeelCliError, chosen_location, store_option
from keel.cli.db import db
from keel.cli.serve import serve
from keel.cli.tasks import tasks
from keel.cli.worker import worker
from keel.errors import KeelError

__all__ = ["cli", "main"]


class KeelGroup(click.Group):
    """A group that reports Keel's own errors as one line and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeelError as exc:
            raise KeelCliError(str(exc)) from exc


@click.group(cls=KeelGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="keel")
@store_option
def cli() -> None:
    """Keel: durable long-running tasks for MCP servers.

    The store is chosen by --store URL (here or on any subcommand), else $KEEL_STORE,
    else keel-data/keel.db under the current directory.
    """


@cli.command(short_help="Play the seed's incident: ask, restart, answer, complete.")
@store_option
@click.pass_context
def demo(ctx: click.Context) -> None:
    """Play the seed's incident against the store: ask, restart, answer, complete.

    Runs in the chosen store (default keel-data/keel.db) with a fresh idempotency key each
    time, so it can run again; its task stays behind for `keel tasks show` and is
    purgeable after a day.
    """
    from keel.demo import run_demo

    run_demo(chosen_location(ctx), click.echo)


cli.add_command(tasks)


cli.add_command(worker)
cli.add_command(serve)
cli.add_command(db)


def main() -> None:
    """Run the ``keel`` command line."""
    cli(prog_name="keel")
