"""The FastMCP side of ``bench/mcp_bench.py``: FastMCP 4 + fastmcp-tasks on Redis.

Run with the benchmark's own virtual environment (``fastmcp==4.1.4``,
``fastmcp-tasks==4.1.4``; never one of Keel's dependencies), never with Keel's::

    ~/.cache/keel-bench/fastmcp-venv/bin/python bench/peers/fastmcp_server.py \
        --port 8765 --redis redis://127.0.0.1:6379/9

It is the configuration of ``shared/reference/fastmcp-anchor.md``: one uvicorn process
serving ``/mcp`` with the Docket worker inside it (``concurrency`` 10, the default), a
no-op tool that runs as a task when the client declares ``io.modelcontextprotocol/tasks``
(``TaskConfig(mode="optional")``, FastMCP's default poll interval). It prints
``fastmcp-bench ready`` on stderr once Docket's lifespan has started.

This file imports nothing from Keel (it runs in another interpreter) and is excluded from
Keel's type checking; ruff still lints it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastmcp import FastMCP
from fastmcp.utilities.tasks import TaskConfig
from fastmcp_tasks import TasksExtension


def build(redis_url: str, concurrency: int) -> FastMCP[Any]:
    @asynccontextmanager
    async def announce(_server: FastMCP[Any]) -> AsyncIterator[None]:
        print("fastmcp-bench ready", file=sys.stderr, flush=True)
        yield

    mcp: FastMCP[Any] = FastMCP("fastmcp-bench", lifespan=announce)
    mcp.add_extension(TasksExtension(url=redis_url, concurrency=concurrency))

    @mcp.tool(task=TaskConfig(mode="optional"))
    async def noop() -> None:
        """Do nothing, as a task."""

    return mcp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/9", help="Docket backend URL")
    parser.add_argument("--concurrency", type=int, default=10, help="Docket worker concurrency")
    args = parser.parse_args()
    app = build(args.redis, args.concurrency).http_app(path="/mcp")
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
