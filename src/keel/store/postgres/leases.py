"""The PostgreSQL adapter's reads of live leases (:mod:`keel.store.leases`): a mixin of
:class:`~keel.store.postgres.tx.PgTx`, its statements in ``leases.sql``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import psycopg

from keel.store.leases import SqlLeaseReads
from keel.store.sqlfiles import load_queries

__all__ = ["PgLeases"]

L = load_queries("keel.store.postgres", "leases.sql")


class _HoldsBack(Protocol):
    """What the transaction holds back (``GroupState``): sent before a read sees it."""

    def flush(self, cur: psycopg.Cursor[dict[str, Any]]) -> None: ...


class PgLeases(SqlLeaseReads):
    """Lease reads over the transaction's cursor (``_cur``), after what it holds back."""

    _cur: psycopg.Cursor[dict[str, Any]]
    _s: _HoldsBack

    def _rows(self, query: str, params: dict[str, Any]) -> list[Mapping[str, Any]]:
        self._s.flush(self._cur)
        return list(self._cur.execute(L[query].encode(), params).fetchall())

    def _deadline_params(self, cutoffs: Mapping[str, float]) -> dict[str, Any]:
        return {"names": list(cutoffs), "cutoffs": list(cutoffs.values())}
