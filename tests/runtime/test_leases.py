"""Leases in the runtime: heartbeats keep them, expiry hands the task to another attempt
(or dead-letters it), stale attempts are fenced out, shutdown gives tasks back, the
purge loop spares live tasks, and workers claim only the names they register.

Leases, backoff and TTLs run on the store's FakeClock: tests move it instead of waiting.
"""

from __future__ import annotations

from typing import Any, cast

import anyio
import anyio.lowlevel
import pytest

from contract.support import FakeClock
from keel.errors import LeaseLost, TaskAlreadyTerminal, TaskNotFound
from keel.model import INTERNAL_ERROR, Status
from keel.runtime import Keel, TaskContext, TaskFailed
from keel.store import SqliteStore, Store

from .support import (
    SERVICE,
    WAIT,
    Gates,
    HoldNext,
    claimed_by,
    eventually,
    parks,
    reaches,
    running,
    scheduled,
    settles,
    worker,
)

pytestmark = pytest.mark.anyio

LEASE = 30.0  # seconds (store clock): heartbeats (every LEASE / 3 real seconds) never fire


async def test_heartbeats_keep_a_long_attempt_alive(store: Store, clock: FakeClock) -> None:
    """Heartbeats renew the lease of an attempt outliving its lease; recovery never takes it."""
    app = Keel(store)
    gates = Gates()
    lease = 0.3  # seconds: the heartbeat renews every 0.1 s of real time

    @app.task("long", lease_seconds=lease)
    async def long(ctx: TaskContext) -> int:
        await gates.wait("finish")
        return ctx.fence

    task = await app.submit("long")
    async with running(worker(app, worker_id="w")):
        held = await claimed_by(store, task.task_id, "w")
        for _ in range(5):  # 1.0 s of store time in all: more than three lease lengths
            clock.advance(lease * 2 / 3)

            async def renewed() -> bool:
                current = await store.get(task.task_id)
                return current.lease_expires_at == clock.now + lease

            await eventually(renewed, "the heartbeat to renew the lease")
        gates.open("finish")
        done = await settles(store, task.task_id)
    assert (done.status, done.attempt, done.fence) == (Status.COMPLETED, 1, held.fence)
    assert not any("expired" in e.reason for e in await store.history(task.task_id))


def _takeover_app(
    store: Store, gates: Gates, effects: list[str], stale_writes: list[BaseException]
) -> Keel:
    """``diagnose``: checkpoints a step, then hangs on its first attempt; later attempts
    wait for the ``finish`` gate and return their fence."""
    app = Keel(store)

    def expensive() -> str:
        effects.append("queried the metrics API")
        return "p99 latency up 4x"

    @app.task("diagnose", lease_seconds=LEASE, max_attempts=3)
    async def diagnose(ctx: TaskContext) -> dict[str, Any]:
        finding = await ctx.step("metrics", expensive)
        if ctx.attempt == 1:
            gates.open("first attempt checkpointed")
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                with anyio.CancelScope(shield=True):  # one more write, as a stale attempt
                    try:
                        await ctx.step("late", lambda: "from the stale attempt")
                    except (LeaseLost, TaskAlreadyTerminal) as exc:
                        stale_writes.append(exc)
                    gates.open("stale attempt stopped")
                raise
        gates.open(f"attempt {ctx.attempt} running")
        await gates.wait("finish")
        return {"finding": finding, "fence": ctx.fence, "worker": ctx.worker}

    return app


async def test_an_expired_lease_is_taken_over_and_the_stale_attempt_fenced_out(
    store: Store, clock: FakeClock
) -> None:
    """An expired attempt is taken over and fenced out (LeaseLost); no step is redone."""
    # The hung attempt checkpointed a step; the rescuer replays it instead of redoing it.
    # The hung attempt is stopped; its late step write and its completion get LeaseLost,
    # and the stored result is the live attempt's.
    gates = Gates()
    effects: list[str] = []
    stale_writes: list[BaseException] = []
    app = _takeover_app(store, gates, effects, stale_writes)
    task = await app.submit("diagnose")

    async with running(worker(app, concurrency=1, worker_id="hung")):
        await gates.wait("first attempt checkpointed")
        stale = await claimed_by(store, task.task_id, "hung", fence=1)
        async with running(worker(app, concurrency=1, worker_id="rescuer")):
            clock.advance(LEASE + 1)  # the hung worker could not renew: its lease runs out
            await gates.wait("attempt 2 running")
            live = await claimed_by(store, task.task_id, "rescuer", fence=2)
            await gates.wait("stale attempt stopped")

            with pytest.raises(LeaseLost):
                await store.complete(task.task_id, {"from": "stale"}, fence=stale.fence)
            assert await store.get(task.task_id) == live

            gates.open("finish")
            done = await settles(store, task.task_id)

    assert done.status is Status.COMPLETED
    assert done.result["structuredContent"] == {
        "finding": "p99 latency up 4x",
        "fence": 2,
        "worker": "rescuer",
    }
    assert (done.attempt, done.fence, done.closed_fence) == (2, 2, 2)
    assert effects == ["queried the metrics API"]
    assert [type(e) for e in stale_writes] == [LeaseLost]
    assert await store.steps(task.task_id) == {"metrics": "p99 latency up 4x"}
    with pytest.raises(TaskAlreadyTerminal):
        await store.complete(task.task_id, {"from": "stale"}, fence=stale.fence)

    reasons = [(e.actor, e.reason) for e in await store.history(task.task_id)]
    assert ("worker:hung", "claimed by hung (attempt 1/3, fence 1)") in reasons
    assert ("worker:rescuer", "claimed by rescuer (attempt 2/3, fence 2)") in reasons
    recovered = [r for actor, r in reasons if actor == "recovery"]
    assert len(recovered) == 1
    assert recovered[0].startswith("lease of hung expired ")
    assert recovered[0].endswith("on attempt 1/3; retrying in 0s")


