"""A Keel app whose one task writes down the modules its worker process has imported."""

import json
import sys

import anyio

from keel.runtime import Keel, TaskContext

app = Keel()  # the store is given by `keel worker --store`


@app.task("modules")
async def modules(ctx: TaskContext, out: str) -> None:
    """Write the names of the modules imported so far into the file ``out`` (JSON)."""
    await anyio.Path(out).write_text(json.dumps(sorted(sys.modules)))
