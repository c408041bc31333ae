"""The PostgreSQL schema: migrations in ``migrations/NNNN_name.sql``, applied in order.

Applied on first use (every :class:`~keel.store.postgres.PostgresStore` checks when it
opens) and by ``keel db migrate`` (through :func:`keel.store.migrate` and
:func:`migrate_store`). Processes that start together may all find the schema
missing: the migration runs under a transaction-scoped advisory lock, and each process
checks the version again once it holds the lock, so exactly one applies each migration.
``keel_schema`` records which ones are applied.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg import sql

from keel.errors import StoreError
from keel.store.postgres.config import PostgresOptions
from keel.store.postgres.faults import cannot_connect, store_error
from keel.store.sqlfiles import load_migrations

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "current_version", "migrate", "migrate_store"]

MIGRATIONS = load_migrations(f"{__package__}.migrations")
SCHEMA_VERSION = MIGRATIONS[-1].version
"""The schema version this Keel writes and reads."""

_CREATE_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS keel_schema (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at double precision NOT NULL
)
"""


def current_version(conn: psycopg.Connection[Any]) -> int:
    """The highest applied migration (0 for an empty schema)."""
    row = conn.execute("SELECT to_regclass('keel_schema') IS NOT NULL").fetchone()
    if row is None or not row[0]:
        return 0
    row = conn.execute("SELECT coalesce(max(version), 0) FROM keel_schema").fetchone()
    return 0 if row is None else int(row[0])


def _check(version: int, where: str) -> None:
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"PostgreSQL store {where} has schema version {version}, newer than this Keel "
            f"supports ({SCHEMA_VERSION}); upgrade keel-tasks"
        )


def migrate(conn: psycopg.Connection[Any], schema: str | None, where: str) -> list[int]:
    """Bring the schema up to :data:`SCHEMA_VERSION`; the versions applied (often none).

    ``conn`` must be in autocommit mode; each run is one transaction.

    Raises:
        StoreError: the schema is newer than this Keel.
        psycopg.Error: the database refused (the caller maps it).
    """
    # A read first: an up-to-date schema (every open but the first) takes no lock.
    version = current_version(conn)
    _check(version, where)
    if version == SCHEMA_VERSION:
        return []
    applied: list[int] = []
    with conn.transaction():
        target = schema if schema is not None else str(_scalar(conn, "SELECT current_schema()"))
        conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"keel.migrate:{target}",)
        )
        if schema is not None:
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(_CREATE_VERSION_TABLE)
        version = current_version(conn)
        _check(version, where)
        for migration in MIGRATIONS[version:]:
            # No parameters: psycopg sends the file as one simple query, statements and all.
            conn.execute(migration.sql.encode())
            conn.execute(
                "INSERT INTO keel_schema (version, name, applied_at) VALUES (%s, %s, %s)",
                (migration.version, migration.name, time.time()),
            )
            applied.append(migration.version)
    return applied


def migrate_store(options: PostgresOptions) -> list[int]:
    """Connect once, bring the schema up to :data:`SCHEMA_VERSION`, disconnect; the
    versions applied (empty when it was up to date).

    Raises:
        ConfigurationError: no server at the URL's address would talk to us.
        StoreError: the database refused, or its schema is newer than this Keel.
    """
    try:
        conn = psycopg.connect(options.conninfo, autocommit=True)
    except psycopg.OperationalError as exc:
        raise cannot_connect(exc, options.address) from exc
    try:
        with conn:
            return migrate(conn, options.schema, options.display)
    except psycopg.Error as exc:
        raise store_error(exc, options.display) from exc


def _scalar(conn: psycopg.Connection[Any], query: str) -> object:
    row = conn.execute(query.encode()).fetchone()
    return None if row is None else row[0]
