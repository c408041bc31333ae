"""The SQLite adapter's reads of live leases (:mod:`keel.store.leases`): a mixin of
:class:`~keel.store.sqlite.tx.SqliteTx`, its statements in ``leases.sql``."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping

from keel.model import Task
from keel.store.leases import LeaseMark, WorkerLeases
from keel.store.rows import task_from_row
from keel.store.sqlfiles import load_queries

__all__ = ["SqliteLeases"]

L = load_queries("keel.store.sqlite", "leases.sql")


class SqliteLeases:
    """Lease reads over the transaction's connection (``_c``)."""

    _c: sqlite3.Connection

    def _tasks(self, query: str, params: dict[str, object]) -> list[Task]:
        return [task_from_row(row) for row in self._c.execute(L[query], params)]

    def worker_leases(self, now: float) -> list[WorkerLeases]:
        rows = self._c.execute(L["worker_leases"], {"now": now})
        return [
            WorkerLeases(
                r["worker"],
                int(r["leases"]),
                int(r["expired"]),
                r["last_renewal"],
                r["oldest_renewal"],
                r["next_expiry"],
            )
            for r in rows
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
            params = {"cutoffs": json.dumps(dict(cutoffs)), "limit": limit}
            rows = self._c.execute(L["claimed_before"], params)
            overdue = [(task_from_row(r), float(r["claimed_at"])) for r in rows]
        return lapsed, waiting, overdue
