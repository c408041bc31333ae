"""The access settings through the real ``keel serve`` process (issue 15, part 4): a
token file made with ``keel auth add-token``, the server started with ``--auth
tokens:FILE`` and allow-lists from keel.toml, asked over raw HTTP."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from access.support import raw
from keel.mcp.wire import SESSIONS_FULL
from keel_serve import KEEL, KeelServe
from tasks_extension.support import post

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SESSION = "mcp-session-id"
V2025 = {"MCP-Protocol-Version": "2025-11-25"}
PING = {"jsonrpc": "2.0", "id": 2, "method": "ping", "params": {}}


def clean_env() -> dict[str, str]:
    """This environment without the settings a developer's shell may carry."""
    return {**os.environ, "KEEL_STORE": "", "KEEL_APP": "", "KEEL_AUTH": ""}


def conformance_server(folder: Path, *args: str) -> KeelServe:
    """``keel serve --app conformance ARGS`` run from ``folder`` (its keel.toml)."""
    return KeelServe(
        ["--app", "conformance", "--data-dir", str(folder / "data"), *args],
        cwd=folder,
        env=clean_env(),
        log=folder / "serve.log",
    )


async def test_keel_serve_with_a_token_file(tmp_path: Path) -> None:
    """``keel auth add-token ops`` then ``keel serve --auth tokens:FILE``: no token 401,
    the token 200, a foreign Host 421; ``keel auth revoke`` refuses it on the next
    request of the running server."""
    env = clean_env()
    tokens = tmp_path / "tokens.json"
    made = await anyio.run_process(
        [str(KEEL), "auth", "add-token", "ops", "--tokens", str(tokens)], env=env
    )
    token = made.stdout.decode().strip()
    (tmp_path / "keel.toml").write_text('[serve]\nallowed_hosts = ["mcp.example.com"]\n')
    server = conformance_server(tmp_path, "--auth", f"tokens:{tokens}")
    server.start()
    try:
        await server.ready()
        bearer = {"Authorization": f"Bearer {token}"}
        missing = await raw(server.url)
        good = await raw(server.url, headers=bearer)
        proxied = await raw(server.url, headers={**bearer, "Host": "mcp.example.com"})
        foreign = await raw(server.url, headers={**bearer, "Host": "evil.example"})
        await anyio.run_process(
            [str(KEEL), "auth", "revoke", "ops", "--tokens", str(tokens)], env=env
        )
        revoked = await raw(server.url, headers=bearer)
    finally:
        assert server.stop() == 0, server.output()
    assert missing.status == 401, missing
    assert good.status == 200, good
    assert proxied.status == 200, proxied
    assert foreign.status == 421, foreign
    assert revoked.status == 401, revoked
    assert "auth:    bearer tokens of" in server.output()


async def test_keel_serve_refuses_sessions_over_its_rate(tmp_path: Path) -> None:
    """``keel serve --session-burst 2 --session-queue 0`` and ``session_rate = 0.01`` in
    keel.toml: two 2025-11-25 sessions open, a third is refused at once (503,
    ``SESSIONS_FULL`` naming the settings, ``Retry-After``), while the open session and
    a 2026-07-28 client are served; the startup message shows the limits."""
    (tmp_path / "keel.toml").write_text("[serve]\nsession_rate = 0.01\n")
    server = conformance_server(tmp_path, "--session-burst", "2", "--session-queue", "0")
    server.start()
    try:
        await server.ready()
        first, second, third = await raw(server.url), await raw(server.url), await raw(server.url)
        listed = await post(server.url, "tools/list")
        ping = await raw(server.url, body=PING, headers={SESSION: first.headers[SESSION], **V2025})
    finally:
        assert server.stop() == 0, server.output()
    assert [first.status, second.status] == [200, 200]
    assert third.status == 503, third
    error = third.json["error"]
    assert error["code"] == SESSIONS_FULL
    assert "none may wait (keel serve --session-queue)" in error["message"]
    assert "0.01 a second (--session-rate)" in error["message"]
    assert error["data"]["retryAfterMs"] >= 1000
    assert third.headers["retry-after"].isdigit()
    assert listed.status == 200, listed
    assert ping.status == 200, ping
    assert "new 2025-11-25 sessions: 0.01 a second (bursts of 2)" in server.output()
