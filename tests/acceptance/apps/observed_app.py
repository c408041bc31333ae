"""A Keel app whose tasks end every way there is, for the observability tests.

    cd tests/acceptance/apps && keel serve --app observed_app:app --store /tmp/x.db

``echo`` completes at once; ``boom`` raises on each of its two attempts (dead-lettered);
``hold`` runs until it is cancelled; ``ask`` asks for a service name, then completes.
"""

from __future__ import annotations

from typing import Any

import anyio

from keel.runtime import Keel, TaskContext

SERVICE = {"type": "object", "required": ["service"], "properties": {"service": {"type": "string"}}}

app = Keel()  # the store is chosen by `keel serve --store`


@app.task("echo", max_attempts=1)
async def echo(ctx: TaskContext, text: str) -> dict[str, Any]:
    """Return the text."""
    return {"text": text}


@app.task("boom", max_attempts=2, retry_base=0.01, retry_cap=0.01)
async def boom(ctx: TaskContext) -> None:
    """Fail every attempt."""
    raise RuntimeError("boom")


@app.task("hold", max_attempts=1)
async def hold(ctx: TaskContext) -> None:
    """Run until cancelled."""
    await anyio.sleep_forever()


@app.task("ask", max_attempts=1)
async def ask(ctx: TaskContext) -> dict[str, Any]:
    """Ask which service, then answer with it."""
    answer = await ctx.elicit("Which service?", SERVICE, key="service")
    return {"service": answer["service"]}
