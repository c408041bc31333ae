"""A worker's handler slots: at most ``size`` handlers run at once, the rest wait in turn.

A worker may claim a few tasks more than it has free slots (``prefetch``): while the
outcomes of the tasks that just ended travel to the store with the next claim, the
handlers of the tasks claimed ahead run, instead of the worker waiting for the database
with nothing to do. Those attempts wait here for a slot, first come first served.

A plain count and a queue of futures, not an :class:`asyncio.Semaphore`: the common case
(a slot is free) takes it without a coroutine or an await, and a waiter cancelled just as
a slot was handed to it passes the slot on (it must not be lost).
"""

from __future__ import annotations

import asyncio
from collections import deque

__all__ = ["Slots"]


class Slots:
    """``size`` handler slots, handed out in the order asked for."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.taken = 0
        self._waiting: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        """Attempts waiting for a slot (cancelled ones may still be counted)."""
        return len(self._waiting)

    def try_take(self) -> bool:
        """Take a slot if one is free and nobody waits for it before us."""
        if self.taken < self.size and not self._waiting:
            self.taken += 1
            return True
        return False

    async def take(self) -> None:
        """Wait for a slot (after :meth:`try_take` said no). Cancellable: a waiter
        cancelled after a slot was handed to it gives the slot to the next."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled():
                self.free()  # it was ours already: pass it on
            else:
                future.cancel()  # skipped by free()
            raise

    def free(self) -> None:
        """Give a slot back: to the first waiter still waiting, else to the pool."""
        while self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_result(None)  # the slot passes on, still taken
                return
        self.taken -= 1
