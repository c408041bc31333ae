"""Browsing a store as an operator does: tasks newest first, filtered, a page at a time.

:meth:`keel.store.Store.browse` takes a :class:`TaskFilter` and an opaque cursor and
returns a :class:`TaskPage`. The order is ``(created_at, task_id)`` descending, and a
cursor is the position of the last task of the previous page (its ``created_at`` and
id), so paging is a keyset walk: each page is one index range scan however deep it is,
a task created meanwhile never hides a later page, and a cursor stays valid when its
task is purged. Every SQL adapter keeps one index per filter column on
``(column, created_at, task_id)`` (migrations ``0003_browse`` for SQLite, ``0002_browse``
for PostgreSQL). The free-text filter is a substring scan along that order.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from keel.errors import InvalidPayload
from keel.model import Status, Task
from keel.model.validation import storable

__all__ = [
    "MAX_PAGE",
    "Position",
    "TaskFilter",
    "TaskPage",
    "check_limit",
    "decode_cursor",
    "page_of",
    "sql_where",
]

MAX_PAGE = 500
"""The largest page :meth:`~keel.store.Store.browse` returns."""


@dataclass(frozen=True, slots=True)
class TaskFilter:
    """Which tasks to list; every field left ``None`` matches everything.

    Times are seconds since the epoch: ``created_from <= created_at < created_to``, the
    same for ``updated_*``. ``text`` matches a substring of the task id or of its status
    message (case-sensitive).
    """

    status: Status | None = None
    name: str | None = None
    owner: str | None = None
    """The principal the task belongs to (``""``: tasks of no principal)."""
    created_from: float | None = None
    created_to: float | None = None
    updated_from: float | None = None
    updated_to: float | None = None
    text: str | None = None

    def checked(self) -> TaskFilter:
        """This filter with its status as a :class:`Status`.

        Raises:
            InvalidPayload: a field of the wrong type, a time that is not finite, or text
                no store can hold, naming the field.
        """
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or f.name == "status":
                continue
            if f.name in _TEXT:
                if not isinstance(value, str) or not storable(value):
                    raise InvalidPayload(f"filter {f.name} must be a string, not {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidPayload(f"filter {f.name} must be a number, not {value!r}")
            elif not math.isfinite(value):
                raise InvalidPayload(f"filter {f.name} must be a finite time, not {value!r}")
        try:
            status = None if self.status is None else Status(self.status)
        except ValueError:
            raise InvalidPayload(f"filter status {self.status!r} is not a status") from None
        return _replace(self, status=status)

    def matches(self, row: Mapping[str, Any]) -> bool:
        """Whether a stored row (``tasks`` columns) passes (the memory adapter's scan)."""
        for column, value in self._equal().items():
            if row[column] != value:
                return False
        for column, op, bound in self._ranges():
            if not (row[column] >= bound if op == ">=" else row[column] < bound):
                return False
        if self.text is not None:
            return self.text in row["task_id"] or self.text in (row["status_message"] or "")
        return True

    def _equal(self) -> dict[str, str]:
        equal = {"name": self.name, "owner": self.owner}
        if self.status is not None:
            equal["status"] = Status(self.status).value
        return {k: v for k, v in equal.items() if v is not None}

    def _ranges(self) -> list[tuple[str, str, float]]:
        ranges = [
            ("created_at", ">=", self.created_from),
            ("created_at", "<", self.created_to),
            ("updated_at", ">=", self.updated_from),
            ("updated_at", "<", self.updated_to),
        ]
        return [(c, op, float(v)) for c, op, v in ranges if v is not None]


_TEXT = frozenset({"name", "owner", "text"})


def _replace(where: TaskFilter, **changes: Any) -> TaskFilter:
    values = {f.name: getattr(where, f.name) for f in fields(where)}
    return TaskFilter(**{**values, **changes})


@dataclass(frozen=True, slots=True)
class Position:
    """A position in the newest-first order: tasks after it are older."""

    created_at: float
    task_id: str

    def before(self, row: Mapping[str, Any]) -> bool:
        """Whether the row comes after this mark (is older)."""
        return (row["created_at"], row["task_id"]) < (self.created_at, self.task_id)

    def encode(self) -> str:
        text = json.dumps([self.created_at, self.task_id], separators=(",", ":"))
        return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> Position | None:
    """The position a cursor of :class:`TaskPage` names.

    Raises:
        InvalidPayload: not a cursor a page gave.
    """
    if cursor is None:
        return None
    problem = InvalidPayload(f"cursor {cursor!r} is not one a page of tasks gave")
    if not isinstance(cursor, str) or not cursor.isascii():
        raise problem
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, task_id = json.loads(raw)
    except (binascii.Error, ValueError, TypeError):
        raise problem from None
    if (
        isinstance(created_at, bool)
        or not isinstance(created_at, int | float)
        or not math.isfinite(created_at)
        or not isinstance(task_id, str)
        or not storable(task_id)
    ):
        raise problem
    return Position(float(created_at), task_id)


@dataclass(frozen=True, slots=True)
class TaskPage:
    """One page of :meth:`~keel.store.Store.browse`, newest first."""

    tasks: tuple[Task, ...]
    next_cursor: str | None
    """Pass it back for the next (older) page; ``None``: this was the last."""


def page_of(found: Sequence[Task], limit: int) -> TaskPage:
    """A page of ``limit`` tasks from ``limit + 1`` found (one more says there is more)."""
    tasks = tuple(found[:limit])
    if len(found) <= limit or not tasks:
        return TaskPage(tasks, None)
    return TaskPage(tasks, Position(tasks[-1].created_at, tasks[-1].task_id).encode())


def check_limit(limit: object) -> int:
    """A page size, 1 to :data:`MAX_PAGE`.

    Raises:
        InvalidPayload: not an integer in that range.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidPayload(f"page limit must be an integer from 1 to {MAX_PAGE}, not {limit!r}")
    return limit


def sql_where(
    where: TaskFilter,
    mark: Position | None,
    param: Callable[[str], str],
    *,
    id_column: str = "task_id",
    find: str = "instr",
) -> tuple[str, dict[str, Any]]:
    """The WHERE condition of a browse (``TRUE`` for none) and its parameters.

    ``param(name)`` spells a named parameter in the driver's style; ``id_column`` is how
    the adapter spells ``task_id`` in the order its index keeps (PostgreSQL: byte order);
    ``find`` its ``(haystack, needle) -> position`` function.
    """
    conditions: list[str] = []
    params: dict[str, Any] = {}
    for column, value in where._equal().items():
        conditions.append(f"{column} = {param(column)}")
        params[column] = value
    for i, (column, op, bound) in enumerate(where._ranges()):
        conditions.append(f"{column} {op} {param(f'range{i}')}")
        params[f"range{i}"] = bound
    if where.text is not None:
        conditions.append(
            f"({find}(task_id, {param('text')}) > 0"
            f" OR {find}(coalesce(status_message, ''), {param('text')}) > 0)"
        )
        params["text"] = where.text
    if mark is not None:
        conditions.append(
            f"(created_at, {id_column}) < ({param('mark_created')}, {param('mark_id')})"
        )
        params.update(mark_created=mark.created_at, mark_id=mark.task_id)
    return " AND ".join(conditions) or "TRUE", params
