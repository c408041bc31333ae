"""Store failures: how fast ``keel serve`` answers with PostgreSQL down, and how fast it
serves again once PostgreSQL is back.

Against a real ``keel serve --no-worker --app apps.noop_app:app`` (run from ``bench/``) on
a private throwaway PostgreSQL cluster (``tests/pg_scale/cluster.py``: initdb in a
temporary folder, a free loopback port; needs root and the ``postgres`` OS user; never
the shared server), driven by the official MCP client with the tasks extension. Each
round stops the cluster (``pg_ctl stop -m fast``), then times:

* **tools/call** (a task tool: the create must reach the store) and **tasks/get** (of a
  task created before the outage) until their answer, with its JSON-RPC code (``-32050``
  expected, within ``--store-timeout``, default keel serve's own 10 s);
* then starts the cluster again and times the **first call after PostgreSQL is back**
  (``tasks/get``, sent as soon as ``pg_ctl start`` returned; then a ``tools/call``).

The cluster stays down for the two calls (about two timeouts): long enough for a pool
that backs off to show it.

    uv run python bench/failure_bench.py               # 3 rounds at the default timeout
    uv run python bench/failure_bench.py --rounds 1 --store-timeout 3   # a smoke run

Prints a table and the targets met, and writes JSON (``--out``, default
``bench/results/failure_bench.json``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.shared.exceptions import MCPError

from _report import print_targets, write_results
from keel.mcp.client import Created, Detailed, GetTask, TaskIdParams
from keel.mcp.client import TasksClientExtension as Tasks
from keel.store import open_store

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from keel_serve import KeelServe  # noqa: E402 - the tests' keel serve process
from pg_scale.cluster import PrivateCluster  # noqa: E402 - the tests' throwaway cluster

ANSWER_TARGET = 10.0  # seconds: the default --store-timeout
BACK_TARGET = 2.0  # seconds: the first call after PostgreSQL is back


async def _create(client: Client) -> str:
    created = await client.session.call_tool("noop", {}, allow_claimed=True)
    assert isinstance(created, Created), created
    return str(created.task_id)


async def _get(client: Client, task_id: str) -> None:
    await client.session.send_request(GetTask(params=TaskIdParams(task_id=task_id)), Detailed)


async def _timed(call: Any) -> tuple[float, int | None, str]:
    """Seconds until ``call`` answered, its JSON-RPC error code (None: it succeeded), and
    the error's message."""
    started = time.perf_counter()
    try:
        await call
    except MCPError as exc:
        return time.perf_counter() - started, exc.error.code, exc.error.message
    return time.perf_counter() - started, None, ""


async def _rounds(url: str, cluster: PrivateCluster, rounds: int) -> list[dict[str, Any]]:
    out = []
    async with Client(url, extensions=[Tasks()]) as client:
        task_id = await _create(client)
        for _ in range(rounds):
            await anyio.to_thread.run_sync(cluster.stop, "fast")
            call_s, call_code, message = await _timed(_create(client))
            get_s, get_code, _ = await _timed(_get(client, task_id))
            await anyio.to_thread.run_sync(cluster.start)
            back_s, back_code, _ = await _timed(_get(client, task_id))
            after_call_s, after_code, _ = await _timed(_create(client))
            out.append(
                {
                    "tools_call_down_s": call_s,
                    "tools_call_code": call_code,
                    "tasks_get_down_s": get_s,
                    "tasks_get_code": get_code,
                    "message": message,
                    "first_call_back_s": back_s,
                    "first_call_back_code": back_code,
                    "tools_call_back_s": after_call_s,
                    "tools_call_back_code": after_code,
                }
            )
            print(
                f"  {call_s:8.2f} {call_code!s:>7} {get_s:8.2f} {get_code!s:>7} "
                f"{back_s:9.3f} {back_code!s:>5} {after_call_s:9.3f} {after_code!s:>5}"
            )
    return out


def run(rounds: int, store_timeout: float | None) -> tuple[list[dict[str, Any]], str]:
    with PrivateCluster.create() as cluster, tempfile.TemporaryDirectory() as folder:
        url = cluster.url("postgres", schema="keel_failure_bench")
        store = open_store(url)
        anyio.run(store.list)  # the schema, before keel serve starts
        anyio.run(store.close)
        args = ["--app", "apps.noop_app:app", "--no-worker", "--store", url, "--data-dir", folder]
        if store_timeout is not None:
            args += ["--store-timeout", str(store_timeout)]
        env = {k: v for k, v in os.environ.items() if k not in {"KEEL_STORE", "KEEL_STORE_TIMEOUT"}}
        server = KeelServe(args, cwd=HERE, env=env, log=Path(folder) / "serve.log")
        server.start()
        try:
            anyio.run(server.ready)
            print("PostgreSQL down, then back: seconds until each answer (code: None = success)")
            print(f"  {'call':>8} {'code':>7} {'get':>8} {'code':>7} {'back:get':>9} {'code':>5}"
                  f" {'back:call':>9} {'code':>5}")  # fmt: skip
            results = anyio.run(_rounds, server.url, cluster, rounds)
        finally:
            server.stop()
        return results, server.output()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="outages, one after the other")
    parser.add_argument(
        "--store-timeout", type=float, default=None, help="keel serve's (default: its own)"
    )
    parser.add_argument("--out", default="bench/results/failure_bench.json")
    args = parser.parse_args()
    results, log_tail = run(args.rounds, args.store_timeout)
    bound = args.store_timeout or ANSWER_TARGET
    worst_down = max(max(r["tools_call_down_s"], r["tasks_get_down_s"]) for r in results)
    worst_back = max(r["first_call_back_s"] for r in results)
    codes = {r["tools_call_code"] for r in results} | {r["tasks_get_code"] for r in results}
    back_ok = all(r["first_call_back_code"] is None and r["tools_call_back_code"] is None
                  for r in results)  # fmt: skip
    print(f"\n  message: {results[-1]['message']}")
    checks = [
        {"target": f"answer with PostgreSQL down <= {bound:g} s (tools/call, tasks/get)",
         "measured": f"worst {worst_down:.2f} s, median "
         f"{statistics.median(r['tasks_get_down_s'] for r in results):.2f} s",
         "ok": worst_down <= bound},
        {"target": "answered -32050 (store unavailable)",
         "measured": f"codes {sorted(map(str, codes))}", "ok": codes == {-32050}},
        {"target": f"first call after PostgreSQL is back <= {BACK_TARGET:g} s",
         "measured": f"worst {worst_back:.3f} s", "ok": worst_back <= BACK_TARGET and back_ok},
    ]  # fmt: skip
    print_targets(checks)
    out = write_results(args.out, "failure_bench", args, rounds=results, checks=checks,
                        serve_log_tail=log_tail)  # fmt: skip
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
