"""Observability of a Keel process: metrics, health, task-transition logs (and traces).

It imports nothing above the store, so every layer may use it. :class:`Telemetry` is a
process's bundle: attached to its store (:meth:`Telemetry.attach`) it counts and logs
every transition the store commits (:mod:`keel.store.observed`) and reads the store for
readiness; :mod:`keel.telemetry.routes` serves ``/healthz``, ``/readyz`` and
``/metrics`` from it (on ``keel serve``'s HTTP app, or ``keel worker --metrics-port``).
docs/observability.md describes what each says.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio

from keel.store.base import TxStore
from keel.store.observed import CommitObserver, Observers
from keel.telemetry.health import Health, Readiness, running_workers
from keel.telemetry.logs import TransitionLog, payloads_asked
from keel.telemetry.metrics import Metrics

__all__ = ["COUNTS_WAIT", "OFF_VAR", "Telemetry"]

log = logging.getLogger("keel.telemetry")

OFF_VAR = "KEEL_METRICS"
"""``KEEL_METRICS=off``: the store is not observed (no counters, histograms or transition
logs; /metrics keeps its gauges, /healthz and /readyz answer as ever): the baseline of
bench/runtime_bench.py's overhead comparison, and an escape hatch."""

COUNTS_WAIT = 1.0
"""Seconds a scrape waits for the store's task counts before it answers without them."""

Lifespan = Callable[[Any], AbstractAsyncContextManager[Any]]


class Telemetry:
    """One process's metrics, health and transition log.

    Args:
        expect_workers: this process runs workers (readiness waits for them).
    """

    def __init__(self, *, expect_workers: bool = False) -> None:
        self.metrics = Metrics()
        self.expect_workers = expect_workers
        self.observers: list[CommitObserver] = [
            self.metrics,
            TransitionLog(payloads=payloads_asked()),
        ]
        self.store: TxStore | None = None
        self.health: Health | None = None
        self.stream_counts: list[Callable[[], int]] = []
        """Readers of this process's open notification streams (the MCP layer adds its
        servers' :attr:`keel.mcp.push.TaskPush.streams`): ``keel_notification_streams``."""
        self._gauges()

    def _gauges(self) -> None:
        def gauge(name: str, doc: str, read: Callable[[], float]) -> None:
            self.metrics.gauge(name, doc, read)

        gauge("keel_store_up", "1 if the store answered a read within 1 s.", self._store_up)
        gauge(
            "keel_store_schema_version",
            "The store's schema version, as last read.",
            lambda: float((self.health and self.health.schema_version) or 0),
        )
        gauge("keel_workers_running", "Workers running in this process.",
              lambda: len(running_workers()))  # fmt: skip
        gauge("keel_attempts_running", "Attempts this process's workers run now.",
              lambda: sum(len(w.running) for w in running_workers()))  # fmt: skip
        gauge(
            "keel_change_feed_listeners",
            "Open listeners of the store's change feed (notification streams).",
            lambda: 0 if self.store is None else self.store.change_hub.listeners,
        )
        gauge(
            "keel_notification_streams",
            "Open notification streams (subscriptions/listen) this process serves.",
            lambda: sum(read() for read in self.stream_counts),
        )

    def _store_up(self) -> float:
        return float(self.health is not None and self.health.store_up())

    def attach(self, store: object) -> None:
        """Observe ``store`` (every adapter's store is a TxStore; another is only read)."""
        if not isinstance(store, TxStore):
            log.warning("store %r cannot be observed: no metrics or readiness", store)
            return
        self.store = store
        if os.environ.get(OFF_VAR, "").lower() != "off":
            store.observer = Observers(self.observers)
        self.health = Health(store, expect_workers=self.expect_workers)

    def readiness(self) -> Readiness:
        if self.health is None:
            return Readiness(False, "no store attached", None, 0, ("store: not attached",))
        return self.health.readiness()

    async def exposition(self) -> bytes:
        """The Prometheus text; ``keel_tasks{status}`` read from the store first (within
        :data:`COUNTS_WAIT`: a store that does not answer leaves the last counts)."""
        if self.store is not None:
            with anyio.move_on_after(COUNTS_WAIT):
                try:
                    self.metrics.set_counts(await self.store.counts())
                except Exception as exc:
                    log.debug("task counts not read: %s", exc)
        return self.metrics.exposition()

    async def run(self) -> None:
        """The background readiness reads, until cancelled."""
        if self.health is not None:
            await self.health.run()

    def lifespan(self, inner: Lifespan) -> Lifespan:
        """``inner`` (an MCP server's lifespan) with the readiness reads beside it."""

        @asynccontextmanager
        async def lifespan(server: Any) -> AsyncIterator[Any]:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.run)
                try:
                    async with inner(server) as state:
                        yield state
                finally:
                    tg.cancel_scope.cancel()

        return lifespan
