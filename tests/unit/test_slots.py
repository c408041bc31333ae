"""Handler slots (:class:`keel.runtime.slots.Slots`): first come, first served, and a slot
is never lost to a waiter cancelled just as it was handed over."""

from __future__ import annotations

import asyncio

import pytest

from keel.runtime.slots import Slots

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # Slots is built on asyncio futures, as the worker is


async def test_free_slots_are_taken_at_once_then_waiters_are_served_in_order() -> None:
    slots = Slots(2)
    assert [slots.try_take() for _ in range(3)] == [True, True, False]
    order: list[str] = []

    async def wait(name: str) -> None:
        await slots.take()
        order.append(name)

    first = asyncio.ensure_future(wait("first"))
    second = asyncio.ensure_future(wait("second"))
    await asyncio.sleep(0)
    assert (slots.waiting, order) == (2, [])
    slots.free()
    await first
    assert (order, slots.taken) == (["first"], 2)
    slots.free()
    await second
    assert (order, slots.taken) == (["first", "second"], 2)
    slots.free()
    slots.free()
    assert slots.taken == 0
    assert slots.try_take()


async def test_a_cancelled_waiter_is_skipped() -> None:
    slots = Slots(1)
    assert slots.try_take()
    gone = asyncio.ensure_future(slots.take())
    kept = asyncio.ensure_future(slots.take())
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.sleep(0)
    slots.free()
    await kept
    assert gone.cancelled()
    assert slots.taken == 1


async def test_a_waiter_cancelled_after_the_handover_passes_its_slot_on() -> None:
    slots = Slots(1)
    assert slots.try_take()
    first = asyncio.ensure_future(slots.take())
    second = asyncio.ensure_future(slots.take())
    await asyncio.sleep(0)
    slots.free()  # the slot is first's now, but first has not run yet...
    first.cancel()  # ...and is cancelled before it does
    with pytest.raises(asyncio.CancelledError):
        await first
    await second  # it got the slot first gave up
    assert (slots.taken, slots.waiting) == (1, 0)
    slots.free()
    assert slots.taken == 0
