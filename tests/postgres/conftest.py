"""Fixtures of the PostgreSQL tests: a private schema per test, dropped afterwards."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from contract.support import FakeClock
from keel.store import PostgresStore

from .pg import drop_schema, new_schema, require_postgres, store_url


@pytest.fixture
def schema() -> Iterator[str]:
    """A fresh schema name on the test server (skips or fails without a server)."""
    require_postgres()
    name = new_schema()
    try:
        yield name
    finally:
        drop_schema(name)


@pytest.fixture
def pg_url(schema: str) -> str:
    """A store URL for the test's schema."""
    return store_url(schema)


@pytest.fixture
async def open_pg(schema: str) -> AsyncIterator[Callable[..., PostgresStore]]:
    """Open PostgresStores on the test's schema (``open_pg(clock=…, **url_options)``);
    every one is closed afterwards."""
    opened: list[PostgresStore] = []

    def factory(clock: FakeClock | None = None, **options: str) -> PostgresStore:
        store = PostgresStore(store_url(schema, **options), clock=clock)
        opened.append(store)
        return store

    yield factory
    for store in reversed(opened):
        await store.close()
