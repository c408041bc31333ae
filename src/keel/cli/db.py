"""``keel db``: the store's schema. ``keel db migrate`` applies missing migrations.

Every store applies its migrations on first use anyway; ``migrate`` lets a deployment do
it once, up front (say, before rolling out workers of a new version), and says what it did.
The work is :func:`keel.store.migrate`'s; this module only prints its report. Its errors
are :mod:`keel.errors` types, which the ``keel`` group prints as one line.
"""

from __future__ import annotations

import click

from keel.cli.common import chosen_location, store_option
from keel.store import migrate as migrate_store

__all__ = ["db"]


@click.group(short_help="The store's schema: migrations.")
def db() -> None:
    """The store's schema."""


@db.command(short_help="Apply the schema migrations the store is missing.")
@store_option
@click.pass_context
def migrate(ctx: click.Context) -> None:
    """Bring the store's schema up to this Keel's version (a no-op when it is).

    PostgreSQL: applied under an advisory lock, so running it from several machines at
    once is safe. SQLite: the file is created if missing.
    """
    report = migrate_store(chosen_location(ctx).url)
    if report.applied:
        click.echo(f"{report.where}: applied migration(s) {', '.join(map(str, report.applied))}; "
                   f"schema version {report.version}")  # fmt: skip
    else:
        click.echo(f"{report.where}: schema version {report.version}, up to date")
