"""``keel check`` and ``keel backup``: the store's integrity, and a copy that is whole.

The work is :mod:`keel.store.maintenance`'s; this module prints its reports. Failures
are :mod:`keel.errors` types, which the ``keel`` group prints as one ``keel: error:``
line (exit 1).
"""

from __future__ import annotations

from pathlib import Path

import anyio
import click

from keel.cli.common import chosen_location, store_option
from keel.store.maintenance import backup as backup_store
from keel.store.maintenance import check as check_store

__all__ = ["backup", "check"]


@click.command(short_help="Check the store: integrity, schema version, tasks per status.")
@store_option
@click.pass_context
def check(ctx: click.Context) -> None:
    """Run the store's integrity check and print its schema version and how many tasks
    are in each status.

    SQLite: the full PRAGMA integrity_check (it reads every page and index; safe while
    Keel serves from the file). PostgreSQL: that the server answers and the schema is
    one this Keel reads. Exit code 1, with one line saying what is wrong, if it fails.
    """
    location = chosen_location(ctx)
    report = anyio.run(check_store, location.url)
    click.echo(f"{report.where}: {report.integrity}, schema version {report.version}")
    counts = ", ".join(f"{status.value} {n}" for status, n in report.counts.items())
    click.echo(f"tasks: {sum(report.counts.values())} ({counts})")


@click.command(short_help="Copy the SQLite store to DEST, consistently, even while serving.")
@click.argument("dest", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Replace DEST if it exists (once the copy is checked).")
@store_option
@click.pass_context
def backup(ctx: click.Context, dest: Path, force: bool) -> None:
    """Write a consistent copy of the store to DEST while Keel keeps serving from it.

    SQLite's online backup takes one snapshot of every committed task (copying keel.db
    with cp while Keel runs is not a backup: recent commits may be only in keel.db-wal).
    The copy is checked (integrity_check) before it takes the name DEST; an existing
    DEST is refused unless --force. PostgreSQL: use pg_dump (the error says how).
    """
    location = chosen_location(ctx)
    report = anyio.run(lambda: backup_store(dest, location.url, force=force))
    click.echo(
        f"{report.source} -> {report.dest}: {report.tasks} task(s), {report.size:,} bytes, "
        f"integrity check ok ({report.seconds:.2f} s)"
    )
