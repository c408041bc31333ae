"""The client's record of what a listen stream pushed (``keel.mcp.client._Inbox``): the
state it follows is never older than one it has seen, and terminal is absorbing (SDK
notification bindings may deliver out of order)."""

from __future__ import annotations

import anyio
import pytest

from keel.mcp.client import Detailed, _Inbox

pytestmark = pytest.mark.anyio


def task(status: str, at: str) -> Detailed:
    return Detailed.model_validate(
        {"taskId": "t1", "status": status, "lastUpdatedAt": f"2026-12-03T10:00:{at}Z"}
    )


async def test_an_older_pushed_state_is_not_followed() -> None:
    """A state pushed after a newer one was seen (pushed or polled) is ignored."""
    inbox = _Inbox()
    inbox.seen(task("input_required", "02.000"))
    inbox.push(task("working", "01.000"))
    assert await inbox.next(0) is None
    inbox.push(task("working", "03.000"))
    followed = await inbox.next(0)
    assert followed is not None
    assert followed.status == "working"


async def test_terminal_is_absorbing() -> None:
    """After a terminal state, nothing pushed later is followed, whatever its stamp."""
    inbox = _Inbox()
    inbox.push(task("completed", "05.000"))
    first = await inbox.next(0)
    assert first is not None
    assert first.status == "completed"
    inbox.push(task("working", "09.000"))
    assert await inbox.next(0) is None


async def test_a_dropped_stream_asks_for_a_poll_at_once() -> None:
    """A stream that drops wakes the resolution at once (None: poll now), and the inbox
    is no longer live (polls come at pollIntervalMs again)."""
    inbox = _Inbox()
    inbox.push(task("working", "01.000"))
    assert await inbox.next(0) is not None
    assert inbox.live
    inbox.dropped()
    with anyio.fail_after(5):
        assert await inbox.next(60) is None
    assert not inbox.live
