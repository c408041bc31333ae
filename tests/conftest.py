"""Shared fixtures: a fake clock, and one ``store`` fixture run over every adapter.

The contract suite (``tests/contract``) asks for ``store`` and so runs once per entry of
:data:`ADAPTERS`. Adding an adapter (PostgreSQL) is one more entry there.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from contract.support import FakeClock
from keel.model import Limits
from keel.store import MemoryStore, SqliteStore, Store
from postgres.pg import drop_schema, require_postgres, schema_for, store_url

__all__ = ["ADAPTERS", "Adapter", "FakeClock"]


@dataclass(frozen=True)
class Adapter:
    """How the tests open one store adapter.

    ``open(where, clock, limits)`` opens the store whose data lives at ``where`` (a
    folder private to the test); opening it again at the same place must find the same
    data when ``durable`` is true.
    """

    name: str
    open: Callable[[Path, FakeClock, Limits | None], Store]
    durable: bool
    cleanup: Callable[[Path], None] | None = None
    """Remove what ``open`` left outside ``where`` (a PostgreSQL schema), after the test."""
    marks: tuple[pytest.MarkDecorator, ...] = ()


def _open_memory(where: Path, clock: FakeClock, limits: Limits | None) -> Store:
    return MemoryStore(clock=clock, limits=limits)


def _open_sqlite(where: Path, clock: FakeClock, limits: Limits | None) -> Store:
    return SqliteStore(where / "keel.db", clock=clock, limits=limits)


def _open_sqlite_planned(where: Path, clock: FakeClock, limits: Limits | None) -> Store:
    # Every group of writes planned against a snapshot first, as when other processes
    # write the same file (see keel.store.sqlite.planning).
    return SqliteStore(where / "keel.db", plan="always", clock=clock, limits=limits)


def _open_postgres(where: Path, clock: FakeClock, limits: Limits | None) -> Store:
    # A schema of its own per data folder: the same folder reopens the same data.
    from keel.store import PostgresStore

    require_postgres()
    return PostgresStore(store_url(schema_for(str(where))), clock=clock, limits=limits)


def _drop_postgres(where: Path) -> None:
    drop_schema(schema_for(str(where)))


ADAPTERS: dict[str, Adapter] = {
    "memory": Adapter("memory", _open_memory, durable=False),
    "sqlite": Adapter("sqlite", _open_sqlite, durable=True),
    "sqlite-planned": Adapter("sqlite-planned", _open_sqlite_planned, durable=True),
    "postgres": Adapter(
        "postgres",
        _open_postgres,
        durable=True,
        cleanup=_drop_postgres,
        # slow: a schema created and dropped per test costs ~0.1-0.3 s, and ~400 tests
        # take this adapter (over a minute); the fast loop runs the other three, and
        # tests/postgres the adapter's own tests.
        marks=(pytest.mark.postgres, pytest.mark.slow),
    ),
}


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio (the store has no trio-specific code to cover)."""
    return "asyncio"


@pytest.fixture
def clock() -> FakeClock:
    """A fresh fake clock at a fixed instant."""
    return FakeClock()


@pytest.fixture(params=[pytest.param(name, marks=a.marks) for name, a in ADAPTERS.items()])
def adapter(request: pytest.FixtureRequest) -> Adapter:
    """Each store adapter in turn."""
    return ADAPTERS[request.param]


StoreFactory = Callable[..., Store]


@pytest.fixture
async def make_store(
    adapter: Adapter, tmp_path: Path, clock: FakeClock
) -> AsyncIterator[StoreFactory]:
    """Open stores of the current adapter: ``make_store(limits=None, where=None)``.

    Each call without ``where`` gets a new, empty store; every store is closed afterwards.
    """
    opened: list[Store] = []
    places: set[Path] = set()
    counter = itertools.count()

    def factory(*, limits: Limits | None = None, where: Path | None = None) -> Store:
        if where is None:
            n = next(counter)
            where = tmp_path if n == 0 else tmp_path / f"store-{n}"
        where.mkdir(parents=True, exist_ok=True)
        places.add(where)
        store = adapter.open(where, clock, limits)
        opened.append(store)
        return store

    yield factory
    for store in reversed(opened):
        await store.close()
    if adapter.cleanup is not None:
        for where in places:
            adapter.cleanup(where)


@pytest.fixture
def store(make_store: StoreFactory) -> Store:
    """An empty store of the current adapter, on the fake clock (data under ``tmp_path``)."""
    return make_store()


@pytest.fixture
def reopen(adapter: Adapter, make_store: StoreFactory, tmp_path: Path) -> Callable[[], Store]:
    """Open another handle on the ``store`` fixture's data, as a restarted process would.

    Only durable adapters have data to find again; the test is skipped for the others.
    """
    if not adapter.durable:
        pytest.skip(f"{adapter.name} keeps nothing across a reopen")

    def again() -> Store:
        return make_store(where=tmp_path)

    return again
