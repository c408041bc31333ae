"""Contract: live leases as an operator reads them (``store.workers``, ``store.leased``,
``store.stuck``; :mod:`keel.store.leases`).

Per worker: how many leases, how many expired, newest and oldest renewal, soonest
expiry. A worker's leases a keyset page at a time, soonest expiry first. Stuck tasks:
expired leases not recovered, input waits over a threshold, attempts past their tool's
deadline counted from their claim (a TTL is not a deadline). Bad arguments are refused,
naming the problem, and change nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from keel import InvalidPayload, Status
from keel.store import Store

from .support import LEASE, FakeClock, ask, refused

pytestmark = pytest.mark.anyio


async def _leased(store: Store, name: str, worker: str, n: int = 1) -> list[str]:
    ids = [(await store.create(name=name, max_attempts=2)).task_id for _ in range(n)]
    got = await store.claim([name], worker=worker, lease_seconds=LEASE, limit=n)
    assert sorted(t.task_id for t in got) == sorted(ids)
    return ids


async def test_workers_summarize_their_live_leases(store: Store, clock: FakeClock) -> None:
    """One entry per worker that holds a lease, by name; unclaimed, waiting and finished
    tasks hold none; a renewal moves the newest renewal and the soonest expiry."""
    assert await store.workers() == []
    await store.create(name="idle")
    early = await _leased(store, "diagnose", "w-b", 2)
    clock.advance(10)
    late = await _leased(store, "report", "w-a")
    clock.advance(5)
    fence = (await store.get(early[0])).fence
    await store.renew(early[0], fence=fence, lease_seconds=LEASE)
    a, b = await store.workers()
    start = clock.now - 15
    assert (a.worker, a.leases, a.expired) == ("w-a", 1, 0)
    assert (a.last_renewal, a.oldest_renewal, a.next_expiry) == (
        start + 10,
        start + 10,
        start + 10 + LEASE,
    )
    assert (b.worker, b.leases, b.expired) == ("w-b", 2, 0)
    assert (b.last_renewal, b.oldest_renewal, b.next_expiry) == (clock.now, start, start + LEASE)
    clock.advance(LEASE)  # w-b's unrenewed lease has expired now, w-a's too
    a, b = await store.workers()
    assert (a.expired, b.expired) == (1, 1)
    assert [w.expired for w in await store.workers(now=start)] == [0, 0]
    await store.complete(late[0], {"ok": True}, fence=1)
    assert [w.worker for w in await store.workers()] == ["w-b"]


async def test_a_workers_leases_page_by_expiry(store: Store, clock: FakeClock) -> None:
    """A worker's leased tasks, soonest expiry first then id, a page at a time: every
    task once, none of another worker's, and the last page has no cursor."""
    mine = []
    for _ in range(5):
        clock.advance(1)
        mine += await _leased(store, "job", "w-1")
    await _leased(store, "job", "w-2", 2)
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        page = await store.leased("w-1", limit=2, cursor=cursor)
        assert len(page.tasks) <= 2
        seen += [t.task_id for t in page.tasks]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == mine
    whole = await store.leased("w-1", limit=5)
    assert [t.task_id for t in whole.tasks] == mine
    assert whole.next_cursor is None
    assert (await store.leased("nobody")).tasks == ()


async def test_stuck_tasks_of_each_kind(store: Store, clock: FakeClock) -> None:
    """An expired lease; an input wait older than the threshold (not a younger one); an
    attempt of a tool with a deadline running past it since its claim (not one within
    it, nor one of a tool without a deadline); a live task past its TTL is none."""
    await store.create(name="old", ttl=1.0)  # past its TTL soon: not stuck for that
    waiting = await store.create(name="ask", input_requests={"input": ask()})
    clock.advance(100)
    await store.create(name="ask", input_requests={"input": ask()})  # waiting 20 s only
    (slow,) = await _leased(store, "deadlined", "w-1")
    clock.advance(15)
    (fast,) = await _leased(store, "deadlined", "w-1")
    (free,) = await _leased(store, "free", "w-1")
    clock.advance(5)
    for task_id in (slow, fast, free):
        await store.renew(task_id, fence=1, lease_seconds=LEASE)
    (dead,) = await _leased(store, "other", "w-dead")
    clock.advance(LEASE + 1)
    for task_id in (slow, fast, free):
        await store.renew(task_id, fence=1, lease_seconds=LEASE)
    found = await store.stuck(waiting_over=60, deadlines={"deadlined": 40.0})
    assert [t.task_id for t in found.lapsed] == [dead]
    assert [t.task_id for t in found.waiting] == [waiting.task_id]
    assert found.waiting[0].status is Status.INPUT_REQUIRED
    assert [(t.task_id, claimed) for t, claimed in found.overdue] == [(slow, clock.now - 51)]
    assert not found.more
    none = await store.stuck(waiting_over=1000)
    assert (none.waiting, none.overdue) == ((), ())


async def test_stuck_lists_are_limited_and_longest_overdue_first(
    store: Store, clock: FakeClock
) -> None:
    """At most ``limit`` of each kind, the longest overdue first; ``more`` says there
    were more."""
    ids = []
    for _ in range(3):
        ids += await _leased(store, "job", "w-1")
        clock.advance(1)
    clock.advance(LEASE + 100)
    found = await store.stuck(waiting_over=0, deadlines={"job": 10}, limit=2)
    assert [t.task_id for t in found.lapsed] == ids[:2]
    assert [t.task_id for t, _ in found.overdue] == ids[:2]
    assert found.more
    assert not (await store.stuck(waiting_over=0, deadlines={"job": 10}, limit=3)).more


@pytest.mark.parametrize(
    ("read", "call", "message"),
    [
        pytest.param("workers", {"now": float("nan")}, "now must be", id="now"),
        pytest.param("leased", {"worker": ""}, "worker must be", id="worker"),
        pytest.param("leased", {"worker": 3}, "worker must be", id="worker-type"),
        pytest.param("leased", {"worker": "w", "cursor": "nope!"}, "cursor", id="cursor"),
        pytest.param("leased", {"worker": "w", "limit": 0}, "page limit", id="limit"),
        pytest.param("stuck", {"waiting_over": -1}, "waiting_over must be", id="wait"),
        pytest.param(
            "stuck", {"waiting_over": 1, "deadlines": {"x": 0}}, "deadline of 'x'", id="deadline"
        ),
        pytest.param(
            "stuck", {"waiting_over": 1, "deadlines": {3: 1}}, "tool name", id="deadline-name"
        ),
        pytest.param("stuck", {"waiting_over": 1, "limit": 10_000}, "stuck limit", id="limit"),
    ],
)
async def test_bad_requests_are_refused_naming_the_problem(
    store: Store, read: str, call: dict[str, Any], message: str
) -> None:
    """InvalidPayload naming the argument; the store is unchanged."""
    await _leased(store, "job", "w")
    error = await refused(store, InvalidPayload, lambda: getattr(store, read)(**call))
    assert message in str(error)
