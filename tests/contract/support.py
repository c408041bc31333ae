"""Helpers shared by the tests: the fake clock, schemas, errors, "store unchanged" checks."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from keel.model import Event, InputRequest, JsonValue, Task
from keel.store import Store

E = TypeVar("E", bound=BaseException)

START = 1_700_000_000.0  # seconds since the epoch: an ordinary, recent instant


class FakeClock:
    """A clock that only moves when told to: ``clock()`` is seconds since the epoch."""

    def __init__(self, start: float = START) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        """Move the clock forward by ``seconds`` and return the new time."""
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        self.now += seconds
        return self.now


SERVICE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["service"],
    "properties": {"service": {"type": "string"}},
}
ERROR: dict[str, Any] = {"code": -32000, "message": "the upstream API refused the request"}
JOB = "job"
WORKER = "w1"
LEASE = 30.0  # seconds


def ask(message: str = "Which service is affected?", schema: dict[str, Any] | None = None):
    """An input request for a service name (or the given schema)."""
    return InputRequest(message, SERVICE_SCHEMA if schema is None else schema)


Everything = list[tuple[Task, tuple[Event, ...], dict[str, JsonValue]]]


async def everything(store: Store) -> Everything:
    """Every task with its full history and steps: what "store unchanged" compares."""
    tasks = await store.list(limit=100_000)
    return [
        (task, tuple(await store.history(task.task_id)), dict(await store.steps(task.task_id)))
        for task in tasks
    ]


async def refused(store: Store, error: type[E], write: Callable[[], Awaitable[object]]) -> E:
    """Run ``write``, expect exactly ``error``, and check that the store did not change."""
    before = await everything(store)
    with pytest.raises(error) as info:
        await write()
    assert type(info.value) is error, f"expected {error.__name__}, got {info.value!r}"
    assert await everything(store) == before
    return info.value


async def claimed(
    store: Store, *, name: str = JOB, max_attempts: int = 1, worker: str = WORKER, **create: Any
) -> Task:
    """Create a task with ``name`` and claim it: the claimed snapshot (it holds a lease)."""
    task = await store.create(name=name, max_attempts=max_attempts, **create)
    got = await store.claim([name], worker=worker, lease_seconds=LEASE)
    assert [t.task_id for t in got] == [task.task_id]
    return got[0]
