"""``keel serve`` for ``mcp_bench.py``, profiled.

    python bench/apps/bench_serve.py [--profile OUT.prof] -- serve ...

Everything after ``--`` is the argv of Keel's own CLI (``keel serve --app …``).

* ``--profile OUT.prof``: run it under the standard library's cProfile and write the stats
  when the server exits (SIGTERM lets uvicorn shut down cleanly). cProfile sees the event
  loop thread, which is where Keel's request handling, its SQLite commits (inline on the
  loop unless another process holds the write lock) and its in-process worker run.
"""

from __future__ import annotations

import argparse
import cProfile
import signal
import sys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", help="write cProfile stats here")
    parser.add_argument("keel_argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    argv = args.keel_argv[1:] if args.keel_argv[:1] == ["--"] else args.keel_argv
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
