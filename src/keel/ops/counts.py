"""Tasks per status for the console's list, without a full count on every page.

``store.counts()`` reads one index entry per task: a few milliseconds on a small store,
most of a second on a million tasks, while the page itself is one index range scan.
The console therefore shows the last counts it made and makes new ones in the
background once they are older than :data:`FRESH` seconds or ten times what the last
count took, whichever is longer (stale-while-revalidate), so no page waits for a count
but the first one, and a big store is counted a few times a minute at most while pages
are open. The list says how old the counts are.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping

from keel.errors import KeelError
from keel.model import Status
from keel.store import Store

__all__ = ["FRESH", "CachedCounts"]

FRESH = 2.0  # seconds counts are shown before a recount starts
log = logging.getLogger("keel.ops")


class CachedCounts:
    """The store's tasks per status, recounted in the background when stale."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.monotonic) -> None:
        self._store, self._clock = store, clock
        self._value: Mapping[Status, int] | None = None
        self._at = 0.0
        self._took = 0.0
        self._recount: asyncio.Task[None] | None = None

    async def get(self) -> tuple[Mapping[Status, int], float]:
        """The counts and their age in seconds (the first call counts and waits).

        Raises:
            KeelError: the first count failed (later failures keep the last counts).
        """
        if self._value is None:
            await self._count()
        elif self._clock() - self._at > max(FRESH, 10 * self._took) and self._recount is None:
            self._recount = asyncio.get_running_loop().create_task(self._again())
        assert self._value is not None
        return self._value, self._clock() - self._at

    async def _count(self) -> None:
        began = self._clock()
        value = await self._store.counts()
        self._value, self._at, self._took = value, self._clock(), self._clock() - began

    async def _again(self) -> None:
        try:
            with contextlib.suppress(KeelError):  # keep the last counts; the next page retries
                await self._count()
        finally:
            self._recount = None
