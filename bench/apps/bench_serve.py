"""``keel serve`` for ``mcp_bench.py``, optionally profiled or with a what-if patch.

    python bench/apps/bench_serve.py [--profile OUT.prof] [--wake-on-submit] -- serve ...

Everything after ``--`` is the argv of Keel's own CLI (``keel serve --app …``).

* ``--profile OUT.prof``: run it under the standard library's cProfile and write the stats
  when the server exits (SIGTERM lets uvicorn shut down cleanly). cProfile sees the event
  loop thread, which is where Keel's request handling, its SQLite commits (inline on the
  loop unless another process holds the write lock) and its in-process worker run.
* ``--wake-on-submit``: a **what-if**, not Keel as shipped. ``Keel.submit`` is wrapped so
  that, once a task is committed, the app's in-process workers are woken at once instead
  of finding it at their next idle claim (``CLAIM_INTERVAL``, 0.5 s). It estimates what
  that fix would give; the benchmark labels its rows ``keel-wake``.
"""

from __future__ import annotations

import argparse
import cProfile
import signal
import sys
from typing import Any


def wake_on_submit() -> None:
    from keel.runtime import Keel, Worker

    workers: list[Worker] = []
    init, submit = Worker.__init__, Keel.submit

    def patched_init(self: Worker, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        workers.append(self)

    async def patched_submit(self: Keel, *args: Any, **kwargs: Any) -> Any:
        task = await submit(self, *args, **kwargs)
        for worker in workers:
            if worker.app is self:
                worker._poke()  # what the fix would do from inside the runtime
        return task

    Worker.__init__ = patched_init  # type: ignore[method-assign]
    Keel.submit = patched_submit  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", help="write cProfile stats here")
    parser.add_argument("--wake-on-submit", action="store_true")
    parser.add_argument("keel_argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    argv = args.keel_argv[1:] if args.keel_argv[:1] == ["--"] else args.keel_argv
    if args.wake_on_submit:
        wake_on_submit()
    from keel.cli import main as keel_main

    sys.argv = ["keel", *argv]
    if args.profile is None:
        keel_main()
        return
    # Until uvicorn installs its own handler, SIGTERM is a plain exit that keeps the profile.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        keel_main()
    except SystemExit:
        pass
    finally:
        profiler.disable()
        profiler.dump_stats(args.profile)


if __name__ == "__main__":
    main()
