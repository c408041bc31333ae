"""The interop matrix's restart fixture: two tasks and a short lease.

Served with ``keel serve --app interop_app:app`` (``interop/`` on ``PYTHONPATH``). The
driver SIGKILLs the server while ``long_step`` runs and ``ask`` waits for input, then
starts it again on the same store: the waiting task keeps its question, and the running
one is claimed again as soon as its one-second lease runs out (attempt 2), instead of the
conformance app's five seconds or the Bridge's thirty.
"""

from __future__ import annotations

import anyio

from keel.runtime import Keel, TaskContext

app = Keel()

LEASE = 1.0  # renewed every third of a second while the handler runs

CONFIRM = {
    "type": "object",
    "properties": {"confirm": {"type": "boolean", "description": "Go on?"}},
    "required": ["confirm"],
}


@app.task("long_step", poll_interval=0.2, lease_seconds=LEASE, max_attempts=3)
async def long_step(ctx: TaskContext, seconds: float = 2.0) -> str:
    """Report that it started, sleep `seconds`, then finish (safe to run again)."""
    await ctx.status("started")
    await anyio.sleep(seconds)
    return f"long_step done after {seconds:g}s"


@app.task("ask", poll_interval=0.2, lease_seconds=LEASE, max_attempts=3)
async def ask(ctx: TaskContext) -> str:
    """Ask for a confirmation, then finish with the answer."""
    answer = await ctx.elicit("Go on?", CONFIRM, key="confirm")
    return f"ask answered confirm={answer.get('confirm')}"
