"""Contract, property-based: random operation sequences against each adapter and a pure model.

The model below is written from the rules in ARCHITECTURE.md ("The store contract"), not
from the adapters: per task it keeps the status, fence, lease, attempt, times and how
many history events there should be. After every step the adapter must agree with it, and
every refused write must be refused with the error type the model predicts.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from keel import (
    IdempotencyConflict,
    InputRejected,
    InvalidPayload,
    InvalidTransition,
    KeelError,
    LeaseLost,
    Status,
    TaskAlreadyTerminal,
)
from keel.model import InputRequest
from keel.store import MemoryStore, SqliteStore, Store

from .support import FakeClock

# slow: Hypothesis state machines, several seconds per adapter
pytestmark = pytest.mark.slow

W, IR = Status.WORKING, Status.INPUT_REQUIRED
C, F, X = Status.COMPLETED, Status.FAILED, Status.CANCELLED
JOB = "job"
WORKER = "w1"
LEASE = 30.0  # seconds

SCHEMAS = [
    {"type": "object", "required": ["service"], "properties": {"service": {"type": "string"}}},
    {"type": "object", "required": ["team"], "properties": {"team": {"type": "string"}}},
]
VALID = [{"service": "payments"}, {"team": "sre"}]
RESULTS = [{"summary": "a"}, {"summary": "b"}]
ERRORS = [{"code": -32000, "message": "boom"}, {"code": -32001, "message": "bang"}]
DEAD = object()
"""The model's stand-in for an error the store wrote itself (dead letter, reclaim)."""

KEYS = ["k1", "k2"]

indexes = st.integers(min_value=0, max_value=10_000)
fences = st.sampled_from(["none", "current", "stale"])
worker_fences = st.sampled_from(["current", "stale"])


@dataclass
class ModelTask:
    """What the rules say one task must look like."""

    task_id: str
    name: str | None
    status: Status
    max_attempts: int
    now: float
    schema: int | None
    requested: list[str] = field(default_factory=list)
    answered: set[str] = field(default_factory=set)
    fence: int = 0
    lease: str | None = None
    lease_expires_at: float | None = None
    attempt: int = 1
    result: Any = None
    error: Any = None
    closed_fence: int | None = None
    events: int = 1
    ready_at: float = 0.0
    updated_at: float = 0.0

    def __post_init__(self) -> None:
        self.ready_at = self.updated_at = self.now

    @property
    def pending(self) -> list[str]:
        return [k for k in self.requested if k not in self.answered]

    def touch(self, now: float, *, event: bool = True) -> None:
        self.updated_at = now
        self.events += int(event)

    def writer_error(self, fence: int | None) -> type[KeelError] | None:
        """Who may write: nobody to a finished task; unleased writers to unleased tasks;
        the holder of the current fence to a leased one."""
        if self.status.terminal:
            return TaskAlreadyTerminal
        if fence is None:
            return InvalidTransition if self.lease is not None else None
        if self.lease is None or fence != self.fence:
            return LeaseLost
        return None

    def drop_lease(self) -> None:
        self.lease = None
        self.lease_expires_at = None

    def end_attempt(self, now: float, fence: int | None, delay: float, error: Any = DEAD) -> None:
        """A failed attempt: the next one later, or a dead letter after the last."""
        self.drop_lease()
        if self.attempt >= self.max_attempts:
            self.status, self.error, self.closed_fence = F, ("dead letter", error), fence
        else:
            self.attempt += 1
            self.ready_at = now + delay
        self.touch(now)


