"""Plain (non-task) tools refuse an argument they do not take, as task tools do:
``-32602`` naming it and the arguments the tool takes, on both protocol generations,
and the tool does not run; the arguments it takes still work, and a task tool keeps its
own check (``Keel.submit``). The SDK alone would drop the argument unseen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp.server import MCPServer
from mcp.server.mcpserver import Context

from keel.mcp.client_v2025 import LegacyClient, RpcError
from keel.mcp.serving import app_server
from keel.runtime import Keel
from keel.store import SqliteStore
from tasks_extension.support import WAIT, build_app, post, serve_http

pytestmark = pytest.mark.anyio


def _server(tmp_path: Path, ran: list[dict[str, Any]]) -> MCPServer[Any]:
    server = app_server(
        build_app(Keel(SqliteStore(tmp_path / "keel.db"))), "plain", run_workers=False
    )

    @server.tool()
    def greet(name: str, ctx: Context, punctuation: str = "!") -> str:
        """Say hello (the context is no argument a client sends)."""
        ran.append({"name": name, "punctuation": punctuation})
        return f"Hello, {name}{punctuation}"

    return server


async def test_an_unknown_argument_of_a_plain_tool_is_refused_by_name(tmp_path: Path) -> None:
    ran: list[dict[str, Any]] = []
    async with serve_http(_server(tmp_path, ran)) as url:
        refused = await post(
            url, "tools/call", {"name": "greet", "arguments": {"name": "Ann", "bogus": 1}}
        )
        assert refused.error["code"] == -32602
        assert refused.error["message"] == (
            "arguments.bogus: tool 'greet' takes no argument 'bogus' (it takes: name, punctuation)"
        )
        async with LegacyClient(url, timeout=WAIT) as legacy:
            with pytest.raises(RpcError) as info:
                await legacy.request("tools/call", {"name": "greet", "arguments": {"nmae": "Ann"}})
        assert info.value.code == -32602
        assert info.value.error["message"].startswith("arguments.nmae: tool 'greet' takes no")
        assert ran == []
        # What it takes still works, and a task tool keeps its own check.
        done = await post(url, "tools/call", {"name": "greet", "arguments": {"name": "Ann"}})
        assert done.result["content"][0]["text"] == "Hello, Ann!"
        task = await post(url, "tools/call", {"name": "quick", "arguments": {"n": 1, "x": 2}})
        assert task.error["code"] == -32602
        assert task.error["message"].startswith("arguments.x: task 'quick' takes no argument 'x'")
    assert ran == [{"name": "Ann", "punctuation": "!"}]
