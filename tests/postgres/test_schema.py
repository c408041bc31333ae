"""PostgreSQL schema: migrations, the version table, concurrent first use, and the
catalog of a migrated store against the migrations' SQL applied by hand."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from psycopg import sql

from keel import StoreError
from keel.store import PostgresStore
from keel.store.postgres.schema import _CREATE_VERSION_TABLE, MIGRATIONS, SCHEMA_VERSION
from schema_upgrade import OldStore, check_upgraded

from .pg import admin, drop_schema, new_schema, store_url

pytestmark = pytest.mark.postgres


def catalog(schema: str) -> dict[str, Any]:
    """Tables, columns, indexes and constraints of ``schema``, with its name taken out."""
    with admin() as conn:
        columns = conn.execute(
            "SELECT table_name, column_name, data_type, is_nullable, column_default,"
            " is_identity FROM information_schema.columns WHERE table_schema = %s"
            " ORDER BY table_name, ordinal_position",
            (schema,),
        ).fetchall()
        indexes = conn.execute(
            "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = %s"
            " ORDER BY indexname",
            (schema,),
        ).fetchall()
        constraints = conn.execute(
            "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(c.oid)"
            " FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace"
            " WHERE n.nspname = %s ORDER BY conname",
            (schema,),
        ).fetchall()
    strip = lambda rows: [tuple(str(v).replace(f"{schema}.", "") for v in r) for r in rows]  # noqa: E731
    return {"columns": strip(columns), "indexes": strip(indexes), "constraints": strip(constraints)}


def test_fresh_schema_equals_all_migrations_applied(schema):
    """A store's schema is exactly its migrations' SQL applied in order (plus keel_schema)."""
    PostgresStore(store_url(schema)).close_sync()
    reference = new_schema()
    try:
        with admin() as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(reference)))
            conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(reference)))
            for migration in MIGRATIONS:
                conn.execute(migration.sql.encode())
        expected = catalog(reference)
    finally:
        drop_schema(reference)
    actual = catalog(schema)
    for part in actual.values():
        part[:] = [row for row in part if "keel_schema" not in row[0]]
    assert actual == expected
    names = {row[1] for row in expected["indexes"]}
    assert {"tasks_ready", "tasks_leased", "tasks_expiry", "tasks_owner_idempotency_key"} <= names
    key_index = next(r[2] for r in expected["indexes"] if r[1] == "tasks_owner_idempotency_key")
    assert "UNIQUE" in key_index
    assert "(owner, idempotency_key)" in key_index
    assert "WHERE (idempotency_key IS NOT NULL)" in key_index


def test_schema_version_is_recorded_once(schema):
    """keel_schema holds every migration once; reopening applies nothing again."""
    PostgresStore(store_url(schema)).close_sync()
    store = PostgresStore(store_url(schema))
    store.close_sync()
    assert store.schema_version == SCHEMA_VERSION
    with admin() as conn:
        rows = conn.execute(
            sql.SQL("SELECT version, name FROM {}.keel_schema ORDER BY version").format(
                sql.Identifier(schema)
            )
        ).fetchall()
    assert rows == [(m.version, m.name) for m in MIGRATIONS]


def test_concurrent_first_use_migrates_once(schema):
    """Six stores opened at once on an empty schema: all open, each migration applied once."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def open_one() -> None:
        try:
            barrier.wait(timeout=30)
            PostgresStore(store_url(schema)).close_sync()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    with admin() as conn:
        count = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.keel_schema").format(sql.Identifier(schema))
        ).fetchone()
    assert count == (SCHEMA_VERSION,)


def test_newer_schema_is_refused(schema):
    """A schema newer than this Keel raises StoreError naming both versions."""
    PostgresStore(store_url(schema)).close_sync()
    with admin() as conn:
        conn.execute(
            sql.SQL("INSERT INTO {}.keel_schema VALUES (%s, 'future', 0)").format(
                sql.Identifier(schema)
            ),
            (SCHEMA_VERSION + 1,),
        )
    with pytest.raises(StoreError, match="newer") as info:
        PostgresStore(store_url(schema))
    assert str(SCHEMA_VERSION + 1) in str(info.value)
    assert "upgrade" in str(info.value)


@pytest.mark.anyio
async def test_a_store_of_schema_3_keeps_its_traces_after_the_upgrade(schema, open_pg):
    """A schema written by Keel with schema version 3 (trace contexts as the reserved step
    ``keel:trace-context``, no claim times) opens migrated: each trace context in its
    task's column, the reserved step gone, a leased task's claim time from its claim."""
    old = OldStore()
    with admin() as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(schema)))
        conn.execute(_CREATE_VERSION_TABLE)
        for migration in MIGRATIONS[:3]:
            conn.execute(migration.sql.encode())
            conn.execute(
                "INSERT INTO keel_schema VALUES (%s, %s, 0)", (migration.version, migration.name)
            )
        with conn.cursor() as cur:
            old.fill(cur, "%({})s", "%s")
    store = open_pg()
    assert store.schema_version == SCHEMA_VERSION
    await check_upgraded(store)
    with admin() as conn:
        names = conn.execute(
            sql.SQL("SELECT DISTINCT name FROM {}.task_steps").format(sql.Identifier(schema))
        ).fetchall()
    assert names == [("fetch",)]


@pytest.mark.anyio
async def test_closed_store_refuses_work_and_closes_twice(open_pg):
    """A closed store raises StoreError on use; close() is safe to call twice."""
    store = open_pg()
    await store.close()
    await store.close()
    with pytest.raises(StoreError, match="closed"):
        await store.get("anything")
