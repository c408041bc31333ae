"""Acceptance: a ``keel worker`` imports what it runs, not what other commands need.

Its start-up is counted in every worker process a deployment (or bench/pg_bench.py)
starts (issue 19): no pydantic (a task's argument schema is built when a task is
submitted, and a worker submits none), no prometheus_client (without --metrics-port
nothing reads the metrics), no other command's module, no MCP layer. And what it built
to start is frozen out of the garbage collector's sight, and the youngest generation
collected less often (``settle_heap``), so that collections do not scan it again and
again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from keel.cli.common import YOUNG_COLLECTION
from keel.model import Status, Task
from keel.store import SqliteStore

from .apps.harness import WorkerProcess, eventually, fleet, worker_env

pytestmark = pytest.mark.slow  # a real keel worker process

NOT_NEEDED = {"pydantic", "prometheus_client", "keel.cli.serve", "keel.cli.tasks", "keel.mcp"}


@pytest.mark.anyio
async def test_a_worker_that_ran_a_task_imported_nothing_it_does_not_need(
    tmp_path: Path,
) -> None:
    """The task records ``sys.modules`` from inside the worker, after its claim and start."""
    db, out = tmp_path / "keel.db", tmp_path / "modules.json"
    store = SqliteStore(db)
    try:
        task = await store.create(name="modules", arguments={"out": str(out)})
        with fleet() as workers:
            worker = WorkerProcess(
                store=db,
                worker_id="w1",
                logs=tmp_path,
                env=worker_env(tmp_path / "effects.jsonl"),
                app="modules_app:app",
            )
            workers.append(worker)

            async def done() -> Task | None:
                got = await store.get(task.task_id)
                return got if got.status is Status.COMPLETED else None

            await eventually(done, within=60.0, what="the modules task completed")
            assert worker.terminate() == 0, worker.output()
    finally:
        await store.close()
    seen = json.loads(out.read_text())
    imported = set(seen["modules"])
    assert seen["frozen"] > 10_000  # the modules, the app and the store, at the least
    assert seen["threshold"][0] == YOUNG_COLLECTION
    assert "keel.cli.worker" in imported
    assert {m for m in imported if m.partition(".")[0] in NOT_NEEDED or m in NOT_NEEDED} == set()
