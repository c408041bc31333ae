"""The Keel side of ``bench/mcp_bench.py``: one no-op task, served by ``keel serve``.

``keel serve --app apps.noop_app:app --store bench.db`` (run from ``bench/``) exposes it
as the tool ``noop``; what is measured is everything around the handler: the durable
create (SQLite, ``synchronous=full``), the in-process worker's claim / run / complete,
and ``tasks/get``.
"""

from __future__ import annotations

from keel.runtime import Keel, TaskContext

POLL_INTERVAL = 0.01  # seconds, advertised as pollIntervalMs (the bench polls at 10 ms anyway)

app = Keel()  # the store is given by `keel serve --store`


@app.task("noop", poll_interval=POLL_INTERVAL, description="Do nothing, as a task.")
async def noop(ctx: TaskContext) -> None:
    """Nothing: the benchmark measures the task machinery around it."""
