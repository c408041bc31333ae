"""``keel tasks list``'s choices: which tasks (``--since``, ``--name``, ``--principal``,
``--status``) and how many, newest first, continued with ``--cursor``
(:meth:`keel.store.Store.browse`)."""

from __future__ import annotations

import math
import re
import time
from datetime import UTC, datetime

import click

from keel.model import Status, Task
from keel.store import Store
from keel.store.browse import MAX_PAGE, TaskFilter

__all__ = ["SinceParam", "newest"]

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


class SinceParam(click.ParamType[float]):
    """``--since``: a duration back from now (``90s``, ``15m``, ``2h``, ``7d``, ``1w``), an
    ISO date-time (UTC unless it says otherwise), or epoch seconds; as epoch seconds."""

    name = "since"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        text = str(value).strip()
        matched = _DURATION.match(text)
        if matched:
            return time.time() - float(matched[1]) * _SECONDS[matched[2]]
        try:
            seconds = float(text)
        except ValueError:
            try:
                parsed = datetime.fromisoformat(text.removesuffix("Z"))
            except ValueError:
                self.fail(
                    f"{text!r} is not a duration (15m, 2h, 7d), a date-time "
                    "(2026-12-03T12:00) or epoch seconds",
                    param,
                    ctx,
                )
            return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()
        if not math.isfinite(seconds):
            self.fail(f"{text!r} is not a finite time", param, ctx)
        return seconds


async def newest(
    store: Store,
    *,
    status: Status | None,
    name: str | None,
    principal: str | None,
    since: float | None,
    limit: int,
    cursor: str | None,
) -> tuple[list[Task], str | None]:
    """Up to ``limit`` matching tasks newest first, and the cursor of the rest (None: no
    more), fetched a page of at most :data:`MAX_PAGE` at a time."""
    where = TaskFilter(status=status, name=name, owner=principal, created_from=since)
    found: list[Task] = []
    while len(found) < limit:
        page = await store.browse(where, limit=min(MAX_PAGE, limit - len(found)), cursor=cursor)
        found += page.tasks
        cursor = page.next_cursor
        if cursor is None:
            break
    return found, cursor
