"""The change feed: await "task X changed", committed by any process.

A store that offers it (every adapter does) has ``changes(after=None)``, an async
iterator of :class:`Change` items. Its contract:

* the **first** item comes at once. Its ``task_ids`` is None ("anything may have
  changed: read what you care about now") unless ``after`` is a position this feed can
  still replay, in which case it names the tasks changed since then (possibly none). So
  a listener that (re)connects always reads the current state first, and one that
  subscribes *before* it reads can miss nothing;
* every later item names tasks changed by a **committed** write (nothing that rolled
  back), with a position that only grows. Changes are coalesced: a listener that reads
  slowly gets one item naming every task changed meanwhile, never a growing queue;
  when too many piled up, or the source lost contact (a broken LISTEN connection, a
  change log that was pruned past this listener), it gets ``task_ids=None`` again;
* an item says only *which* tasks changed: read them (``store.get``) for *how*. Reads
  after the item see at least the change it names.

Sources: ``memory://`` publishes in-process after each transaction; SQLite reads a
change log that triggers fill inside every writing transaction, woken by
``PRAGMA data_version`` (:mod:`keel.store.sqlite.changes`); PostgreSQL sends the changed
ids by NOTIFY after COMMIT (:mod:`keel.store.postgres.notify`). One :class:`ChangeHub`
per store fans a source out to its listeners.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = ["Change", "ChangeFeed", "ChangeHub"]

REPLAY = 4096
"""Recent changes each hub remembers, so that ``after=`` can resume without a re-read."""

MAX_PENDING = 10_000
"""Distinct task ids a slow listener may have pending before it is told to re-read all."""


@dataclass(frozen=True)
class Change:
    """Tasks changed up to ``position``; ``task_ids`` None: re-read everything."""

    position: int
    task_ids: frozenset[str] | None


@runtime_checkable
class ChangeFeed(Protocol):
    """A store capability: the feed of committed task changes (see the module doc)."""

    def changes(self, *, after: int | None = None) -> AsyncIterator[Change]:
        """Changes from now on; the first item at once (see :mod:`keel.store.changes`)."""
        ...


@dataclass(eq=False)
class _Listener:
    loop: asyncio.AbstractEventLoop
    wake: asyncio.Event
    pending: set[str] | None = field(default_factory=set)
    """Ids changed since the last item; None: re-read everything."""
    position: int = 0
    due: bool = False

    def poke(self) -> None:
        # RuntimeError: the loop closed meanwhile, and there is nobody left to wake.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.wake.set)


class ChangeHub:
    """Fans one store's changes out to its listeners, on their own event loops.

    ``publish`` is thread-safe and cheap (a lock and one ``call_soon_threadsafe`` per
    listener that was idle). ``start`` runs once, when the first listener arrives (an
    adapter starts its source there); it may return the source's current position.
    """

    def __init__(self, start: Callable[[], int | None] | None = None) -> None:
        self._lock = threading.Lock()
        self._listeners: list[_Listener] = []
        self._recent: deque[tuple[int, str]] = deque(maxlen=REPLAY)
        self._position = 0
        self._start = start
        self._started = False

    @property
    def listeners(self) -> int:
        """How many listeners are open (what a metrics gauge reads)."""
        return len(self._listeners)

    @property
    def position(self) -> int:
        return self._position

    def publish(self, task_ids: Collection[str], position: int | None = None) -> None:
        """Tasks ``task_ids`` changed (committed); ``position`` from the source, if it has
        its own (SQLite's change log), else the next local one."""
        if not task_ids:
            return
        with self._lock:
            self._position = max(self._position + 1, position or 0)
            for task_id in task_ids:
                self._recent.append((self._position, task_id))
            listeners = list(self._listeners)
            for s in listeners:
                if s.pending is not None:
                    s.pending.update(task_ids)
                    if len(s.pending) > MAX_PENDING:
                        s.pending = None
                s.position = self._position
                was_due, s.due = s.due, True
                if not was_due:
                    s.poke()

    def resync(self) -> None:
        """The source may have missed changes: every listener re-reads everything."""
        with self._lock:
            self._position += 1
            self._recent.clear()
            for s in self._listeners:
                s.pending, s.position, s.due = None, self._position, True
                s.poke()

    def _replay(self, after: int | None) -> set[str] | None:
        """Ids changed since ``after``, if the hub still remembers all of them."""
        if after is None or after > self._position:
            return None
        if after == self._position:
            return set()
        if not self._recent or self._recent[0][0] > after + 1:
            return None
        return {task_id for position, task_id in self._recent if position > after}

    async def changes(self, *, after: int | None = None) -> AsyncIterator[Change]:
        """See :mod:`keel.store.changes`."""
        listener = _Listener(asyncio.get_running_loop(), asyncio.Event())
        listener.wake.set()  # the first item comes at once
        with self._lock:
            if not self._started and self._start is not None:
                self._started = True
                self._position = max(self._position, self._start() or 0)
            listener.pending = self._replay(after)
            listener.position, listener.due = self._position, True
            self._listeners.append(listener)
        try:
            while True:
                await listener.wake.wait()
                listener.wake.clear()
                with self._lock:
                    if not listener.due:
                        continue
                    ids, listener.pending = listener.pending, set()
                    listener.due = False
                    position = listener.position
                yield Change(position, None if ids is None else frozenset(ids))
        finally:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)
