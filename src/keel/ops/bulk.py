"""Bulk cancel: every live task a list filter matches, after a dry-run count.

The first POST counts the live (``working`` or ``input_required``) tasks the filter
matches and asks to confirm that number; the second cancels them, one store call each
(each recorded in its task's history as the operator's), skipping any that finished in
between. At most :data:`MAX_BULK` tasks at once: a larger match is refused at the count,
to be narrowed first.
"""

from __future__ import annotations

import dataclasses

from keel.errors import InvalidPayload, TaskAlreadyTerminal, TaskNotFound
from keel.model import Status
from keel.ops.actions import Actions
from keel.store import Store
from keel.store.browse import MAX_PAGE, TaskFilter

__all__ = ["BULK_REASON", "MAX_BULK", "cancel_all", "live_matching"]

MAX_BULK = 10_000
BULK_REASON = "bulk cancel from the operator console"
_LIVE = (Status.WORKING, Status.INPUT_REQUIRED)


async def live_matching(store: Store, where: TaskFilter) -> list[str]:
    """The ids of the live tasks ``where`` matches, newest first (each status by its index).

    Raises:
        InvalidPayload: more than :data:`MAX_BULK` match.
    """
    statuses = [s for s in _LIVE if where.status is None or where.status is s]
    found: list[str] = []
    for status in statuses:
        narrowed = dataclasses.replace(where, status=status)
        cursor: str | None = None
        while True:
            page = await store.browse(narrowed, limit=MAX_PAGE, cursor=cursor)
            found += [t.task_id for t in page.tasks]
            if len(found) > MAX_BULK:
                raise InvalidPayload(
                    f"more than {MAX_BULK} live tasks match; narrow the filter first"
                )
            cursor = page.next_cursor
            if cursor is None:
                break
    return found


async def cancel_all(actions: Actions, task_ids: list[str]) -> tuple[int, int]:
    """Cancel each task; how many were cancelled, and how many had finished meanwhile."""
    cancelled = finished = 0
    for task_id in task_ids:
        try:
            await actions.cancel(task_id, BULK_REASON)
        except (TaskAlreadyTerminal, TaskNotFound):
            finished += 1
        else:
            cancelled += 1
    return cancelled, finished
