"""Each attempt runs in an asyncio task of its own, outside the worker's task group (see
``Worker._start_attempt``): what the task group gave must still hold. An attempt that
raises past its handler stops the worker, which raises it; a worker cancelled from outside
stops the handlers still running, again at each await, and returns only once they ended."""

from __future__ import annotations

import anyio
import pytest

from keel.model import Status
from keel.runtime import Keel, TaskContext
from keel.store import MemoryStore

from .support import WAIT, eventually, worker

pytestmark = pytest.mark.anyio


class Escaped(BaseException):
    """Not an ``Exception``: the worker does not turn it into a retry."""


async def test_an_attempt_raising_past_its_handler_stops_the_worker_with_its_error() -> None:
    store = MemoryStore()
    app = Keel(store)

    @app.task("escape")
    async def escape(ctx: TaskContext) -> None:
        raise Escaped("out of the handler")

    task = await app.submit("escape")
    w = worker(app)
    with anyio.fail_after(WAIT), pytest.raises(Escaped, match="out of the handler"):
        await w.run(stop=anyio.Event())  # never set: only the escape ends the run
    assert w.running == []
    after = await store.get(task.task_id)
    assert (after.status, after.attempt) == (Status.WORKING, 1)  # left to its lease


async def test_a_worker_cancelled_from_outside_waits_for_its_handlers_to_stop() -> None:
    store = MemoryStore()
    app = Keel(store)
    entered = anyio.Event()
    cancellations: list[str] = []
    ended: list[str] = []

    @app.task("stubborn")
    async def stubborn(ctx: TaskContext) -> None:
        entered.set()
        try:
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                cancellations.append("first")  # swallowed once: the next await is cancelled too
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancellations.append("second")
            raise
        finally:
            ended.append(ctx.task_id)

    task = await app.submit("stubborn")
    w = worker(app)
    async with anyio.create_task_group() as tg:
        tg.start_soon(w.run)
        with anyio.fail_after(WAIT):
            await entered.wait()
        tg.cancel_scope.cancel()
    # The task group returned only after the worker did: the handler had ended by then.
    assert (cancellations, ended, w.running) == (["first", "second"], [task.task_id], [])
    after = await eventually(lambda: store.get(task.task_id), "the task")
    assert after.status is Status.WORKING  # nothing written: the lease expires and recovers it
