"""Wake-ups across processes: PostgreSQL LISTEN/NOTIFY.

A write that makes tasks ready to run (a new task, input that completes a request, a
release, a recovered lease) or cancels a running one is followed, *after* its transaction
commits and outside it, by one coalesced ``pg_notify`` per channel: the names of the
tasks that became ready, the ids of the tasks that were cancelled. A worker that
subscribed is poked at once instead of at its next poll.

The same way, every write sends the ids of the tasks it changed on a third channel,
which feeds the store's change feed (:mod:`keel.store.changes`): NOTIFY is delivered
only after COMMIT, and the store sends it only after COMMIT returned, so a listener
never hears of a change that rolled back. A process LISTENs to that channel only once
its change feed is started (a worker alone never hears, nor decodes, every other
process's changes), and its feed's listeners are then told to re-read everything, as
they are when the LISTEN connection comes back after a break (they may have missed a
change meanwhile).

Wake-ups are an optimisation only. One that is lost (no listener connected at that
moment, a connection that broke, a payload too large) delays the work until the next
poll; nothing depends on it. After its connection comes back, a listener pokes every
subscriber, since it may have missed something meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from keel.store.changes import ChangeHub
from keel.store.postgres.faults import backoff

__all__ = ["Listener", "change_channel", "payloads"]

log = logging.getLogger("keel.store.postgres")

MAX_PAYLOAD = 7_900  # bytes; PostgreSQL refuses notification payloads of 8000 or more
POLL = 0.25  # seconds between checks of the stop flag while no notification arrives
RECONNECT_CAP = 1.0  # seconds at most between two attempts to reconnect the listener


def channels(tag: str) -> tuple[str, str]:
    """The (ready, cancel) channel names of one store."""
    return f"keel_ready_{tag}", f"keel_cancel_{tag}"


def change_channel(tag: str) -> str:
    """The channel on which one store's writes name the tasks they changed."""
    return f"keel_change_{tag}"


def payloads(values: Collection[str]) -> list[str]:
    """JSON lists of ``values``, each under the payload limit (``""`` means "anything")."""
    if not values:
        return []
    whole = json.dumps(sorted(values))
    # The common case, one payload (a group's ids): one encoding, not one per value. ASCII
    # (ensure_ascii), so its length is its size; a value too long for a payload of its
    # own (over MAX_PAYLOAD - 10 bytes) makes a longer list, which the loop handles.
    if len(whole) <= MAX_PAYLOAD - 10:
        return [whole]
    out: list[str] = []
    chunk: list[str] = []
    size = 2  # bytes of json.dumps(chunk): "[]", then each item and ", " between them
    for value in sorted(values):
        if len(value.encode()) > MAX_PAYLOAD - 10:
            return [""]
        item = len(json.dumps(value))  # ASCII (ensure_ascii): its length is its size
        if size + item + (2 if chunk else 0) > MAX_PAYLOAD:
            out.append(json.dumps(chunk))
            chunk, size = [], 2
        size += item + (2 if chunk else 0)
        chunk.append(value)
    if chunk:
        out.append(json.dumps(chunk))
    return out


def _decode(payload: str) -> set[str] | None:
    """The values of a payload; None for "anything" (or a payload we cannot read)."""
    if not payload:
        return None
    try:
        values = json.loads(payload)
    except ValueError:
        return None
    return {v for v in values if isinstance(v, str)} if isinstance(values, list) else None


@dataclass(eq=False)
class _Subscriber:
    loop: asyncio.AbstractEventLoop
    names: frozenset[str]
    on_ready: Callable[[], None]
    on_cancel: Callable[[str], None]

    def call(self, fn: Callable[..., None], *args: object) -> None:
        # RuntimeError: the loop closed meanwhile, and there is nobody left to wake.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(fn, *args)


class Listener:
    """One LISTEN connection per store, in a daemon thread, shared by its subscribers."""

    def __init__(self, conninfo: str, tag: str, *, retry_cap: float) -> None:
        self._conninfo = conninfo
        self._ready, self._cancel = channels(tag)
        self._change = change_channel(tag)
        self._hub: ChangeHub | None = None
        # At most a second between attempts: back within a second of the server.
        self._retry_cap = min(max(retry_cap, 0.1), RECONNECT_CAP)
        self._subscribers: list[_Subscriber] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.connected = threading.Event()
        """Set while the LISTEN connection is up (tests wait on it)."""

    def subscribe(
        self,
        names: Collection[str],
        on_ready: Callable[[], None],
        on_cancel: Callable[[str], None],
    ) -> Callable[[], None]:
        """Call ``on_ready()`` when tasks with one of ``names`` become ready and
        ``on_cancel(task_id)`` when a task is cancelled, on the calling event loop.

        Returns the function that ends the subscription.
        """
        subscriber = _Subscriber(asyncio.get_running_loop(), frozenset(names), on_ready, on_cancel)
        with self._lock:
            self._subscribers.append(subscriber)
            self._ensure_thread()

        def unsubscribe() -> None:
            with self._lock:
                if subscriber in self._subscribers:
                    self._subscribers.remove(subscriber)

        return unsubscribe

    def feed(self, hub: ChangeHub) -> None:
        """From now on, publish the change channel's task ids to ``hub``."""
        with self._lock:
            self._hub = hub
            self._ensure_thread()

    def _ensure_thread(self) -> None:
        """Start the LISTEN thread unless it runs (with the lock held)."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="keel-pg-listen", daemon=True)
            self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread and close its connection."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _dispatch(self, channel: str, payload: str) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        values = _decode(payload)
        if channel == self._change:
            if self._hub is None:
                pass
            elif values is None:
                self._hub.resync()
            else:
                self._hub.publish(values)
            return
        for s in subscribers:
            if channel == self._ready:
                if values is None or values & s.names:
                    s.call(s.on_ready)
            elif channel == self._cancel and values is not None:
                for task_id in values:
                    s.call(s.on_cancel, task_id)

    def _poke_all(self) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for s in subscribers:
            s.call(s.on_ready)

    def _listen_changes(self, conn: psycopg.Connection[Any]) -> bool:
        """LISTEN to the change channel once the store's change feed has a hub (a worker
        alone never hears every other process's changes); whether it does now."""
        if self._hub is None:
            return False
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._change)))
        self._hub.resync()  # changes committed before LISTEN took effect are not heard
        return True

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True) as conn:
                    for channel in (self._ready, self._cancel):
                        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                    self.connected.set()
                    if failures:
                        self._poke_all()  # something may have happened while we were away
                    failures = 0
                    changes = False  # LISTENing to the change channel (once a hub is fed)
                    while not self._stop.is_set():
                        changes = changes or self._listen_changes(conn)
                        for note in conn.notifies(timeout=POLL):
                            self._dispatch(note.channel, note.payload)
            except psycopg.Error as exc:
                self.connected.clear()
                failures += 1
                log.info("LISTEN connection lost (%s); polling covers for it meanwhile", exc)
                self._stop.wait(backoff(failures, 0.1, self._retry_cap))
        self.connected.clear()
