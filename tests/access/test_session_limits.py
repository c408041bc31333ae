"""Old-protocol session limits (issue 15, part 4): ``--max-sessions`` and
``--session-idle-timeout`` on a real server on 127.0.0.1. At the limit, a new
2025-11-25 session is refused with HTTP 503 and a JSON-RPC error that names the limit
(``SESSIONS_FULL``, ``retryAfterMs``, ``Retry-After``); open sessions and
current-protocol clients are unaffected; room comes back when a session ends or idles
out."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from access.support import ManualClock, build, raw, serve_guarded
from keel.mcp.access import HttpAccess
from keel.mcp.admission import FULL_RECHECK, SessionGate, SessionRate
from keel.mcp.wire import SESSIONS_FULL
from tasks_extension.support import post

pytestmark = pytest.mark.anyio

SESSION = "mcp-session-id"
V2025 = {"MCP-Protocol-Version": "2025-11-25"}


def limited(max_sessions: int, idle: float = 300.0) -> HttpAccess:
    return HttpAccess.for_bind("127.0.0.1", 0, max_sessions=max_sessions, session_idle_timeout=idle)


async def test_the_session_limit_refuses_clearly(tmp_path: Path) -> None:
    """With ``max_sessions=2``: two sessions open, the third is refused (503,
    SESSIONS_FULL naming --max-sessions, retryAfterMs, Retry-After); the open sessions
    still work, a 2026-07-28 call is served, and ending a session makes room (once the
    gate, which took the limit for full, asks the SDK again: a second later)."""
    clock = ManualClock()
    gate = SessionGate(SessionRate(), clock)
    async with serve_guarded(build(tmp_path), limited(2), gate=gate) as url:
        first, second = await raw(url), await raw(url)
        full = await raw(url)
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping", "params": {}}
        still = await raw(url, body=ping, headers={SESSION: first.headers[SESSION], **V2025})
        current = await post(url, "tools/call", {"name": "quick", "arguments": {"n": 1}})
        ended = await raw(
            url, method="DELETE", body=None, headers={SESSION: second.headers[SESSION], **V2025}
        )
        clock.advance(FULL_RECHECK)
        room = await raw(url)
    assert [first.status, second.status] == [200, 200]
    assert full.status == 503, full
    error = full.json["error"]
    assert error["code"] == SESSIONS_FULL
    assert "2 2025-11-25 sessions open" in error["message"]
    assert "--max-sessions" in error["message"]
    assert error["data"]["retryAfterMs"] > 0
    assert full.headers["retry-after"].isdigit()
    assert still.status == 200, still
    assert current.status == 200, current
    assert ended.status == 200, ended
    assert room.status == 200, room


async def test_an_idle_session_is_closed(tmp_path: Path) -> None:
    """With a 1 s idle timeout and room for one session: once the open session has sat
    idle, a new one is admitted and the old id answers 404 (the client must start
    over)."""
    async with serve_guarded(build(tmp_path), limited(1, idle=1.0)) as url:
        old = await raw(url)
        assert (await raw(url)).status == 503
        with anyio.fail_after(15):
            # The server reaps idle sessions on its own clock, which offers no event.
            while (new := await raw(url)).status == 503:  # noqa: ASYNC110
                await anyio.sleep(0.1)
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping", "params": {}}
        gone = await raw(url, body=ping, headers={SESSION: old.headers[SESSION], **V2025})
    assert new.status == 200, new
    assert gone.status == 404, gone
