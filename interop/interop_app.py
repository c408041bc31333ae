"""The interop matrix's restart fixture: two tasks and a short lease.

Served with ``keel serve --app interop_app:app`` (``interop/`` on ``PYTHONPATH``). The
driver SIGKILLs the server while ``long_step`` runs and ``ask`` waits for input, then
starts it again on the same store: the waiting task keeps its question, and the running
one is claimed again as soon as its one-second lease runs out (attempt 2), instead of the
conformance app's five seconds or the Bridge's thirty.

``pushed`` is the push cell's task: it tells its client to poll only once a minute
(``pollIntervalMs`` 60000) and changes three times within a second, so a client that
settles it in time, without a ``tasks/get``, followed Keel's ``notifications/tasks``.
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


@app.task("pushed", poll_interval=60.0, max_attempts=1)
async def pushed(ctx: TaskContext, steps: int = 2, seconds: float = 0.3) -> str:
    """Report each of `steps` steps, `seconds` apart, then finish."""
    for step in range(1, steps + 1):
        await anyio.sleep(seconds)
        await ctx.status(f"step {step} of {steps}")
    return f"pushed done after {steps} steps"
