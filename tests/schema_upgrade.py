"""Rows as a store of schema SQLite 5 / PostgreSQL 3 held them, for the upgrade tests.

Those versions kept a task's trace context as the reserved step ``keel:trace-context``
and no claim time: the next migration (``0006_trace_and_claim.sql`` /
``0004_trace_and_claim.sql``) moves the step into the task's ``trace_context`` column and
sets ``claimed_at`` of a leased task from its latest history entry (its claim).
"""

from __future__ import annotations

from typing import Any

from keel.model import Status, Task
from keel.store import Store
from keel.store.rows import compact_json, task_to_row

__all__ = ["CARRIER", "CLAIMED_AT", "OldStore", "check_upgraded"]

CARRIER = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
NOW = 1_700_000_000.0
CLAIMED_AT = NOW - 2
NEW_COLUMNS = ("trace_context", "claimed_at")


class OldStore:
    """The rows of two tasks: ``leased`` (created traced, claimed, a step recorded) and
    ``plain`` (created outside any span, never claimed)."""

    def __init__(self) -> None:
        self.leased = Task(
            task_id="t-leased", status=Status.WORKING, owner="", name="job", arguments={},
            created_at=NOW - 5, updated_at=NOW - 1, lease_owner="w1",
            lease_expires_at=NOW + 30, fence=1, ready_at=NOW - 5,
        )  # fmt: skip
        self.plain = Task(
            task_id="t-plain", status=Status.WORKING, owner="", name="job", arguments={},
            created_at=NOW - 4, updated_at=NOW - 4, ready_at=NOW - 4,
        )  # fmt: skip
        self.tasks: list[dict[str, Any]] = [
            {k: v for k, v in task_to_row(t).items() if k not in NEW_COLUMNS}
            for t in (self.leased, self.plain)
        ]
        self.steps: list[tuple[str, str, str, float]] = [
            ("t-leased", "keel:trace-context", compact_json(CARRIER), NOW - 5),
            ("t-leased", "fetch", "1", NOW - 1),
        ]
        self.events: list[tuple[str, float, str | None, str, str, str]] = [
            ("t-leased", NOW - 5, None, "working", "created", "client"),
            ("t-plain", NOW - 4, None, "working", "created", "client"),
            ("t-leased", CLAIMED_AT, "working", "working", "claimed by w1", "worker:w1"),
        ]

    def fill(self, cursor: Any, named: str, positional: str) -> None:
        """Insert the rows with ``cursor`` (a sqlite3 connection, a psycopg cursor):
        ``named`` formats a column's named parameter (``:{}``, ``%({})s``), and
        ``positional`` is the driver's positional one (``?``, ``%s``)."""
        columns = list(self.tasks[0])
        values = ", ".join(named.format(c) for c in columns)
        insert = f"INSERT INTO tasks ({', '.join(columns)}) VALUES ({values})"
        cursor.executemany(insert, self.tasks)
        marks = ", ".join([positional] * 4)
        cursor.executemany(f"INSERT INTO task_steps VALUES ({marks})", self.steps)
        marks = ", ".join([positional] * 6)
        cursor.executemany(
            "INSERT INTO task_events (task_id, at, from_status, to_status, reason, actor)"
            f" VALUES ({marks})",
            self.events,
        )


async def check_upgraded(store: Store) -> None:
    """The tasks of :class:`OldStore` as the upgraded ``store`` must show them."""
    leased, plain = await store.get("t-leased"), await store.get("t-plain")
    assert (leased.trace_context, leased.claimed_at) == (CARRIER, CLAIMED_AT)
    assert (plain.trace_context, plain.claimed_at) == (None, None)
    assert await store.steps("t-leased") == {"fetch": 1}
    assert await store.steps("t-plain") == {}
