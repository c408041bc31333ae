"""Unit: every lease read of the console's ``/workers`` page reads an index in SQLite.

``EXPLAIN QUERY PLAN`` of each statement of ``keel/store/sqlite/leases.sql``: the per-worker
summary reads the ``0004_leases`` index alone (covering), a worker's page is a range of
it, input waits are a range of ``tasks_waiting`` in order, and the deadline check walks
the leased tasks (``tasks_leased``), never every task of a tool.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from keel.store import SqliteStore
from keel.store.sqlite.leases import L

PARAMS = {
    "now": 1.0,
    "worker": "w",
    "limit": 5,
    "mark_at": 1.0,
    "mark_id": "x",
    "before": 1.0,
    "cutoffs": json.dumps({"diagnose": 1.0}),
}
READS = {
    "worker_leases": "USING COVERING INDEX tasks_lease_owner",
    "leased_by": "USING INDEX tasks_lease_owner (lease_owner=?)",
    "leased_by_after": "USING INDEX tasks_lease_owner (lease_owner=? AND",
    "lapsed_leases": "USING INDEX tasks_leased (lease_expires_at<?)",
    "waiting_since": "USING INDEX tasks_waiting (updated_at<?)",
    "claimed_before": "SCAN lease USING INDEX tasks_leased",
}


@pytest.mark.parametrize("read", list(READS))
def test_each_lease_read_uses_its_index(tmp_path: Path, read: str) -> None:
    """The plan reads the named index; no full scan of the tasks table."""
    path = tmp_path / "keel.db"
    SqliteStore(path).close_sync()
    with sqlite3.connect(path) as conn:
        plan = [r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN {L[read]}", PARAMS)]
    assert any(READS[read] in step for step in plan), plan
    whole_table = [s for s in plan if s.split()[:2] in (["SCAN", "tasks"], ["SCAN", "lease"])]
    assert all("INDEX" in step for step in whole_table), plan
    if read in {"worker_leases", "leased_by", "leased_by_after", "waiting_since"}:
        assert "TEMP B-TREE" not in " ".join(plan), plan  # read in order: no sort
