"""A Keel app that ``keel serve`` runs for the console's process and browser tests.

    cd tests/ops/apps && keel serve --app console_app:app --store /tmp/x.db

``approve`` asks a person (its input request has a string enum, an integer and a
boolean, as an operator's form shows them) and returns the answer; ``spin`` says it is
spinning and runs until it is cancelled; ``flaky`` records a step, then fails (its only
attempt: dead-lettered) while the file ``blocker`` exists, else completes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from keel.runtime import Keel, TaskContext

APPROVAL = {
    "type": "object",
    "properties": {
        "decision": {"type": "string", "title": "Decision", "enum": ["approve", "reject"]},
        "replicas": {"type": "integer", "title": "Replicas", "minimum": 1, "maximum": 9},
        "page_oncall": {"type": "boolean", "title": "Page the on-call"},
    },
    "required": ["decision", "replicas"],
}

app = Keel()  # the store is chosen by `keel serve --store`


@app.task("approve", lease_seconds=30)
async def approve(ctx: TaskContext, change: str) -> dict[str, Any]:
    """Ask whether to roll out ``change`` and with how many replicas; return the answer."""
    await ctx.status(f"waiting for a decision on {change}")
    answer = await ctx.elicit(f"Roll out {change}?", APPROVAL, key="approval")
    return {"change": change, **answer}


@app.task("spin", lease_seconds=30)
async def spin(ctx: TaskContext) -> None:
    """Run until cancelled."""
    await ctx.status("spinning")
    await anyio.sleep_forever()


def _prepare(blocker: str) -> dict[str, Any]:
    return {"prepared_for": blocker}


@app.task("flaky", lease_seconds=30, max_attempts=1)
async def flaky(ctx: TaskContext, blocker: str) -> dict[str, Any]:
    """Record step ``prepare``; fail while ``blocker`` exists, else return the step."""
    prepared = await ctx.step("prepare", _prepare, blocker)
    if await anyio.Path(blocker).exists():
        raise RuntimeError(f"blocked by {Path(blocker).name}")
    return {"prepared": prepared, "attempt": ctx.attempt}