async def test_a_worker_never_runs_two_attempts_of_one_task(
    sqlite_store: SqliteStore, clock: FakeClock
) -> None:
    """A worker re-claiming a task it still runs stops the older attempt: one at a time."""
    store = sqlite_store
    gates = Gates()
    effects: list[str] = []
    stale_writes: list[BaseException] = []
    app = _takeover_app(store, gates, effects, stale_writes)
    task = await app.submit("diagnose")
    w = worker(app, concurrency=2, worker_id="solo")

    async with running(w):
        await gates.wait("first attempt checkpointed")
        clock.advance(LEASE + 1)
        await gates.wait("attempt 2 running")
        await claimed_by(store, task.task_id, "solo", fence=2)
        with anyio.fail_after(1):  # the watch loop runs every 0.01 s
            await gates.wait("stale attempt stopped")
        assert w.running == [task.task_id]
        gates.open("finish")
        await settles(store, task.task_id)


async def test_an_attempt_claimed_during_a_watch_read_keeps_running(
    sqlite_store: SqliteStore,
) -> None:
    """An attempt claimed while the watch loop's status read is in flight is not stopped."""
    store = sqlite_store
    held = HoldNext(store, "statuses")
    app = Keel(cast(Store, held))
    gates = Gates()
    stopped: list[str] = []

    @app.task("step")
    async def step(ctx: TaskContext, name: str) -> str:
        gates.open(f"{name} running")
        try:
            await gates.wait(f"{name} may finish")
        except anyio.get_cancelled_exc_class():
            stopped.append(name)
            raise
        return name

    first = await app.submit("step", {"name": "first"})
    async with running(worker(app, concurrency=2)):
        await gates.wait("first running")
        held.armed = True
        with anyio.fail_after(WAIT):
            await held.caught.wait()  # the watch loop's read of [first] is in flight
        second = await app.submit("step", {"name": "second"})
        await gates.wait("second running")
        held.let_go.set()
        for name in ("first", "second"):
            gates.open(f"{name} may finish")
        with anyio.fail_after(1):  # the worker loops run every 0.01 s
            done = await settles(store, second.task_id)
        await settles(store, first.task_id)
    assert (done.status, stopped) == (Status.COMPLETED, [])


async def test_an_expired_lease_on_the_last_attempt_is_dead_lettered(
    store: Store, clock: FakeClock
) -> None:
    """An expired lease on the last attempt dead-letters the task and stops the hung handler."""
    app = Keel(store)
    gates = Gates()

    @app.task("hang", lease_seconds=LEASE, max_attempts=1)
    async def hang(ctx: TaskContext) -> None:
        gates.open("running")
        try:
            await anyio.sleep_forever()
        finally:
            gates.open("stopped")

    task = await app.submit("hang")
    w = worker(app, worker_id="w")
    async with running(w):
        await gates.wait("running")
        clock.advance(LEASE + 5)
        failed = await reaches(store, task.task_id, Status.FAILED)
        await gates.wait("stopped")
        await eventually(lambda: not w.running, "the worker to drop the attempt")

    assert failed.error is not None
    assert failed.error["code"] == INTERNAL_ERROR
    assert failed.error["message"] == (
        "dead letter after 1 attempt(s): the worker running attempt 1/1 stopped renewing its lease"
    )
    assert "w" not in failed.error["message"].split()  # the worker id is in the history only
    last = (await store.history(task.task_id))[-1]
    assert (last.actor, last.to_status) == ("recovery", Status.FAILED)
    assert last.reason.endswith("on attempt 1/1; no attempts left")


