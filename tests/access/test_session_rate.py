"""The rate of new old-protocol sessions (issue 15: an ``initialize`` flood must not slow
current-protocol clients), on a real server on 127.0.0.1 (through ``keel serve`` itself:
``test_serve_process.py``): requests that would open a
2025-11-25 session over the rate wait their turn in order, those beyond the queue are
refused at once (503, ``SESSIONS_FULL`` naming ``--session-queue``, ``retryAfterMs``,
``Retry-After``), while 2026-07-28 requests and an existing session's requests are
answered at once; a refusal changes nothing in the store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from access.support import WAIT, ManualClock, Raw, raw, serve_guarded
from keel.mcp.access import HttpAccess
from keel.mcp.admission import SessionGate, SessionRate
from keel.mcp.serving import app_server
from keel.mcp.wire import SESSIONS_FULL
from keel.runtime import Keel
from keel.store import SqliteStore
from tasks_extension.support import build_app, poll, post

pytestmark = pytest.mark.anyio

SESSION = "mcp-session-id"
V2025 = {"MCP-Protocol-Version": "2025-11-25"}
PING = {"jsonrpc": "2.0", "id": 2, "method": "ping", "params": {}}


async def until(condition: Any) -> None:
    """Until ``condition()`` holds (bounded): the server runs in this event loop, but
    the requests cross a socket, so there is no event to wait on."""
    with anyio.fail_after(WAIT):
        while not condition():  # noqa: ASYNC110
            await anyio.sleep(0.01)


def check_refusal(refused: Raw, setting: str) -> None:
    assert refused.status == 503, refused
    error = refused.json["error"]
    assert error["code"] == SESSIONS_FULL
    assert setting in error["message"]
    assert "2026-07-28" in error["message"]
    assert error["data"]["retryAfterMs"] >= 1000
    assert int(refused.headers["retry-after"]) * 1000 == error["data"]["retryAfterMs"]


async def test_a_burst_over_the_rate_waits_its_turn(tmp_path: Path) -> None:
    """Rate 1/s, burst 1, queue 2, on a clock the test moves: the first initialize is
    answered at once; the next two wait, in order; a fourth is refused at once, unread,
    and the store is as it was. Meanwhile a 2026-07-28 ``tools/call`` and
    ``tasks/get`` and the first session's ``ping`` are answered. Each second of the
    clock lets one waiting session open."""
    app = build_app(Keel(SqliteStore(tmp_path / "keel.db")))
    clock = ManualClock()
    gate = SessionGate(SessionRate(rate=1.0, burst=1, queue=2, openings=8), clock)
    opened: list[tuple[int, Raw]] = []

    async def opening(n: int) -> None:
        opened.append((n, await raw(url)))

    async with serve_guarded(app_server(app, "rate-tests", state_dir=tmp_path), gate=gate) as url:
        first = await raw(url)
        async with anyio.create_task_group() as tg:
            tg.start_soon(opening, 2)
            await until(lambda: gate.waiting == 1)
            tg.start_soon(opening, 3)
            await until(lambda: gate.waiting == 2)
            before = await app.store.list(limit=100)
            refused = await raw(url)
            after = await app.store.list(limit=100)
            created = await post(url, "tools/call", {"name": "quick", "arguments": {"n": 2}})
            task = await poll(url, created.result["taskId"], "completed")
            ping = await raw(url, body=PING, headers={SESSION: first.headers[SESSION], **V2025})
            assert opened == []  # still waiting through all of that
            clock.advance(1.0)
            await until(lambda: len(opened) == 1)
            clock.advance(1.0)
    assert first.status == 200, first
    check_refusal(refused, "--session-queue")
    assert "2 requests are already waiting" in refused.json["error"]["message"]
    assert before == after
    assert task["result"]["structuredContent"] == {"n": 4}
    assert ping.status == 200, ping
    assert [n for n, _ in opened] == [2, 3]
    assert all(answer.status == 200 for _, answer in opened), opened
    sessions = {first.headers[SESSION], *(answer.headers[SESSION] for _, answer in opened)}
    assert len(sessions) == 3


async def test_a_full_session_limit_is_refused_without_the_sdk_for_a_second(
    tmp_path: Path,
) -> None:
    """Room for one session: the SDK refuses the second (-32052 naming
    --max-sessions); for the next second of the gate's clock the gate refuses in its
    place, with the same answer, even once the first session has ended (the SDK is not
    asked); after it, the SDK is asked again and opens one."""
    app = build_app(Keel(SqliteStore(tmp_path / "keel.db")))
    clock = ManualClock()
    gate = SessionGate(SessionRate(rate=1.0, burst=10, queue=10, openings=8), clock)
    access = HttpAccess.for_bind("127.0.0.1", 0, max_sessions=1)
    server = app_server(app, "rate-tests", state_dir=tmp_path)
    async with serve_guarded(server, access, gate=gate) as url:
        first = await raw(url)
        by_sdk = await raw(url)
        ended = await raw(
            url, method="DELETE", body=None, headers={SESSION: first.headers[SESSION], **V2025}
        )
        by_gate = await raw(url)
        clock.advance(1.0)
        room = await raw(url)
    assert first.status == 200, first
    assert ended.status == 200, ended
    assert by_sdk.status == 503, by_sdk
    assert "(keel serve --max-sessions)" in by_sdk.json["error"]["message"]
    assert (by_gate.status, by_gate.text) == (by_sdk.status, by_sdk.text)
    assert room.status == 200, room
