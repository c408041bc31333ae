"""Wake-ups on PostgreSQL: NOTIFY after commit reaches subscribers in other connections,
workers use it when the store offers it, and polling alone still completes everything."""

from __future__ import annotations

import json

import anyio
import pytest

from keel.model import Status
from keel.runtime import Keel, TaskContext, Worker
from keel.store.postgres.notify import MAX_PAYLOAD, payloads
from runtime.support import reaches, running

pytestmark = pytest.mark.postgres

WAIT = 10.0  # seconds


async def _listening(store) -> None:
    # The LISTEN connection lives in another thread: poll its flag under a deadline.
    with anyio.fail_after(WAIT):
        while not store.listening:  # noqa: ASYNC110
            await anyio.sleep(0.005)


def test_payloads_are_chunked_under_the_limit():
    """Many values split into several JSON payloads, each under PostgreSQL's limit."""
    values = {f"task-{n:05d}" for n in range(2000)}
    chunks = payloads(values)
    assert len(chunks) > 1
    assert all(len(c.encode()) <= MAX_PAYLOAD for c in chunks)
    assert payloads({"x" * 9000}) == [""], "an oversized value means 'anything'"


def test_payloads_that_fit_are_one_sorted_list():
    """A group's values in one payload, sorted; nothing for no values; a value just too
    long for a payload of its own still means 'anything'."""
    assert payloads({"b", "a", "é"}) == [json.dumps(["a", "b", "é"])]
    assert payloads(set()) == []
    assert payloads({"x" * (MAX_PAYLOAD - 9)}) == [""]
    assert payloads({"x" * (MAX_PAYLOAD - 10)}) == [json.dumps(["x" * (MAX_PAYLOAD - 10)])]


@pytest.mark.anyio
async def test_ready_and_cancel_reach_another_connection(open_pg):
    """A task created (and one cancelled while leased) through one store wakes the
    subscriber of another store on the same schema; other task names do not."""
    listener, writer = open_pg(), open_pg()
    ready = anyio.Event()
    cancelled: list[str] = []
    got_cancel = anyio.Event()

    def on_cancel(task_id: str) -> None:
        cancelled.append(task_id)
        got_cancel.set()

    unsubscribe = listener.subscribe(["job"], on_ready=ready.set, on_cancel=on_cancel)
    try:
        await _listening(listener)
        await writer.create(name="other-name")
        task = await writer.create(name="job")
        with anyio.fail_after(WAIT):
            await ready.wait()
        [leased] = await writer.claim(["job"], worker="w", lease_seconds=30)
        await writer.cancel(leased.task_id)
        with anyio.fail_after(WAIT):
            await got_cancel.wait()
        assert cancelled == [task.task_id]
    finally:
        unsubscribe()


@pytest.mark.anyio
async def test_notify_off_subscribes_to_nothing(open_pg):
    """With notify=off there is no LISTEN connection and subscribe is a no-op."""
    store = open_pg(notify="off")
    unsubscribe = store.subscribe(["job"], on_ready=lambda: None, on_cancel=lambda _: None)
    unsubscribe()
    assert not store.listening


def _app(store) -> Keel:
    app = Keel(store)

    @app.task("job")
    async def job(ctx: TaskContext, n: int) -> int:
        return n * 2

    return app


@pytest.mark.anyio
async def test_a_notification_wakes_an_idle_worker(open_pg):
    """A worker whose poll is an hour away runs a task created by another process's store
    at once: the wake-up came by NOTIFY through the worker's subscribe hook."""
    worker_store, client = open_pg(), open_pg()
    w = Worker(_app(worker_store), claim_interval=3600, watch_interval=0.05)
    async with running(w):
        await _listening(worker_store)
        # A first task; once it is done the worker's claim loop goes idle for an hour.
        first = await client.create(name="job", arguments={"n": 1})
        await reaches(client, first.task_id, Status.COMPLETED)
        task = await client.create(name="job", arguments={"n": 21})
        done = await reaches(client, task.task_id, Status.COMPLETED)
    assert done.status is Status.COMPLETED


@pytest.mark.anyio
async def test_cancel_notification_stops_a_handler_at_once(open_pg):
    """A handler running in a worker whose watch poll is an hour away is stopped by a
    cancel made through another store: the NOTIFY reached it."""
    worker_store, client = open_pg(), open_pg()
    app = Keel(worker_store)
    started, stopped = anyio.Event(), anyio.Event()

    @app.task("hold")
    async def hold(ctx: TaskContext) -> None:
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            stopped.set()

    w = Worker(app, claim_interval=0.01, watch_interval=3600)
    async with running(w):
        await _listening(worker_store)
        task = await client.create(name="hold")
        with anyio.fail_after(WAIT):
            await started.wait()
        await client.cancel(task.task_id)
        with anyio.fail_after(WAIT):
            await stopped.wait()
    assert (await client.get(task.task_id)).status is Status.CANCELLED


@pytest.mark.anyio
async def test_polling_alone_completes_every_task(open_pg):
    """notify=off: two workers on their own stores, polling only, complete all 60 tasks."""
    client = open_pg(notify="off")
    workers = [
        Worker(_app(open_pg(notify="off")), claim_interval=0.02, watch_interval=0.05)
        for _ in range(2)
    ]
    async with running(*workers):
        made = [await client.create(name="job", arguments={"n": n}) for n in range(60)]
        for task in made:
            await reaches(client, task.task_id, Status.COMPLETED)
    results = {t.task_id: t.result for t in await client.list(limit=100)}
    assert len(results) == 60
    assert all(t.status is Status.COMPLETED for t in await client.list(limit=100))