async def test_an_attempt_within_its_deadline_is_not_disturbed(store: Store) -> None:
    """A handler that finishes before its hard deadline completes normally."""
    app = Keel(store)

    @app.task("prompt", deadline_seconds=WAIT)
    async def prompt(ctx: TaskContext) -> str:
        await anyio.lowlevel.checkpoint()
        return "in time"

    task = await app.submit("prompt")
    async with running(worker(app)):
        done = await settles(store, task.task_id)
    assert (done.status, done.attempt) == (Status.COMPLETED, 1)


async def test_a_deadline_stops_a_hung_attempt_then_retries_and_fails(store: Store) -> None:
    """A hard deadline stops a hung attempt, which is retried, then failed naming the deadline."""
    app = Keel(store)
    stopped: list[int] = []

    @app.task("stuck", deadline_seconds=0.05, max_attempts=2, retry_base=0.0, retry_cap=0.0)
    async def stuck(ctx: TaskContext) -> None:
        try:
            await anyio.sleep_forever()
        finally:
            stopped.append(ctx.attempt)

    task = await app.submit("stuck")
    async with running(worker(app)):
        failed = await settles(store, task.task_id)
    assert failed.status is Status.FAILED
    assert failed.error == {
        "code": INTERNAL_ERROR,
        "message": "dead letter after 2 attempt(s): deadline of 0.05s exceeded",
    }
    assert stopped == [1, 2]
    reasons = [e.reason for e in await store.history(task.task_id)]
    assert "attempt 1/2 failed: deadline of 0.05s exceeded; retrying in 0s" in reasons


async def test_shutdown_gives_running_tasks_back_without_spending_an_attempt(
    store: Store,
) -> None:
    """Shutdown releases running tasks on the same attempt; another worker finishes them."""
    app = Keel(store)
    gates = Gates()
    effects: list[str] = []

    def prepare(n: int) -> int:
        effects.append(f"prepared {n}")
        return n

    @app.task("long", max_attempts=1)
    async def long(ctx: TaskContext, n: int) -> int:
        await ctx.step("prepare", prepare, n)
        if ctx.worker == "leaving":
            gates.open(f"{n} prepared")
            await anyio.sleep_forever()
        return n * 10

    tasks = [await app.submit("long", {"n": n}) for n in range(3)]
    async with running(worker(app, concurrency=3, worker_id="leaving")):
        for n in range(3):
            await gates.wait(f"{n} prepared")
    for task in tasks:
        released = await store.get(task.task_id)
        assert released.status is Status.WORKING
        assert (released.lease_owner, released.attempt, released.fence) == (None, 1, 1)
        assert released.ready_at <= released.updated_at
        last = (await store.history(task.task_id))[-1]
        assert last.reason == "released by leaving: worker shutting down"

    async with running(worker(app, concurrency=3, worker_id="staying")):
        finished = [await settles(store, task.task_id) for task in tasks]
    assert [t.status for t in finished] == [Status.COMPLETED] * 3
    assert [(t.attempt, t.fence) for t in finished] == [(1, 2)] * 3
    assert [t.result["content"][0]["text"] for t in finished] == ["0", "10", "20"]
    assert sorted(effects) == ["prepared 0", "prepared 1", "prepared 2"]


async def test_a_claim_in_flight_at_shutdown_is_given_back(sqlite_store: SqliteStore) -> None:
    """A claim committing during shutdown is given back unstarted; the worker stops promptly."""
    store = sqlite_store
    held = HoldNext(store, "claim")
    app = Keel(cast(Store, held))
    started: list[int] = []

    @app.task("hang", max_attempts=1)
    async def hang(ctx: TaskContext) -> None:
        started.append(ctx.fence)
        await anyio.sleep_forever()

    w = worker(app, worker_id="leaving")
    stop = anyio.Event()
    finished = anyio.Event()

    async def run() -> None:
        try:
            await w.run(stop=stop)
        finally:
            finished.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await w.started.wait()
        held.armed = True
        task = await app.submit("hang")
        with anyio.fail_after(WAIT):
            await held.caught.wait()  # the claim committed; its answer is on its way
        stop.set()
        held.let_go.set()
        with anyio.move_on_after(1):
            await finished.wait()
        stopped_in_time = finished.is_set()
        tg.cancel_scope.cancel()

    assert stopped_in_time, "the worker did not stop within 1 s"
    after = await store.get(task.task_id)
    assert (after.status, after.lease_owner, after.attempt, started) == (
        Status.WORKING,
        None,
        1,
        [],
    )


