"""Liveness and readiness of a Keel process.

* **live** (``/healthz``): the process answers. Nothing else is checked: a process whose
  store is down is alive, and restarting it would not bring the store back.
* **ready** (``/readyz``): the store answered a real read of its schema version at most
  :data:`STALE_AFTER` seconds ago (:class:`Health` reads it every :data:`READ_EVERY`
  seconds, in the background, so a probe never waits for a store that hangs), and, if
  this process runs workers, every one of them is running and none is stopping.

Workers announce themselves with :func:`worker_started` / :func:`worker_stopped` (the
runtime does, for every :class:`~keel.runtime.Worker`); a process that expects workers
(``keel worker``, ``keel serve`` without ``--no-worker``) is not ready before one runs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

import anyio

from keel.store.base import TxStore

__all__ = [
    "READ_EVERY",
    "STALE_AFTER",
    "Health",
    "Readiness",
    "running_workers",
    "worker_started",
    "worker_stopped",
]

log = logging.getLogger("keel.telemetry")

READ_EVERY = 0.25  # seconds between reads of the store's schema version
STALE_AFTER = 1.0  # seconds after the last good read that the process is no longer ready


class WorkerLike(Protocol):
    @property
    def stopping(self) -> bool: ...
    @property
    def running(self) -> list[str]: ...


_WORKERS: dict[int, Any] = {}


def worker_started(worker: WorkerLike) -> None:
    """``worker`` runs in this process (its loops have started)."""
    _WORKERS[id(worker)] = worker


def worker_stopped(worker: WorkerLike) -> None:
    """``worker`` no longer runs."""
    _WORKERS.pop(id(worker), None)


def running_workers() -> list[WorkerLike]:
    """The workers that run in this process now."""
    return list(_WORKERS.values())


@dataclass(frozen=True, slots=True)
class Readiness:
    """What ``/readyz`` answers."""

    ready: bool
    store: str
    """``ok``, or why the store is not ready."""
    schema_version: int | None
    workers: int
    """Workers running in this process."""
    problems: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "store": self.store,
            "schema_version": self.schema_version,
            "workers": self.workers,
            "problems": list(self.problems),
        }


class Health:
    """Reads the store in the background; answers readiness from the last read.

    Args:
        store: the store to read.
        expect_workers: this process runs workers: not ready while none runs.
    """

    def __init__(
        self,
        store: TxStore,
        *,
        expect_workers: bool = False,
        read_every: float = READ_EVERY,
        stale_after: float = STALE_AFTER,
    ) -> None:
        self.store = store
        self.expect_workers = expect_workers
        self.read_every = read_every
        self.stale_after = stale_after
        self.schema_version: int | None = None
        self._last_ok = -float("inf")  # time.monotonic() of the last good read
        self._trouble: str | None = "the store has not been read yet"

    async def check_once(self) -> None:
        """Read the store's schema version now and note how that went."""
        try:
            self.schema_version = await self.store.read_schema_version()
        except Exception as exc:
            if self._trouble is None:
                log.warning("store not ready: %s", exc)
            self._trouble = str(exc) or type(exc).__name__
        else:
            if self._trouble is not None and self._last_ok > -float("inf"):
                log.warning("store ready again")
            self._trouble = None
            self._last_ok = time.monotonic()

    async def run(self) -> None:
        """Read the store every ``read_every`` seconds, until cancelled."""
        while True:
            await self.check_once()
            await anyio.sleep(self.read_every)

    def store_up(self) -> bool:
        return time.monotonic() - self._last_ok <= self.stale_after

    def readiness(self) -> Readiness:
        problems = []
        store = "ok"
        if not self.store_up():
            age = time.monotonic() - self._last_ok
            store = self._trouble or f"no answer from the store for {age:.1f} s"
            problems.append(f"store: {store}")
        workers = running_workers()
        if self.expect_workers and not workers:
            problems.append("workers: none running")
        stopping = [w for w in workers if w.stopping]
        if stopping:
            problems.append(f"workers: {len(stopping)} stopping")
        return Readiness(
            not problems, store, self.schema_version, len(workers) - len(stopping), tuple(problems)
        )
