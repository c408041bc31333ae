"""Helpers for the runtime tests: run workers in-process, wait for store states, gates.

Waiting is always bounded: :func:`eventually` polls with a tiny pause under a deadline,
and :func:`running` stops its workers (and checks that they stopped) when the block ends.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, TypeVar

import anyio

from keel.model import Event, Status, Task
from keel.runtime import Keel, Worker
from keel.store import Store

T = TypeVar("T")

WAIT = 10.0  # seconds any wait may take before the test fails (typically milliseconds)
POLL = 0.002  # seconds between two looks at the store inside a bounded wait
FAST: dict[str, float] = {
    "claim_interval": 0.01,
    "watch_interval": 0.01,
    "recover_interval": 0.01,
    "purge_interval": 0.05,
}
"""Worker loop intervals small enough that tests never wait on them."""

SERVICE = {
    "type": "object",
    "required": ["service"],
    "properties": {"service": {"type": "string"}},
}
APPROVAL = {
    "type": "object",
    "required": ["approved"],
    "properties": {"approved": {"type": "boolean"}},
}


def worker(app: Keel, *, concurrency: int = 4, worker_id: str | None = None, **kw: Any) -> Worker:
    """A worker with fast loops (overridable), named ``worker_id``."""
    return Worker(app, concurrency=concurrency, worker_id=worker_id, **{**FAST, **kw})


@asynccontextmanager
async def running(*workers: Worker) -> AsyncIterator[None]:
    """Run ``workers`` for the duration of the block, then stop them (bounded).

    A worker that crashes fails the test with its error; one that does not return within
    :data:`WAIT` seconds of being told to stop fails it too.
    """
    stop = anyio.Event()
    done = [anyio.Event() for _ in workers]

    async def run(w: Worker, finished: anyio.Event) -> None:
        try:
            await w.run(stop=stop)
        finally:
            finished.set()

    async with anyio.create_task_group() as tg:
        for w, finished in zip(workers, done, strict=True):
            tg.start_soon(partial(run, w, finished))
        with anyio.fail_after(WAIT):
            for w in workers:
                await w.started.wait()
        try:
            yield
        finally:
            stop.set()
            with anyio.fail_after(WAIT):
                for finished in done:
                    await finished.wait()


async def eventually(
    check: Callable[[], Awaitable[T | None] | T | None], what: str, within: float = WAIT
) -> T:
    """Poll ``check`` until it returns something truthy, and return that (at most
    ``within`` seconds)."""
    with anyio.move_on_after(within):
        while True:
            got = check()
            if isinstance(got, Awaitable):
                got = await got
            if got:
                return got
            await anyio.sleep(POLL)
    raise AssertionError(f"timed out after {within}s waiting for {what}")


async def reaches(
    store: Store, task_id: str, *statuses: Status, leased: bool | None = None
) -> Task:
    """Wait until the task has one of ``statuses`` (and, if given, holds a lease or not)."""

    async def check() -> Task | None:
        task = await store.get(task_id)
        if task.status in statuses and (leased is None or task.leased == leased):
            return task
        return None

    wanted = "/".join(s.value for s in statuses)
    return await eventually(check, f"task {task_id} to be {wanted} (leased={leased})")


async def settles(store: Store, task_id: str) -> Task:
    """Wait until the task is terminal."""
    return await reaches(store, task_id, Status.COMPLETED, Status.FAILED, Status.CANCELLED)


async def parks(store: Store, task_id: str) -> Task:
    """Wait until the task waits for input (which holds no lease)."""
    return await reaches(store, task_id, Status.INPUT_REQUIRED, leased=False)


async def claimed_by(store: Store, task_id: str, worker_id: str, fence: int | None = None) -> Task:
    """Wait until ``worker_id`` holds the task (with the given fence, if any)."""

    async def check() -> Task | None:
        task = await store.get(task_id)
        if task.lease_owner == worker_id and (fence is None or task.fence == fence):
            return task
        return None

    return await eventually(check, f"{worker_id} to hold task {task_id} (fence {fence})")


async def scheduled(store: Store, task_id: str, attempt: int) -> Task:
    """Wait until the task waits, unleased and working, for attempt number ``attempt``."""

    async def check() -> Task | None:
        task = await store.get(task_id)
        ok = task.status is Status.WORKING and task.attempt == attempt and not task.leased
        return task if ok else None

    return await eventually(check, f"task {task_id} to wait for attempt {attempt}")


def terminal_events(history: list[Event] | tuple[Event, ...]) -> list[Event]:
    """The history entries that ended the task (there must be exactly one, the last)."""
    return [e for e in history if e.to_status.terminal]


class HoldNext:
    """A delegating store that holds back the answer of the next call of ``method``
    that has a non-empty answer (the call already happened in the store): how a test
    keeps a worker's read or claim in flight while something else happens."""

    def __init__(self, inner: Store, method: str) -> None:
        self._inner = inner
        self._method = method
        self.armed = False
        self.caught = anyio.Event()
        self.let_go = anyio.Event()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if name != self._method:
            return attribute

        async def held(*args: Any, **kwargs: Any) -> Any:
            answer = await attribute(*args, **kwargs)
            if self.armed and answer:
                self.armed = False
                self.caught.set()
                await self.let_go.wait()
            return answer

        return held


class Gates:
    """Named one-shot events that handlers wait on and tests open (created on first use)."""

    def __init__(self) -> None:
        self._events: dict[str, anyio.Event] = {}

    def __getitem__(self, name: str) -> anyio.Event:
        if name not in self._events:
            self._events[name] = anyio.Event()
        return self._events[name]

    def open(self, name: str) -> None:
        self[name].set()

    async def wait(self, name: str) -> None:
        """Wait for ``name`` to open (bounded: a handler never hangs a test)."""
        with anyio.fail_after(WAIT):
            await self[name].wait()


async def outcome_through_outage(
    store: Store,
    *,
    lease: float,
    result: str,
    break_store: Callable[[], Awaitable[None]],
    mend_store: Callable[[], Awaitable[None]],
    within: float = 30.0,
) -> tuple[Task, list[Event]]:
    """One task of one attempt whose handler returns ``result`` just after
    ``break_store()`` made the store unavailable; the store stays so until the worker
    failed to write the outcome and the lease ran out, then ``mend_store()``. The task
    once it finished, and its history."""
    app = Keel(store)
    started, release = anyio.Event(), anyio.Event()

    @app.task("hold", max_attempts=1, lease_seconds=lease)
    async def hold(ctx: Any) -> str:
        started.set()
        await release.wait()
        return result

    runner = Worker(app, concurrency=1, recover_interval=0.05)
    async with running(runner):
        task = await app.submit("hold", {})
        with anyio.fail_after(within):
            await started.wait()
        await break_store()
        broken_at = time.monotonic()
        release.set()  # the handler returns; its outcome cannot be written
        await eventually(
            lambda: runner._outage_seen >= broken_at, "a refused outcome write", within
        )
        # The scenario: the store stays unavailable past the lease (not a wait for a result).
        await anyio.sleep(max(0.0, broken_at + lease + 0.3 - time.monotonic()))
        await mend_store()
        done = await eventually(
            lambda: _terminal(store, task.task_id), f"task {task.task_id} to end", within
        )
    return done, list(await store.history(task.task_id))


async def _terminal(store: Store, task_id: str) -> Task | None:
    task = await store.get(task_id)
    return task if task.status.terminal else None
