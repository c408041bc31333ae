"""Task persistence: the :class:`Store` protocol and its adapters.

``open_store(location)`` picks the adapter from a location (see :mod:`keel.store.locations`).
"""

from keel.store.base import TxStore
from keel.store.locations import (
    DEFAULT_LOCATION,
    ENV_VAR,
    Location,
    open_store,
    parse_location,
    resolve_location,
)
from keel.store.memory import MemoryStore
from keel.store.protocol import Clock, Store
from keel.store.sqlite import SqliteStore, Synchronous

__all__ = [
    "DEFAULT_LOCATION",
    "ENV_VAR",
    "Clock",
    "Location",
    "MemoryStore",
    "SqliteStore",
    "Store",
    "Synchronous",
    "TxStore",
    "open_store",
    "parse_location",
    "resolve_location",
]
