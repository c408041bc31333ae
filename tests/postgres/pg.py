"""Where the PostgreSQL tests find their server, and a private schema per test.

The server is ``$KEEL_TEST_POSTGRES`` (default ``postgresql://postgres@127.0.0.1:5432/test``,
the one ``.ci/run`` starts). Without one, the tests marked ``postgres`` skip, except with
``KEEL_REQUIRE_POSTGRES=1`` (CI), where they fail: CI must never pass by skipping them.

Every test gets schemas of its own (``schema=`` in the store URL), dropped afterwards, so
tests can run side by side in one database and never see each other's rows.
"""

from __future__ import annotations

import functools
import hashlib
import os
import secrets
from urllib.parse import urlencode

import psycopg
import pytest
from psycopg import sql

__all__ = [
    "BASE_URL",
    "admin",
    "drop_schema",
    "new_schema",
    "require_postgres",
    "schema_for",
    "store_url",
]

BASE_URL = os.environ.get("KEEL_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
REQUIRED = os.environ.get("KEEL_REQUIRE_POSTGRES") == "1"


@functools.cache
def _unavailable() -> str | None:
    """Why the test server cannot be reached (None when it can)."""
    try:
        with psycopg.connect(BASE_URL, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return " ".join(str(exc).split())
    return None


def require_postgres() -> None:
    """Skip the test without a server, or fail it when KEEL_REQUIRE_POSTGRES=1."""
    why = _unavailable()
    if why is None:
        return
    message = f"PostgreSQL at {BASE_URL} is not reachable: {why}"
    if REQUIRED:
        pytest.fail(f"{message} (KEEL_REQUIRE_POSTGRES=1: the PostgreSQL tests must run)")
    pytest.skip(message)


def new_schema() -> str:
    """A fresh, random schema name (the store creates it)."""
    return f"keel_test_{secrets.token_hex(6)}"


def schema_for(key: str) -> str:
    """The same schema name for the same key (a test's data folder): reopen finds it."""
    return f"keel_test_{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def store_url(schema: str, **options: str) -> str:
    """The test server's URL with Keel's ``schema`` and other options."""
    query = urlencode({"schema": schema, **options})
    return f"{BASE_URL}{'&' if '?' in BASE_URL else '?'}{query}"


def admin() -> psycopg.Connection[tuple[object, ...]]:
    """A plain autocommit connection to the test database."""
    return psycopg.connect(BASE_URL, autocommit=True)


def drop_schema(schema: str) -> None:
    """Drop a test schema and everything in it (missing is fine)."""
    with admin() as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
