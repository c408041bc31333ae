"""The list's counts per status: counted once, then recounted in the background when
stale (so no page but the first waits for a full count of a big store)."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from keel import Status
from keel.ops.counts import FRESH, CachedCounts
from keel.store import MemoryStore

pytestmark = pytest.mark.anyio


async def test_counts_are_reused_while_fresh_and_recounted_behind_the_page() -> None:
    """Fresh: the same counts; stale: the old counts at once, the new ones next time."""
    now = [100.0]
    store = MemoryStore()
    counts = CachedCounts(store, clock=lambda: now[0])
    await store.create(name="job")
    first, age = await counts.get()
    assert (first[Status.WORKING], age) == (1, 0.0)
    await store.create(name="job")
    now[0] += FRESH / 2
    assert (await counts.get())[0][Status.WORKING] == 1  # fresh: not counted again
    now[0] += FRESH
    stale, age = await counts.get()
    assert stale[Status.WORKING] == 1
    assert age == pytest.approx(1.5 * FRESH)
    with anyio.fail_after(5):
        while counts._recount is not None:  # the recount started behind the page
            await anyio.lowlevel.checkpoint()
    assert (await counts.get())[0][Status.WORKING] == 2
    await store.close()
