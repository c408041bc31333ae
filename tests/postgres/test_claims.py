"""Claims on PostgreSQL: the one-statement claim is the pure claim transition in SQL,
bounded, and concurrent claimers never get the same task."""

from __future__ import annotations

import anyio
import pytest

from contract.support import FakeClock
from keel.model import transitions as tr
from keel.store.base import MAX_CLAIM_BATCH

pytestmark = [pytest.mark.postgres, pytest.mark.anyio]

LEASE = 30.0  # seconds


async def test_sql_claim_agrees_with_the_pure_transition(open_pg):
    """Each claimed task and its history entry are what transitions.claim makes of it."""
    clock = FakeClock()
    store = open_pg(clock=clock)
    first = await store.create(name="job", max_attempts=3)
    clock.advance(1)
    second = await store.create(name="job", max_attempts=2)
    [old] = await store.claim(["job"], worker="w0", lease_seconds=LEASE)
    clock.advance(LEASE + 1)
    [recovered] = await store.recover_expired()  # attempt 2, fence 1: not a fresh task
    clock.advance(2)
    before = {t.task_id: t for t in await store.list()}
    got = await store.claim(["job"], worker="w1", lease_seconds=LEASE, limit=5)
    # ready_at decides: the second was ready since its creation, the first since recovery.
    assert [t.task_id for t in got] == [second.task_id, recovered.task_id]
    assert old.task_id == first.task_id == recovered.task_id
    for task in got:
        change = tr.claim(before[task.task_id], clock(), worker="w1", lease_seconds=LEASE)
        assert task == change.task
        assert (await store.history(task.task_id))[-1] == change.event


async def test_claim_order_and_bound(open_pg):
    """Earliest ready first, then stored order; at most MAX_CLAIM_BATCH per call."""
    clock = FakeClock()
    store = open_pg(clock=clock)
    made = [await store.create(name="job") for _ in range(MAX_CLAIM_BATCH + 5)]
    got = await store.claim(["job"], worker="w", lease_seconds=LEASE, limit=1000)
    assert [t.task_id for t in got] == [t.task_id for t in made[:MAX_CLAIM_BATCH]]
    assert all(t.fence == 1 for t in got)


@pytest.mark.slow
async def test_concurrent_claimers_never_share_a_task(open_pg):
    """Four stores (four pools) claiming at once from one queue: every task once."""
    stores = [open_pg() for _ in range(4)]
    made = {t.task_id for t in [await stores[0].create(name="job") for _ in range(300)]}
    taken: list[str] = []

    async def drain(n: int) -> None:
        while True:
            got = await stores[n].claim(["job"], worker=f"w{n}", lease_seconds=LEASE, limit=7)
            if not got:
                return
            taken.extend(t.task_id for t in got)

    async with anyio.create_task_group() as tg:
        for n in range(4):
            tg.start_soon(drain, n)
    assert sorted(taken) == sorted(made)