class StoreMachine(RuleBasedStateMachine):
    """Drives one adapter and the model side by side."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = Path(tempfile.mkdtemp(prefix="keel-sm-"))
        self.clock = FakeClock()
        self.store = self.open_store()
        self.tasks: dict[str, ModelTask] = {}
        self.order: list[str] = []
        self.keys: dict[str, tuple[str, tuple[Any, ...]]] = {}
        self.seen_fence: dict[str, int] = {}
        self.seen_terminal: dict[str, Status] = {}
        self.new_keys = 0

    def open_store(self) -> Store:
        raise NotImplementedError

    def teardown(self) -> None:
        try:
            self.run(self.store.close())
        finally:
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    # --- plumbing ------------------------------------------------------------------------

    def run(self, coro: Awaitable[Any]) -> Any:
        return self.loop.run_until_complete(coro)

    def call(self, write: Callable[[], Awaitable[Any]], expected: type[KeelError] | None) -> Any:
        """Run a store call: it must succeed, or raise exactly the error the model predicts."""
        if expected is None:
            return self.run(write())
        with pytest.raises(KeelError) as info:
            self.run(write())
        assert type(info.value) is expected, f"expected {expected.__name__}, got {info.value!r}"
        return None

    def pick(self, index: int, held: bool = False) -> ModelTask:
        """A task by index; with ``held``, a leased one if there is any (workers' writes)."""
        pool = [i for i in self.order if self.tasks[i].lease is not None] if held else []
        pool = pool or self.order
        return self.tasks[pool[index % len(pool)]]

    def fence_for(self, task: ModelTask, choice: str) -> int | None:
        return {"none": None, "current": task.fence, "stale": task.fence - 1}[choice]

    @property
    def now(self) -> float:
        return self.clock.now

    def has_tasks(self) -> bool:
        return bool(self.order)

    # --- rules -----------------------------------------------------------------------------

    @initialize(asks=st.lists(st.booleans(), min_size=1, max_size=4), claim=st.booleans())
    def start(self, asks: list[bool], claim: bool) -> None:
        """Every run starts from an empty store, then creates a few tasks, maybe claiming one."""
        assert self.run(self.store.list()) == []
        for ask in asks:
            self.create(name=JOB, n=0, key=None, ask=ask, schema=0, max_attempts=2)
        if claim:
            self.claim(limit=1)

    @rule(
        name=st.sampled_from([JOB, JOB, None]),
        n=st.integers(0, 1),
        key=st.sampled_from([None, *KEYS]),  # few keys, so that repeats and conflicts happen
        ask=st.booleans(),
        schema=st.integers(0, 1),
        max_attempts=st.integers(1, 3),
    )
    def create(
        self, name: str | None, n: int, key: str | None, ask: bool, schema: int, max_attempts: int
    ) -> None:
        requests = {"input": InputRequest("?", SCHEMAS[schema])} if ask else None
        signature = (name, n, schema if ask else None)
        expected: type[KeelError] | None = None
        existing = None
        if key is not None and key in self.keys:
            existing, bound = self.keys[key]
            expected = None if bound == signature else IdempotencyConflict
        got = self.call(
            lambda: self.store.create(
                name=name,
                arguments={"n": n},
                idempotency_key=key,
                input_requests=requests,
                max_attempts=max_attempts,
            ),
            expected,
        )
        if got is None:
            return
        if existing is not None:
            assert got.task_id == existing, "a repeated key returns the bound task"
            return
        task = ModelTask(
            got.task_id, name, IR if ask else W, max_attempts, self.now, schema if ask else None
        )
        if ask:
            task.requested.append("input")
        self.tasks[got.task_id] = task
        self.order.append(got.task_id)
        if key is not None:
            self.keys[key] = (got.task_id, signature)

    @precondition(has_tasks)
    @rule(index=indexes, valid=st.booleans(), which=st.sampled_from(["all", "one", "unknown"]))
    def provide_input(self, index: int, valid: bool, which: str) -> None:
        task = self.pick(index)
        keys = {"all": task.pending, "one": task.pending[:1], "unknown": ["nope"]}[which]
        # "input" was asked with a real schema at creation; keys asked later accept anything.
        checked = [k for k in keys if k == "input" and task.schema is not None]
        answers: dict[str, Any] = {k: {"any": 1} for k in keys}
        for k in checked:
            answers[k] = VALID[task.schema] if valid else {}
        expected: type[KeelError] | None = None
        if task.status.terminal:
            expected = TaskAlreadyTerminal
        elif task.status is not IR:
            expected = InvalidTransition
        elif not valid and any(k in task.pending for k in checked):
            expected = InputRejected
        if self.call(lambda: self.store.provide_input(task.task_id, answers), expected) is None:
            return
        accepted = [k for k in keys if k in task.pending]
        if not accepted:
            return  # unknown or answered keys: nothing changes
        task.answered.update(accepted)
        if not task.pending:
            task.status, task.ready_at = W, self.now
        task.touch(self.now)

    @precondition(has_tasks)
    @rule(index=indexes, fence=fences, variant=st.integers(0, 1), held=st.booleans())
    def complete(self, index: int, held: bool, fence: str, variant: int) -> None:
        task = self.pick(index, held)
        f = self.fence_for(task, fence)
        repeat = task.status is C and task.closed_fence == f and task.result == RESULTS[variant]
        expected = None if repeat else task.writer_error(f)
        if expected is None and not repeat and task.status is IR:
            expected = InvalidTransition
        got = self.call(
            lambda: self.store.complete(task.task_id, RESULTS[variant], fence=f), expected
        )
        if got is None or repeat:
            return
        task.status, task.result, task.closed_fence = C, RESULTS[variant], f
        task.drop_lease()
        task.touch(self.now)

    @precondition(has_tasks)
    @rule(index=indexes, fence=fences, variant=st.integers(0, 1), held=st.booleans())
    def fail(self, index: int, held: bool, fence: str, variant: int) -> None:
        task = self.pick(index, held)
        f = self.fence_for(task, fence)
        repeat = task.status is F and task.closed_fence == f and task.error == ERRORS[variant]
        expected = None if repeat else task.writer_error(f)
        got = self.call(lambda: self.store.fail(task.task_id, ERRORS[variant], fence=f), expected)
        if got is None or repeat:
            return
        task.status, task.error, task.closed_fence = F, ERRORS[variant], f
        task.drop_lease()
        task.touch(self.now)

    @precondition(has_tasks)
    @rule(index=indexes)
    def cancel(self, index: int) -> None:
        task = self.pick(index)
        expected = TaskAlreadyTerminal if task.status in (C, F) else None
        got = self.call(lambda: self.store.cancel(task.task_id), expected)
        if got is None or task.status is X:
            return
        task.status, task.closed_fence = X, None
        task.drop_lease()
        task.touch(self.now)

    @precondition(has_tasks)
    @rule(limit=st.integers(1, 3))
    def claim(self, limit: int) -> None:
        ready = [
            t
            for t in (self.tasks[i] for i in self.order)
            if t.status is W and t.lease is None and t.ready_at <= self.now and t.name == JOB
        ]
        ready.sort(key=lambda t: t.ready_at)  # stable: equal ready_at keeps creation order
        expected = ready[:limit]
        got = self.call(
            lambda: self.store.claim([JOB], worker=WORKER, lease_seconds=LEASE, limit=limit), None
        )
        assert [t.task_id for t in got] == [t.task_id for t in expected]
        for task in expected:
            task.fence += 1
            task.lease, task.lease_expires_at = WORKER, self.now + LEASE
            task.touch(self.now)

    @precondition(has_tasks)
    @rule(index=indexes, fence=worker_fences, held=st.booleans())
    def renew(self, index: int, held: bool, fence: str) -> None:
        task = self.pick(index, held)
        f = self.fence_for(task, fence)
        assert f is not None
        expected = task.writer_error(f)
        if self.call(
            lambda: self.store.renew(task.task_id, fence=f, lease_seconds=LEASE), expected
        ):
            task.lease_expires_at = self.now + LEASE
            task.touch(self.now, event=False)

    @precondition(has_tasks)
    @rule(index=indexes, fence=worker_fences, delay=st.sampled_from([0.0, 5.0]), held=st.booleans())
    def retry(self, index: int, held: bool, fence: str, delay: float) -> None:
        task = self.pick(index, held)
        f = self.fence_for(task, fence)
        assert f is not None
        # The retry that dead-lettered the task, repeated exactly, returns it unchanged.
        repeat = (
            task.status is F and task.closed_fence == f and task.error == ("dead letter", ERRORS[0])
        )
        expected = None if repeat else task.writer_error(f)
        got = self.call(
            lambda: self.store.retry(task.task_id, ERRORS[0], fence=f, delay_seconds=delay),
            expected,
        )
        if got is not None and not repeat:
            task.end_attempt(self.now, f, delay, ERRORS[0])

    @precondition(has_tasks)
    @rule(index=indexes, fence=fences, reuse=st.booleans(), held=st.booleans())
    def request_input(self, index: int, held: bool, fence: str, reuse: bool) -> None:
        task = self.pick(index, held)
        f = self.fence_for(task, fence)
        if reuse and task.requested:
            key = task.requested[0]
        else:
            self.new_keys += 1
            key = f"r{self.new_keys}"
        expected = task.writer_error(f)
        if expected is None and task.status is not W:
            expected = InvalidTransition
        if expected is None and key in task.requested:
            expected = InvalidPayload
        got = self.call(
            lambda: self.store.request_input(task.task_id, {key: InputRequest("?", {})}, fence=f),
            expected,
        )
        if got is None:
            return
        task.status = IR
        task.requested.append(key)
        task.drop_lease()
        task.touch(self.now)

    @precondition(has_tasks)
    @rule(index=indexes, fence=fences, held=st.booleans())
    def set_status_message(self, index: int, held: bool, fence: str) -> None:
        task = self.pick(index, held)
        f = self.fence_for(task, fence)
        expected = task.writer_error(f)
        if self.call(lambda: self.store.set_status_message(task.task_id, "m", fence=f), expected):
            task.touch(self.now, event=False)

    @precondition(has_tasks)
    @rule(
        seconds=st.sampled_from([0, 1, 10, 31, 100]),
        then=st.sampled_from(["nothing", "recover_expired", "reclaim"]),
        timeout=st.sampled_from([60.0, 300.0]),
    )
    def time_passes(self, seconds: int, then: str, timeout: float) -> None:
        """The clock moves on; then maybe the sweeper recovers leases or reclaims tasks."""
        self.clock.advance(seconds)
        if then == "recover_expired":
            self.recover_expired()
        elif then == "reclaim":
            self.reclaim(timeout)

    def recover_expired(self) -> None:
        expired = [
            t
            for t in self.tasks.values()
            if t.lease_expires_at is not None and t.lease_expires_at < self.now
        ]
        got = self.call(self.store.recover_expired, None)
        assert {t.task_id for t in got} == {t.task_id for t in expired}
        for task in expired:
            task.end_attempt(self.now, None, 0.0)

    def reclaim(self, timeout: float) -> None:
        stale = [
            t
            for t in self.tasks.values()
            if not t.status.terminal and self.now - t.updated_at > timeout
        ]
        got = self.call(lambda: self.store.reclaim(timeout), None)
        assert {r.task_id for r in got} == {t.task_id for t in stale}
        for task in stale:
            task.status, task.error, task.closed_fence = F, DEAD, None
            task.drop_lease()
            task.touch(self.now)

    # --- invariants ------------------------------------------------------------------------

    @invariant()
    def adapter_agrees_with_the_model(self) -> None:
        listed = self.run(self.store.list(limit=10_000))
        assert [t.task_id for t in listed] == self.order, "no task appears or vanishes"
        for stored in listed:
            model = self.tasks[stored.task_id]
            assert stored.status is model.status
            assert stored.fence == model.fence
            assert stored.lease_owner == model.lease
            assert stored.lease_expires_at == model.lease_expires_at
            assert stored.attempt == model.attempt
            assert stored.updated_at == model.updated_at
            assert stored.ready_at == model.ready_at
            assert set(stored.pending_input) == set(model.pending)
            assert len(self.run(self.store.history(stored.task_id))) == model.events

    @invariant()
    def rules_that_hold_whatever_happened(self) -> None:
        for stored in self.run(self.store.list(limit=10_000)):
            if stored.leased:
                assert stored.status is W, "only a working task holds a lease"
            assert stored.fence >= self.seen_fence.get(stored.task_id, 0), "fences only grow"
            self.seen_fence[stored.task_id] = stored.fence
            if stored.task_id in self.seen_terminal:
                assert stored.status is self.seen_terminal[stored.task_id], "terminal absorbs"
            elif stored.status.terminal:
                self.seen_terminal[stored.task_id] = stored.status


class MemoryMachine(StoreMachine):
    """The machine on the memory adapter."""

    def open_store(self) -> Store:
        return MemoryStore(clock=self.clock)


class SqliteMachine(StoreMachine):
    """The machine on the SQLite adapter (a fresh file per run)."""

    def open_store(self) -> Store:
        return SqliteStore(self.dir / "keel.db", clock=self.clock)


COMMON = {
    "stateful_step_count": 30,
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow],
}
MemoryMachine.TestCase.settings = settings(max_examples=100, **COMMON)
SqliteMachine.TestCase.settings = settings(max_examples=40, **COMMON)

TestMemoryStateMachine = MemoryMachine.TestCase
TestSqliteStateMachine = SqliteMachine.TestCase
