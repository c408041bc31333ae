"""The access settings through the real ``keel serve`` process (issue 15, part 4): a
token file made with ``keel auth add-token``, the server started with ``--auth
tokens:FILE`` and allow-lists from keel.toml, asked over raw HTTP."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from access.support import raw
from keel_serve import KEEL, KeelServe

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_keel_serve_with_a_token_file(tmp_path: Path) -> None:
    """``keel auth add-token ops`` then ``keel serve --auth tokens:FILE``: no token 401,
    the token 200, a foreign Host 421; ``keel auth revoke`` refuses it on the next
    request of the running server."""
    env = {**os.environ, "KEEL_STORE": "", "KEEL_APP": "", "KEEL_AUTH": ""}
    tokens = tmp_path / "tokens.json"
    made = await anyio.run_process(
        [str(KEEL), "auth", "add-token", "ops", "--tokens", str(tokens)], env=env
    )
    token = made.stdout.decode().strip()
    (tmp_path / "keel.toml").write_text('[serve]\nallowed_hosts = ["mcp.example.com"]\n')
    server = KeelServe(
        [
            "--app",
            "conformance",
            "--data-dir",
            str(tmp_path / "data"),
            "--auth",
            f"tokens:{tokens}",
        ],
        cwd=tmp_path,
        env=env,
        log=tmp_path / "serve.log",
    )
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
