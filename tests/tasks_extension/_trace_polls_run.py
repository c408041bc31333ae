"""Run by test_trace_polls.py in a process of its own (it sets the global tracer
provider, which OpenTelemetry allows once per process): an in-memory MCP server and
client, a task created, polled until it completed; every finished span printed as JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

from mcp import Client  # noqa: E402 - after the provider, as an instrumented process does

from keel.mcp.client import TasksClientExtension, get_task  # noqa: E402
from keel.mcp.serving import app_server  # noqa: E402
from keel.runtime import Keel, TaskContext  # noqa: E402
from keel.store import SqliteStore  # noqa: E402

folder = Path(sys.argv[1])
app = Keel(SqliteStore(folder / "keel.db"))


@app.task("slow", max_attempts=1)
async def slow(ctx: TaskContext) -> str:
    """Take a moment, so that it is polled while it runs."""
    await anyio.sleep(0.3)
    return "done"


async def main() -> str:
    server = app_server(app, "trace-polls", state_dir=folder)
    async with Client(server, extensions=[TasksClientExtension()]) as client:
        created = await client.session.call_tool("slow", {}, allow_claimed=True)
        with anyio.fail_after(30):
            while True:  # a client polls: that is what is traced here
                if (await get_task(client, created.task_id)).status == "completed":
                    break
                await anyio.sleep(0.05)
    return str(created.task_id)


task_id = anyio.run(main)
spans = [
    {
        "name": s.name,
        "trace": format(s.context.trace_id, "032x"),
        "span": format(s.context.span_id, "016x"),
        "parent": None if s.parent is None else format(s.parent.span_id, "016x"),
        "task": (s.attributes or {}).get("mcp.task.id"),
    }
    for s in exporter.get_finished_spans()
]
print(json.dumps({"task_id": task_id, "spans": spans}))
