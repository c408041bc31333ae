"""``keel db``: the store's schema. ``keel db migrate`` applies missing migrations.

Every store applies its migrations on first use anyway; ``migrate`` lets a deployment do
it once, up front (say, before rolling out workers of a new version), and says what it did.
"""

from __future__ import annotations

import click

from keel.cli.common import KeelCliError, chosen_location, store_option

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
    location = chosen_location(ctx)
    if location.kind == "memory":
        raise KeelCliError("memory:// has no schema to migrate")
    if location.kind == "postgres":
        import psycopg

        from keel.errors import ConfigurationError, StoreError
        from keel.store.postgres import parse_postgres_url
        from keel.store.postgres.faults import describe
        from keel.store.postgres.schema import SCHEMA_VERSION
        from keel.store.postgres.schema import migrate as apply

        options = parse_postgres_url(location.url)
        try:
            conn = psycopg.connect(options.conninfo, autocommit=True)
        except psycopg.OperationalError as exc:
            raise ConfigurationError(
                f"cannot connect to PostgreSQL at {options.host}:{options.port} "
                f"(database {options.dbname}): {' '.join(str(exc).split())}"
            ) from exc
        try:
            with conn:
                applied = apply(conn, options.schema, options.display)
        except psycopg.Error as exc:
            raise StoreError(describe(exc, options.display)) from exc
        where, version = options.display, SCHEMA_VERSION
    else:
        from keel.store.sqlite import SCHEMA_VERSION as SQLITE_VERSION
        from keel.store.sqlite import SqliteStore

        assert location.path is not None
        existed = location.path.exists()
        store = SqliteStore(location.path, synchronous=location.options.get("synchronous", "full"))
        store.close_sync()
        where, version = str(location.path), SQLITE_VERSION
        applied = [] if existed else list(range(1, version + 1))
    if applied:
        click.echo(f"{where}: applied migration(s) {', '.join(map(str, applied))}; "
                   f"schema version {version}")  # fmt: skip
    else:
        click.echo(f"{where}: schema version {version}, up to date")
