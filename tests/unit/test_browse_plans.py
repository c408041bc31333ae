"""Unit: every browse the console makes is an index range scan in SQLite, never a sort.

``EXPLAIN QUERY PLAN`` of the browse statement for each filter column, first page and a
later one (with a cursor): it reads one of the ``0003_browse`` indexes in order, so a
page costs the same on a store of a million tasks as on an empty one.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from keel.store import SqliteStore
from keel.store.browse import Position, TaskFilter, sql_where
from keel.store.sqlite.tx import Q

FILTERS = {
    "none": ({}, "tasks_created"),
    "status": ({"status": "working"}, "tasks_status_created"),
    "name": ({"name": "diagnose"}, "tasks_name_created"),
    "owner": ({"owner": "alice"}, "tasks_owner_created"),
    "created": ({"created_from": 1.0, "created_to": 2.0}, "tasks_created"),
    "updated": ({"updated_from": 1.0}, "tasks_created"),
}


@pytest.mark.parametrize("cursor", [None, Position(1.5, "0190abc")], ids=["first", "later"])
@pytest.mark.parametrize("kind", list(FILTERS))
def test_each_filter_reads_its_index_in_order(tmp_path: Path, kind: str, cursor: Any) -> None:
    """The plan names the filter's index and has no temporary B-tree (no sort)."""
    path = tmp_path / "keel.db"
    SqliteStore(path).close_sync()
    where, index = FILTERS[kind]
    condition, params = sql_where(TaskFilter(**where), cursor, lambda name: f":{name}")
    query = Q["browse_tasks"].replace("{where}", condition)
    with sqlite3.connect(path) as conn:
        plan = [r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN {query}", {**params, "limit": 5})]
    assert len(plan) == 1, plan
    assert f"USING INDEX {index}" in plan[0]
    assert "TEMP B-TREE" not in " ".join(plan)