async def test_the_purge_loop_never_deletes_live_tasks(store: Store, clock: FakeClock) -> None:
    """The sweeper purges finished tasks past their TTL and never a live one."""
    app = Keel(store)
    gates = Gates()
    ttl = 60.0  # seconds

    @app.task("done", ttl_seconds=ttl, lease_seconds=10_000)
    async def done(ctx: TaskContext) -> str:
        return "ok"

    @app.task("refused", ttl_seconds=ttl, lease_seconds=10_000)
    async def refused(ctx: TaskContext) -> None:
        raise TaskFailed("not allowed")

    @app.task("hang", ttl_seconds=ttl, lease_seconds=10_000)
    async def hang(ctx: TaskContext) -> None:
        gates.open("hanging")
        await anyio.sleep_forever()

    @app.task("ask", ttl_seconds=ttl, lease_seconds=10_000)
    async def ask(ctx: TaskContext) -> str:
        return (await ctx.elicit("Which service?", SERVICE))["service"]

    @app.task("flaky", ttl_seconds=ttl, lease_seconds=10_000, retry_base=1e6, retry_cap=1e6)
    async def flaky(ctx: TaskContext) -> None:
        raise OSError("disk on fire")

    names = ["done", "refused", "hang", "ask", "flaky"]
    ids = {name: (await app.submit(name)).task_id for name in names}
    async with running(worker(app, concurrency=5)):
        await settles(store, ids["done"])
        await settles(store, ids["refused"])
        await gates.wait("hanging")
        await parks(store, ids["ask"])
        await scheduled(store, ids["flaky"], 2)

        clock.advance(ttl * 10)

        async def gone(task_id: str) -> bool:
            try:
                await store.get(task_id)
            except TaskNotFound:
                return True
            return False

        await eventually(lambda: gone(ids["done"]), "the completed task to be purged")
        await eventually(lambda: gone(ids["refused"]), "the failed task to be purged")
        assert await store.purge() == []  # what remains is alive
        alive = {name: await store.get(ids[name]) for name in ("hang", "ask", "flaky")}
        assert alive["hang"].lease_owner is not None
        assert alive["ask"].status is Status.INPUT_REQUIRED
        assert alive["flaky"].status is Status.WORKING

        await store.provide_input(ids["ask"], {"input-1": {"service": "payments"}})
        answered = await settles(store, ids["ask"])
        # It outlived its ttl, so it is kept ttl after it finished, for its client to read.
        assert answered.expires_at == answered.updated_at + ttl
        assert await store.purge() == []
        clock.advance(ttl + 1)
        await eventually(lambda: gone(ids["ask"]), "the answered task to be purged")
        assert (await store.get(ids["hang"])).status is Status.WORKING


async def test_workers_claim_only_the_names_they_register(store: Store) -> None:
    """Workers never claim other names or facade tasks, even older ones."""
    foreign = await store.create(name="someone_elses", max_attempts=1)
    facade = await store.create()
    app = Keel(store)

    @app.task("mine")
    async def mine(ctx: TaskContext) -> str:
        return "mine"

    ours = await app.submit("mine")
    async with running(worker(app, concurrency=4)):
        assert (await settles(store, ours.task_id)).status is Status.COMPLETED
    for untouched in (foreign, facade):
        assert await store.get(untouched.task_id) == untouched
        assert len(await store.history(untouched.task_id)) == 1

    other = Keel(store)

    @other.task("someone_elses")
    async def theirs(ctx: TaskContext) -> str:
        return "theirs"

    async with running(worker(other)):
        assert (await settles(store, foreign.task_id)).status is Status.COMPLETED
    assert await store.get(facade.task_id) == facade


async def test_each_task_is_claimed_with_its_own_lease(store: Store, clock: FakeClock) -> None:
    """Tasks of one app with different leases are each claimed with their own: a 30 s task
    is never leased for a 5 s neighbour's lease (a restart longer than that would see it
    expire and dead-letter a task whose worker had only paused)."""
    app = Keel(store)
    gates = Gates()

    @app.task("short", lease_seconds=5.0)
    async def short(ctx: TaskContext) -> None:
        await gates.wait("finish")

    @app.task("long", lease_seconds=LEASE)
    async def long(ctx: TaskContext) -> None:
        await gates.wait("finish")

    first = await app.submit("short")
    second = await app.submit("long")
    async with running(worker(app, worker_id="w")):
        short_held = await claimed_by(store, first.task_id, "w")
        long_held = await claimed_by(store, second.task_id, "w")
        gates.open("finish")
        await settles(store, first.task_id)
        await settles(store, second.task_id)
    assert short_held.lease_expires_at == short_held.updated_at + 5.0
    assert long_held.lease_expires_at == long_held.updated_at + LEASE
