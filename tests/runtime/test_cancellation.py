"""Cancellation: durable at once; a running handler stops at its next await; a waiting
task simply ends; a cancel racing a completion leaves exactly one terminal outcome."""

from __future__ import annotations

import anyio
import pytest

from contract.support import FakeClock
from keel.errors import TaskAlreadyTerminal
from keel.model import Status
from keel.runtime import Keel, TaskContext
from keel.store import Store

from .support import (
    SERVICE,
    Gates,
    eventually,
    parks,
    running,
    scheduled,
    settles,
    terminal_events,
    worker,
)

pytestmark = pytest.mark.anyio


def _stoppable(app: Keel, gates: Gates, refused: list[BaseException]) -> None:
    """Register ``hang``: runs until cancelled, then tries one more (refused) write."""

    @app.task("hang")
    async def hang(ctx: TaskContext) -> str:
        gates.open("started")
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                try:
                    await ctx.step("after the cancel", lambda: "late")
                except TaskAlreadyTerminal as exc:
                    refused.append(exc)
                gates.open("stopped")
            raise
        return "unreachable"

    @app.task("next")
    async def next_(ctx: TaskContext) -> str:
        return "the worker still runs tasks"


@pytest.mark.parametrize("via", ["app", "store"])
async def test_cancel_stops_a_running_handler(store: Store, via: str) -> None:
    """Cancelling a running task stops its handler promptly and refuses its later writes."""
    # Through the app the worker hears of it at once; through the store, by its watch loop.
    # Either way the stopped attempt's late write is refused and the worker runs the next task.
    app = Keel(store)
    gates = Gates()
    refused: list[BaseException] = []
    _stoppable(app, gates, refused)
    task = await app.submit("hang")
    # Through the app the worker hears of the cancel directly: no watch loop needed.
    w = worker(app, concurrency=1, watch_interval=60.0 if via == "app" else 0.01)
    async with running(w):
        await gates.wait("started")
        cancel = app.cancel if via == "app" else store.cancel
        cancelled = await cancel(task.task_id, reason="the user gave up")
        assert cancelled.status is Status.CANCELLED
        await gates.wait("stopped")
        await eventually(lambda: not w.running, "the worker to let go of the task")
        after = await app.submit("next")
        assert (await settles(store, after.task_id)).status is Status.COMPLETED

    final = await store.get(task.task_id)
    assert final.status is Status.CANCELLED
    assert (final.result, final.lease_owner) == (None, None)
    assert [type(e) for e in refused] == [TaskAlreadyTerminal]
    assert await store.steps(task.task_id) == {}
    history = await store.history(task.task_id)
    assert terminal_events(history) == [history[-1]]
    assert history[-1].reason == "cancelled: the user gave up"


async def test_cancel_a_waiting_task(store: Store) -> None:
    """A waiting task is cancelled without a worker; a late answer is refused."""
    app = Keel(store)
    runs = 0

    @app.task("ask")
    async def ask(ctx: TaskContext) -> str:
        nonlocal runs
        runs += 1
        return (await ctx.elicit("Which service?", SERVICE))["service"]

    task = await app.submit("ask")
    async with running(worker(app)):
        await parks(store, task.task_id)
        assert (await app.cancel(task.task_id)).status is Status.CANCELLED
        with pytest.raises(TaskAlreadyTerminal) as info:
            await store.provide_input(task.task_id, {"input-1": {"service": "payments"}})
        assert info.value.task.status is Status.CANCELLED
    final = await store.get(task.task_id)
    assert (final.status, final.fence, runs) == (Status.CANCELLED, 1, 1)


async def test_cancel_a_task_waiting_for_its_retry(store: Store, clock: FakeClock) -> None:
    """A task in retry backoff is cancelled at once and never claimed again."""
    app = Keel(store)
    runs = 0

    @app.task("flaky", max_attempts=5, retry_base=30.0, retry_cap=30.0)
    async def flaky(ctx: TaskContext) -> None:
        nonlocal runs
        runs += 1
        raise ConnectionError("upstream down")

    task = await app.submit("flaky")
    async with running(worker(app)):
        backing_off = await scheduled(store, task.task_id, 2)
        assert backing_off.fence == 1
        await app.cancel(task.task_id)
        clock.advance(60)
        assert await store.claim(["flaky"], worker="probe", lease_seconds=5) == []
    final = await store.get(task.task_id)
    assert (final.status, runs) == (Status.CANCELLED, 1)


ROUNDS = 12


async def test_cancel_racing_completion_leaves_one_outcome(store: Store) -> None:
    """A cancel racing a completion leaves exactly one terminal outcome; the worker survives."""
    # Cancels fire in the same event-loop pass as the handlers finish, alternating who goes
    # first: the loser gets TaskAlreadyTerminal (or its outcome is discarded).
    app = Keel(store)
    gates = Gates()

    @app.task("quick")
    async def quick(ctx: TaskContext, n: int) -> int:
        gates.open(f"running {n}")
        await gates.wait(f"finish {n}")
        return n

    tasks = [await app.submit("quick", {"n": n}) for n in range(ROUNDS)]
    outcomes: dict[str, str] = {}

    async def cancel(task_id: str, passes: int = 0) -> None:
        for _ in range(passes):  # let the completion go this many event-loop passes ahead
            await anyio.lowlevel.checkpoint()
        try:
            await app.cancel(task_id)
            outcomes[task_id] = "cancel won"
        except TaskAlreadyTerminal as exc:
            outcomes[task_id] = f"{exc.task.status.value} won"

    async with running(worker(app, concurrency=ROUNDS)):
        for n in range(ROUNDS):
            await gates.wait(f"running {n}")
        async with anyio.create_task_group() as tg:
            for n, task in enumerate(tasks):
                # Alternate who is scheduled first. The worker writes the outcomes of the
                # handlers that end together in one store call, a few event-loop passes
                # after they end: the cancel follows the completion by 0 to 5 passes.
                if n % 2:
                    gates.open(f"finish {n}")
                    tg.start_soon(cancel, task.task_id, n // 2)
                else:
                    tg.start_soon(cancel, task.task_id)
                    gates.open(f"finish {n}")
        finals = [await settles(store, task.task_id) for task in tasks]
        survivor = await app.submit("quick", {"n": ROUNDS})
        gates.open(f"finish {ROUNDS}")
        assert (await settles(store, survivor.task_id)).status is Status.COMPLETED

    # Both orders really happened: the race went each way at least once.
    assert set(outcomes.values()) == {"cancel won", "completed won"}
    for task, final in zip(tasks, finals, strict=True):
        history = await store.history(task.task_id)
        assert terminal_events(history) == [history[-1]], history
        if outcomes[task.task_id] == "cancel won":
            assert (final.status, final.result) == (Status.CANCELLED, None)
        else:
            assert final.status is Status.COMPLETED
            assert final.result["content"][0]["text"] == str(final.arguments["n"])
        assert final.lease_owner is None


async def test_terminal_tasks_stay_as_they_are(store: Store) -> None:
    """Cancelling a completed task is refused with its snapshot; nothing changes."""
    app = Keel(store)

    @app.task("quick")
    async def quick(ctx: TaskContext) -> str:
        return "done"

    task = await app.submit("quick")
    async with running(worker(app)):
        done = await settles(store, task.task_id)
    with pytest.raises(TaskAlreadyTerminal) as info:
        await app.cancel(task.task_id)
    assert info.value.task == done
    assert await store.get(task.task_id) == done
