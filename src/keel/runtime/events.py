"""An app's wake-ups in this process: tasks submitted, answered or cancelled through it.

Each :class:`~keel.runtime.Keel` owns one :class:`EventHub` (``app.events``); its workers
listen there, so a task submitted or answered through the app is claimed at once and a
cancel stops its attempt at once. Other processes learn by polling (or, on PostgreSQL,
LISTEN/NOTIFY): the hub is a hint, never the only way work is found.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["EventHub"]


@dataclass(frozen=True, slots=True, eq=False)
class _Listener:
    """A worker's callbacks, run on the worker's own event loop whichever thread calls."""

    cancel: Callable[[str], None]
    ready: Callable[[], None]
    loop: asyncio.AbstractEventLoop | None

    def call(self, fn: Callable[..., None], *args: Any) -> None:
        if self.loop is None or _running_loop() is self.loop:
            fn(*args)
        else:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody to tell
                self.loop.call_soon_threadsafe(fn, *args)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # no asyncio loop here (a plain thread, or trio)
        return None


class EventHub:
    """The workers listening to one app in this process, and what they are told."""

    def __init__(self) -> None:
        self._listeners: list[_Listener] = []

    def listen(
        self, on_cancel: Callable[[str], None], on_ready: Callable[[], None] = lambda: None
    ) -> Callable[[], None]:
        """Call ``on_cancel(task_id)`` and ``on_ready()`` on the caller's event loop when
        the app cancels a task or makes one ready; returns the function that stops it."""
        listener = _Listener(on_cancel, on_ready, _running_loop())
        self._listeners.append(listener)

        def stop() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return stop

    def ready(self) -> None:
        """A task may be ready to claim (submitted, or given all its input)."""
        for listener in list(self._listeners):
            listener.call(listener.ready)

    def cancelled(self, task_id: str) -> None:
        """``task_id`` was cancelled: an attempt running it stops."""
        for listener in list(self._listeners):
            listener.call(listener.cancel, task_id)
