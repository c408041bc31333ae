"""The SQLite adapter's reads of live leases (:mod:`keel.store.leases`): a mixin of
:class:`~keel.store.sqlite.tx.SqliteTx`, its statements in ``leases.sql``."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from typing import Any

from keel.store.leases import SqlLeaseReads
from keel.store.sqlfiles import load_queries

__all__ = ["SqliteLeases"]

L = load_queries("keel.store.sqlite", "leases.sql")


class SqliteLeases(SqlLeaseReads):
    """Lease reads over the transaction's connection (``_c``)."""

    _c: sqlite3.Connection

    def _rows(self, query: str, params: dict[str, Any]) -> list[Mapping[str, Any]]:
        return list(self._c.execute(L[query], params))

    def _deadline_params(self, cutoffs: Mapping[str, float]) -> dict[str, Any]:
        return {"cutoffs": json.dumps(dict(cutoffs))}
