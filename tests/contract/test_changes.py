"""Contract: the change feed (``store.changes()``, :mod:`keel.store.changes`).

The first item comes at once and says "read now"; later items name the tasks committed
writes changed; a refused write names nothing; another handle's writes (another process,
for the durable adapters) reach a listener too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import anyio
import pytest

from keel import InvalidTransition
from keel.store import Change, ChangeFeed, Store

from .support import ask

pytestmark = pytest.mark.anyio

WAIT = 10.0  # seconds: a bound, never a pause


async def naming(feed: AsyncIterator[Change], task_id: str) -> list[Change]:
    """Items until one names ``task_id`` (or says "re-read everything"); all of them."""
    seen: list[Change] = []
    with anyio.fail_after(WAIT):
        async for change in feed:
            seen.append(change)
            if change.task_ids is None or task_id in change.task_ids:
                return seen
    raise AssertionError("the feed ended")  # pragma: no cover


async def test_the_first_item_comes_at_once_and_says_read_everything(store: Store) -> None:
    assert isinstance(store, ChangeFeed)
    with anyio.fail_after(WAIT):
        first = await anext(store.changes())
    assert first.task_ids is None


async def test_a_committed_write_names_its_task_and_a_read_sees_it(store: Store) -> None:
    feed = store.changes()
    await anext(feed)
    task = await store.create(name="job")
    await store.set_status_message(task.task_id, "step 1 of 3")
    seen = await naming(feed, task.task_id)
    while seen[-1].task_ids is None:
        # The source (re)connected: "re-read everything" covers what came before, and
        # it now hears every commit (PostgreSQL: LISTEN took effect), so write again.
        await store.set_status_message(task.task_id, "step 2 of 3")
        seen = await naming(feed, task.task_id)
    assert (await store.get(task.task_id)).status_message in {None, "step 1 of 3", "step 2 of 3"}
    positions = [c.position for c in seen]
    assert positions == sorted(positions)
    await store.complete(task.task_id, {"ok": True})
    later = await naming(feed, task.task_id)
    assert later[-1].position > positions[-1]
    assert (await store.get(task.task_id)).status.terminal


async def test_a_refused_write_names_nothing(store: Store) -> None:
    waiting = await store.create(input_requests={"service": ask()})
    other = await store.create()
    feed = store.changes()
    await anext(feed)
    with pytest.raises(InvalidTransition):
        await store.complete(waiting.task_id, {"too": "soon"})
    await store.set_status_message(other.task_id, "moved")
    seen = await naming(feed, other.task_id)
    named = set().union(*(c.task_ids or set() for c in seen))
    assert waiting.task_id not in named


async def test_after_resumes_without_a_full_read(store: Store) -> None:
    feed = store.changes()
    first = await anext(feed)
    task = await store.create()
    seen = await naming(feed, task.task_id)
    while seen[-1].task_ids is None:  # the source (re)connected: it hears the next write
        await store.set_status_message(task.task_id, "again")
        seen = await naming(feed, task.task_id)
    position = seen[-1].position
    await feed.aclose()
    resumed = store.changes(after=position)
    with anyio.fail_after(WAIT):
        again = await anext(resumed)
    assert again.task_ids == frozenset() or again.task_ids is None
    assert again.position >= position >= first.position
    await resumed.aclose()


async def test_another_handles_writes_reach_a_listener(
    store: Store, reopen: Callable[[], Store]
) -> None:
    """A second handle on the same data stands for another process."""
    other = reopen()
    feed = store.changes()
    await anext(feed)
    task = await other.create(name="elsewhere")
    await other.set_status_message(task.task_id, "seen from afar")
    seen = await naming(feed, task.task_id)
    while seen[-1].task_ids is None:  # the source (re)connected: it hears the next write
        await other.set_status_message(task.task_id, "seen from afar, again")
        seen = await naming(feed, task.task_id)
    assert task.task_id in (seen[-1].task_ids or ())
    assert (await store.get(task.task_id)).task_id == task.task_id
