"""A Keel app whose one task writes down the modules its worker process has imported, and
how many objects its start-up left frozen out of the garbage collector's sight, and
its collection thresholds."""

import gc
import json
import sys

import anyio

from keel.runtime import Keel, TaskContext

app = Keel()  # the store is given by `keel worker --store`


@app.task("modules")
async def modules(ctx: TaskContext, out: str) -> None:
    """Write the names of the modules imported so far, and ``gc.get_freeze_count()``, into
    the file ``out`` (JSON)."""
    seen = {
        "modules": sorted(sys.modules),
        "frozen": gc.get_freeze_count(),
        "threshold": gc.get_threshold(),
    }
    await anyio.Path(out).write_text(json.dumps(seen))
