"""The PostgreSQL adapter's reads of live leases (:mod:`keel.store.leases`): a mixin of
:class:`~keel.store.postgres.tx.PgTx`, its statements in ``leases.sql``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import psycopg

from keel.model import Task
from keel.store.leases import LeaseMark, WorkerLeases
from keel.store.rows import task_from_row
from keel.store.sqlfiles import load_queries

__all__ = ["PgLeases"]

L = load_queries("keel.store.postgres", "leases.sql")


class _HoldsBack(Protocol):
    """What the transaction holds back (``GroupState``): sent before a read sees it."""

    def flush(self, cur: psycopg.Cursor[dict[str, Any]]) -> None: ...


class PgLeases:
    """Lease reads over the transaction's cursor (``_cur``), after what it holds back."""

    _cur: psycopg.Cursor[dict[str, Any]]
    _s: _HoldsBack

    def _rows(self, query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        self._s.flush(self._cur)
        return self._cur.execute(L[query].encode(), params).fetchall()

    def _tasks(self, query: str, params: dict[str, Any]) -> list[Task]:
        return [task_from_row(r) for r in self._rows(query, params)]

    def worker_leases(self, now: float) -> list[WorkerLeases]:
        return [
            WorkerLeases(
                r["worker"],
                int(r["leases"]),
                int(r["expired"]),
                r["last_renewal"],
                r["oldest_renewal"],
                r["next_expiry"],
            )
            for r in self._rows("worker_leases", {"now": now})
        ]

    def leased_by(self, worker: str, mark: LeaseMark | None, limit: int) -> list[Task]:
        if mark is None:
            return self._tasks("leased_by", {"worker": worker, "limit": limit})
        params = {"worker": worker, "mark_at": mark.expires_at, "mark_id": mark.task_id}
        return self._tasks("leased_by_after", {**params, "limit": limit})

    def stuck(
        self, now: float, waiting_before: float, cutoffs: Mapping[str, float], limit: int
    ) -> tuple[list[Task], list[Task], list[tuple[Task, float]]]:
        lapsed = self._tasks("lapsed_leases", {"now": now, "limit": limit})
        waiting = self._tasks("waiting_since", {"before": waiting_before, "limit": limit})
        overdue = []
        if cutoffs:
            params = {"names": list(cutoffs), "cutoffs": list(cutoffs.values()), "limit": limit}
            rows = self._rows("claimed_before", params)
            overdue = [(task_from_row(r), float(r["claimed_at"])) for r in rows]
        return lapsed, waiting, overdue
