"""The MCP server of a Keel app, as ``keel serve`` builds it (the Bridge, ``--app``) and
the conformance app: one place, so that every one of them says who it is the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mcp.server import MCPServer

import keel
from keel.mcp.server import TasksExtension, keel_lifespan
from keel.mcp.state_key import request_state_security
from keel.runtime import Keel

__all__ = ["app_server"]


def app_server(
    app: Keel,
    name: str,
    *,
    rate_limit_polls: bool = False,
    concurrency: int = 4,
    run_workers: bool = True,
    state_dir: Path | None = None,
) -> MCPServer[Any]:
    """An ``MCPServer`` named ``name`` serving ``app``'s tasks through the tasks extension
    (and the 2025-11-25 tasks protocol, :mod:`keel.mcp.v2025`), with ``concurrency``
    workers in its lifespan (none unless ``run_workers``); its ``serverInfo.version`` is
    Keel's version. Plain tools may be added to it.

    ``state_dir`` keeps the key that seals ``requestState`` (see ``keel.mcp.state_key``),
    so a client asked for input before a restart can still answer after it; without one
    the key lives in this process only.

    Raises:
        ConfigurationError: the request-state key cannot be read or is too short.
    """
    tasks = TasksExtension(app, rate_limit_polls=rate_limit_polls)
    return MCPServer(
        name,
        version=keel.__version__,
        request_state_security=request_state_security(state_dir),
        extensions=[tasks],
        middleware=[tasks.middleware()],  # the 2025-11-25 tasks protocol on the same tasks
        lifespan=keel_lifespan(app, concurrency=concurrency, run_workers=run_workers),
    )
