"""The MCP server of a Keel app, as ``keel serve`` builds it (the Bridge, ``--app``) and
the conformance app: one place, so that every one of them says who it is the same way.
"""

from __future__ import annotations

from typing import Any

from mcp.server import MCPServer

import keel
from keel.mcp.server import TasksExtension, keel_lifespan
from keel.runtime import Keel

__all__ = ["app_server"]


def app_server(
    app: Keel,
    name: str,
    *,
    rate_limit_polls: bool = False,
    concurrency: int = 4,
    run_workers: bool = True,
) -> MCPServer[Any]:
    """An ``MCPServer`` named ``name`` serving ``app``'s tasks through the tasks extension,
    with ``concurrency`` workers in its lifespan (none unless ``run_workers``); its
    ``serverInfo.version`` is Keel's version. Plain tools may be added to it."""
    return MCPServer(
        name,
        version=keel.__version__,
        extensions=[TasksExtension(app, rate_limit_polls=rate_limit_polls)],
        lifespan=keel_lifespan(app, concurrency=concurrency, run_workers=run_workers),
    )
