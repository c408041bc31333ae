"""The Keel app of the PostgreSQL scale-out tests (``tests/pg_scale``), run in real
``keel worker`` and ``keel serve --no-worker`` processes:

    cd tests/acceptance/apps && keel worker --app pg_scale_app:app --store postgresql://…

Like ``steps_app``, its handlers leave evidence outside the store: each step appends one
JSON line to ``$KEEL_TEST_EFFECTS`` naming the task, the step, the attempt and fence that
ran it, the worker and a fresh nonce, and returns that line; the store's record of the
step then says which line is the effect that counts, and any other line for the same
step is a second execution. Lines are written with one ``write(2)`` on an ``O_APPEND``
file: a SIGKILL cannot tear or lose one (the kernel has it), so there is no ``fsync``
here — these tests kill processes, not the machine, and thousands of tasks must fit in
a few minutes.

Environment (inherited from the test that starts the process):

* ``KEEL_TEST_EFFECTS``: the side-effect file (required by every task here);
* ``KEEL_TEST_LEASE``: lease seconds of every task (default 1.5).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from typing import Any

import anyio

from keel.runtime import Keel, TaskContext

LEASE = float(os.environ.get("KEEL_TEST_LEASE", "1.5"))  # seconds
MAX_ATTEMPTS = 1_000  # a task may be killed many times; it must never be dead-lettered here

app = Keel()  # the store is chosen by `keel worker --store` / `keel serve --store`


def record_effect(ctx: TaskContext, step: str, **extra: Any) -> dict[str, Any]:
    """Append one side-effect line for ``step`` and return it."""
    line = {
        "task": ctx.task_id,
        "step": step,
        "attempt": ctx.attempt,
        "fence": ctx.fence,
        "worker": ctx.worker,
        "nonce": secrets.token_hex(8),
        "t": time.time(),
        **extra,
    }
    data = (json.dumps(line, sort_keys=True) + "\n").encode()
    fd = os.open(os.environ["KEEL_TEST_EFFECTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        # One write(2) on an O_APPEND file: the line lands whole, after every earlier one,
        # whichever process wrote those.
        os.write(fd, data)
    finally:
        os.close(fd)
    return line


async def effect_step(ctx: TaskContext, step: str, work_ms: float) -> dict[str, Any]:
    """A step whose effect sits in the middle of some work: a kill before the effect
    leaves no trace; a kill after it and before the result is recorded leaves an effect
    that the next attempt repeats (the at-least-once window of any effect outside the
    store's transaction)."""
    await anyio.sleep(work_ms / 2000)
    line = record_effect(ctx, step)
    await anyio.sleep(work_ms / 2000)
    return line


@app.task("pg_steps", max_attempts=MAX_ATTEMPTS, lease_seconds=LEASE)
async def pg_steps(ctx: TaskContext, steps: int = 2, work_ms: float = 4.0) -> dict[str, Any]:
    """Run ``steps`` checkpointed steps; return the nonce of each step's recorded effect."""
    nonces = []
    for n in range(steps):
        line = await ctx.step(f"step-{n}", effect_step, ctx, f"step-{n}", work_ms)
        nonces.append(line["nonce"])
    return {"nonces": nonces, "attempt": ctx.attempt, "fence": ctx.fence}


@app.task("pg_hold", max_attempts=MAX_ATTEMPTS, lease_seconds=LEASE)
async def pg_hold(ctx: TaskContext) -> None:
    """Record that it started, then wait until stopped; record the stop in ``finally``."""
    record_effect(ctx, "started")
    try:
        await anyio.sleep_forever()
    finally:
        record_effect(ctx, "finally")


@app.task("pg_churn", max_attempts=MAX_ATTEMPTS, lease_seconds=LEASE)
async def pg_churn(ctx: TaskContext, every_ms: float = 5.0) -> None:
    """A slow handler that keeps the store busy: it writes its status line every
    ``every_ms`` until stopped (so that many of them queue for a small connection pool),
    recording when it started and when its ``finally`` ran."""
    record_effect(ctx, "started")
    try:
        n = 0
        while True:
            n += 1
            await ctx.status(f"tick {n}")
            await anyio.sleep(every_ms / 1000)
    finally:
        record_effect(ctx, "finally")


other = Keel()
"""A second app, with a task name that no test creates: a worker of it claims nothing of
``app``'s (the notify-off test's control worker)."""


@other.task("pg_other", lease_seconds=LEASE)
async def pg_other(ctx: TaskContext) -> None:
    """Never created; here so that ``keel worker --app pg_scale_app:other`` has a task."""
