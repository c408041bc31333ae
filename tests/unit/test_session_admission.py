"""The admission of new old-protocol sessions (:mod:`keel.mcp.admission`), without a
server: which requests would open a session, the token bucket, and the gate's queue and
openings bound on a manual clock."""

from __future__ import annotations

import anyio
import pytest
from anyio import wait_all_tasks_blocked

from access.support import ManualClock
from keel.mcp.admission import (
    FULL_RECHECK,
    SessionGate,
    SessionRate,
    TokenBucket,
    opens_session,
)

pytestmark = pytest.mark.anyio


def scope(*headers: tuple[str, str]) -> dict[str, object]:
    return {
        "type": "http",
        "path": "/mcp",
        "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers],
    }


@pytest.mark.parametrize(
    ("headers", "opens"),
    [
        ((), True),  # an old client's initialize sends no version header
        ((("mcp-protocol-version", "2025-11-25"),), True),
        ((("mcp-protocol-version", "2024-11-05"),), True),
        ((("mcp-protocol-version", "2026-07-28"),), False),  # sessionless
        ((("mcp-protocol-version", "not-a-version"),), False),  # the SDK's modern entry
        ((("mcp-session-id", "abc"),), False),
        ((("mcp-session-id", ""),), False),  # present, however empty: not a new session
        ((("mcp-protocol-version", "2025-11-25"), ("mcp-session-id", "abc")), False),
        # The SDK reads the first version header only.
        ((("mcp-protocol-version", "2026-07-28"), ("mcp-protocol-version", "2025-11-25")), False),
        ((("mcp-protocol-version", "2025-11-25"), ("mcp-protocol-version", "2026-07-28")), True),
    ],
)
def test_opens_session_reads_the_headers_as_the_sdk_does(
    headers: tuple[tuple[str, str], ...], opens: bool
) -> None:
    """A request opens a session when it has no ``Mcp-Session-Id`` and its first
    ``MCP-Protocol-Version`` is absent or a handshake version; a 2026-07-28 request
    never does."""
    assert opens_session(scope(*headers)) is opens


def test_the_bucket_starts_full_and_refills_at_the_rate() -> None:
    """``burst`` tokens at once, then one per ``1/rate`` seconds, never more than
    ``burst`` kept however long it stays unused."""
    bucket = TokenBucket(rate=2.0, burst=3, now=0.0)
    assert [bucket.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(0.0) == pytest.approx(0.5)  # nothing taken
    assert bucket.take(0.25) == pytest.approx(0.25)
    assert bucket.take(0.5) == 0.0
    assert bucket.take(100.0) == 0.0  # refilled to 3, not 200
    assert [bucket.take(100.0) for _ in range(3)] == [0.0, 0.0, pytest.approx(0.5)]


async def test_the_gate_queues_in_order_and_refuses_beyond_the_queue() -> None:
    """Rate 1/s, burst 1, queue 2: the first enters at once, the next two wait in
    order of arrival, a fourth is refused at once; each second lets one more in."""
    clock = ManualClock()
    gate = SessionGate(SessionRate(rate=1.0, burst=1, queue=2, openings=8), clock)
    assert await gate.enter()
    entered: list[int] = []

    async def enter(n: int) -> None:
        assert await gate.enter()
        entered.append(n)

    async with anyio.create_task_group() as tg:
        tg.start_soon(enter, 2)
        await wait_all_tasks_blocked()
        tg.start_soon(enter, 3)
        await wait_all_tasks_blocked()
        assert gate.waiting == 2
        assert not await gate.enter()  # beyond the queue: at once
        clock.advance(1.0)
        await wait_all_tasks_blocked()
        assert entered == [2]
        clock.advance(1.0)
    assert entered == [2, 3]
    assert (gate.waiting, gate.in_progress) == (0, 3)


async def test_the_gate_bounds_openings_in_progress() -> None:
    """With tokens to spare and room for one opening: the second waits until the first
    is answered."""
    gate = SessionGate(SessionRate(rate=1.0, burst=5, queue=5, openings=1), ManualClock())
    assert await gate.enter()
    entered = anyio.Event()

    async def second() -> None:
        assert await gate.enter()
        entered.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(second)
        await wait_all_tasks_blocked()
        assert not entered.is_set()
        gate.leave()
    assert gate.in_progress == 1


async def test_a_request_that_stops_waiting_gives_its_place_back() -> None:
    """A waiter cancelled (its connection gone, the server stopping) leaves the queue
    and the openings as they were; no zero queue lets anyone wait."""
    clock = ManualClock()
    gate = SessionGate(SessionRate(rate=1.0, burst=1, queue=1, openings=1), clock)
    assert await gate.enter()
    gate.leave()
    async with anyio.create_task_group() as tg:
        tg.start_soon(gate.enter)
        await wait_all_tasks_blocked()
        assert gate.waiting == 1
        tg.cancel_scope.cancel()
    assert gate.waiting == 0
    clock.advance(1.0)
    assert await gate.enter()  # the opening place was given back
    none_wait = SessionGate(SessionRate(rate=1.0, burst=1, queue=0, openings=1), clock)
    assert await none_wait.enter()
    assert not await none_wait.enter()


def test_a_limit_found_full_is_taken_as_full_for_a_while() -> None:
    """After the SDK refused a session at the limit, the gate takes the limit as full
    for FULL_RECHECK seconds of its clock, then asks the SDK again."""
    clock = ManualClock()
    gate = SessionGate(SessionRate(), clock)
    assert not gate.full
    gate.found_full()
    assert gate.full
    clock.advance(FULL_RECHECK / 2)
    assert gate.full
    clock.advance(FULL_RECHECK / 2)
    assert not gate.full
