"""A Keel app that the acceptance tests run in real ``keel worker`` processes.

    cd tests/acceptance/apps && keel worker --app steps_app:app --store /tmp/x.db

Its handlers leave evidence outside the store: every step function appends one JSON line
to ``$KEEL_TEST_EFFECTS`` (``O_APPEND``, one ``write``, then ``fsync``) naming the task,
the step, the attempt and fence that ran it, the worker, and a fresh nonce. The step
returns that same record, so the step result the store recorded says exactly which line
is the effect that counts; any other line for the same step is a duplicate execution.

Environment (inherited from the test that starts the worker):

* ``KEEL_TEST_EFFECTS``: the side-effect file (required by every task here);
* ``KEEL_TEST_LEASE``: lease seconds of every task (default 1.5; short, so that a killed
  worker's tasks are recovered quickly);
* ``KEEL_TEST_HOLD``: ``1`` makes ``step_then_hold`` wait, after its step, until stopped.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import time
from typing import Any

import anyio

from keel.runtime import Keel, TaskContext

LEASE = float(os.environ.get("KEEL_TEST_LEASE", "1.5"))  # seconds
MAX_ATTEMPTS = 1_000  # a task may be killed many times; it must never be dead-lettered here
SERVICE = {"type": "object", "required": ["service"], "properties": {"service": {"type": "string"}}}

app = Keel()  # the store is chosen by `keel worker --store`


def record_effect(ctx: TaskContext, step: str, **extra: Any) -> dict[str, Any]:
    """Append one side-effect line for ``step`` (fsynced before returning) and return it."""
    line = {
        "task": ctx.task_id,
        "step": step,
        "attempt": ctx.attempt,
        "fence": ctx.fence,
        "worker": ctx.worker,
        "pid": os.getpid(),
        "nonce": secrets.token_hex(8),
        "t": time.time(),
        **extra,
    }
    data = (json.dumps(line, sort_keys=True) + "\n").encode()
    fd = os.open(os.environ["KEEL_TEST_EFFECTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        # One write(2) on an O_APPEND file: the line lands whole, after every earlier one,
        # whichever process wrote those; a SIGKILL cannot tear it.
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return line


async def effect_step(ctx: TaskContext, step: str, work_ms: float) -> dict[str, Any]:
    """A step with its side effect in the middle of some work, as in real steps: a kill
    before the effect leaves no trace; a kill after it, before the result is recorded,
    leaves an effect that the next attempt repeats."""
    await anyio.sleep(work_ms / 2000)
    line = record_effect(ctx, step)
    await anyio.sleep(work_ms / 2000)
    return line


@app.task("multi_step", max_attempts=MAX_ATTEMPTS, lease_seconds=LEASE)
async def multi_step(ctx: TaskContext, steps: int = 4, work_ms: float = 6.0) -> dict[str, Any]:
    """Run ``steps`` checkpointed steps; return the nonce of each step's recorded effect."""
    nonces = []
    for n in range(steps):
        line = await ctx.step(f"step-{n}", effect_step, ctx, f"step-{n}", work_ms)
        nonces.append(line["nonce"])
    return {"nonces": nonces, "attempt": ctx.attempt, "fence": ctx.fence}


@app.task("ask", max_attempts=MAX_ATTEMPTS, lease_seconds=LEASE)
async def ask(ctx: TaskContext, topic: str) -> dict[str, Any]:
    """A step, then a question to the user (the task parks), then a step using the answer."""
    before = await ctx.step("before", record_effect, ctx, "before")
    answer = await ctx.elicit(f"Which service is behind {topic}?", SERVICE)
    service = answer["service"]
    after = await ctx.step("after", functools.partial(record_effect, ctx, "after", service=service))
    return {"service": service, "before": before["nonce"], "after": after["nonce"]}


@app.task("hold", max_attempts=MAX_ATTEMPTS, lease_seconds=LEASE)
async def hold(ctx: TaskContext) -> None:
    """Record that it started, then wait until stopped; record the stop in ``finally``."""
    record_effect(ctx, "started")
    try:
        await anyio.sleep_forever()
    finally:
        record_effect(ctx, "finally")


@app.task("step_then_hold", max_attempts=MAX_ATTEMPTS, lease_seconds=LEASE)
async def step_then_hold(ctx: TaskContext) -> dict[str, Any]:
    """Record step ``first``; then, in a process started with ``KEEL_TEST_HOLD=1``, wait
    until stopped; anywhere else return at once. What a stopped process gives back,
    another one finishes, from its recorded step."""
    first = await ctx.step("first", record_effect, ctx, "first")
    if os.environ.get("KEEL_TEST_HOLD") == "1":
        record_effect(ctx, "holding")
        await anyio.sleep_forever()
    return {"first": first["nonce"], "fence": ctx.fence}
