"""Task persistence: the :class:`Store` protocol and its adapters.

``open_store(location)`` picks the adapter from a location (see :mod:`keel.store.locations`);
``migrate(location)`` brings that store's schema up to date.
``PostgresStore`` is imported on first use: psycopg is an optional dependency (``pip
install 'keel-tasks[postgres]'``), it takes longer to import than the rest of Keel, and
only PostgreSQL users need it.

``load_queries`` (from :mod:`keel.store.sqlfiles`) is public for any part of Keel that keeps
its SQL in a package's ``.sql`` file, like the Bridge's trace index.
"""

import typing

from keel.store.base import TxStore
from keel.store.changes import Change, ChangeFeed
from keel.store.locations import (
    DEFAULT_LOCATION,
    ENV_VAR,
    Location,
    MigrationReport,
    migrate,
    open_store,
    parse_location,
    resolve_location,
)
from keel.store.memory import MemoryStore
from keel.store.protocol import Clock, Store
from keel.store.sqlfiles import load_queries
from keel.store.sqlite import SqliteStore, Synchronous

if typing.TYPE_CHECKING:
    from keel.store.postgres import PostgresStore

__all__ = [
    "DEFAULT_LOCATION",
    "ENV_VAR",
    "Change",
    "ChangeFeed",
    "Clock",
    "Location",
    "MemoryStore",
    "MigrationReport",
    "PostgresStore",
    "SqliteStore",
    "Store",
    "Synchronous",
    "TxStore",
    "load_queries",
    "migrate",
    "open_store",
    "parse_location",
    "resolve_location",
]


def __getattr__(name: str) -> typing.Any:
    if name == "PostgresStore":
        from keel.store.locations import load_postgres_adapter

        load_postgres_adapter()  # without psycopg: a ConfigurationError naming the extra
        from keel.store.postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), "PostgresStore"})
