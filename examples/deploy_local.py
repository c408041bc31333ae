"""docs/deploy.md on one machine: N front ends and M workers on one PostgreSQL database.

    uv run python examples/deploy_local.py --store "postgresql://postgres@127.0.0.1/test?schema=keel_try"

Brings up exactly the topology of docs/deploy.md: ``keel db migrate`` first, then N
``keel serve --no-worker`` front ends (each on a port of its own) and M ``keel worker
--metrics-port`` processes; waits until every ``/readyz`` says ready; creates tasks
through the front ends in turn (``tools/call`` over MCP); SIGKILLs a worker while it
runs tasks and starts a new one in its place; waits until every task completed; reads
back every ``/metrics`` and ``/readyz``; stops everything with SIGTERM (each must exit
0). It checks, and exits 1 if one fails, that:

* every front end and worker was ready, and the restarted worker became ready again;
* the front ends together counted every creation (``keel_tasks_created_total``);
* ``keel_tasks{status="completed"}`` is the number of tasks on every process;
* the killed worker's leases expired and were recovered (``keel_lease_expiries_total``
  of the survivors).

Its app is this file (``deploy_local:app``): one task, ``work``, that sleeps a moment.
The acceptance tests run it (tests/acceptance/test_deploy_local.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import anyio

from keel.runtime import Keel, TaskContext

HERE = Path(__file__).resolve().parent
KEEL = Path(sys.executable).parent / "keel"
LEASE = 2.0  # seconds: a killed worker's tasks are recovered soon
WAIT = 90.0  # seconds any phase may take

app = Keel()  # the store is given by --store


@app.task("work", max_attempts=5, lease_seconds=LEASE)
async def work(ctx: TaskContext, n: int) -> dict[str, int]:
    """Sleep a second (long enough to be running when a worker is killed)."""
    await anyio.sleep(1.0)
    return {"n": n}


class Process:
    """A keel process from this folder; its output in ``logs/NAME.log``."""

    def __init__(self, name: str, argv: list[str], logs: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log = logs / f"{name}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(  # noqa: S603 - this environment's keel
                [str(KEEL), *argv], cwd=HERE, env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def base(self) -> str | None:
        """Where its endpoints are, once it said so."""
        found = re.search(
            r"(?:metrics: |running on )(http://127\.0\.0\.1:\d+)", self.output(), re.I
        )
        return found.group(1) if found else None

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def metric(base: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples with ``labels`` in ``base/metrics``."""
    from prometheus_client.parser import text_string_to_metric_families

    _, text = get(f"{base}/metrics")
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def wait_for(what: str, check: object, within: float = WAIT) -> None:
    deadline = time.monotonic() + within
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit(f"deploy_local: timed out waiting for {what}")
        time.sleep(0.1)


def ready(process: Process) -> bool:
    base = process.base()
    if process.proc.poll() is not None:
        raise SystemExit(f"deploy_local: {process.name} exited:\n{process.output()[-3000:]}")
    return base is not None and get(f"{base}/readyz")[0] == 200


async def create(urls: list[str], tasks: int) -> list[str]:
    """``tasks`` work tasks, through the front ends in turn."""
    from mcp import Client

    from keel.mcp.client import TasksClientExtension

    ids = []
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(Client(url, extensions=[TasksClientExtension()]))
            for url in urls
        ]
        for n in range(tasks):
            client = clients[n % len(clients)]
            created = await client.session.call_tool("work", {"n": n}, allow_claimed=True)
            ids.append(created.task_id)
    return ids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="a postgresql:// URL (its own schema)")
    parser.add_argument("--front-ends", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=40)
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="keel-deploy-"))
    env = {k: v for k, v in os.environ.items() if k != "KEEL_STORE"} | {"PYTHONUNBUFFERED": "1"}
    problems: list[str] = []

    migrate = [str(KEEL), "db", "migrate", "--store", args.store]
    migrated = subprocess.run(  # noqa: S603 - this environment's keel
        migrate, cwd=HERE, env=env, capture_output=True, text=True, check=False
    )
    if migrated.returncode != 0:
        raise SystemExit(f"deploy_local: keel db migrate failed: {migrated.stderr}")
    fronts = [
        Process(
            f"front-{n}",
            [
                "serve",
                "--app",
                "deploy_local:app",
                "--no-worker",
                "--store",
                args.store,
                "--port",
                "0",
                "--data-dir",
                str(logs / f"data-{n}"),
            ],
            logs,
            env,
        )
        for n in range(args.front_ends)
    ]
    workers = [
        Process(f"worker-{n}", ["worker", "--app", "deploy_local:app", "--store", args.store,
                                "--metrics-port", "0", "--worker-id", f"worker-{n}"], logs, env)
        for n in range(args.workers)
    ]  # fmt: skip
    try:
        for p in fronts + workers:
            wait_for(f"{p.name} to be ready", lambda p=p: ready(p))
        print(f"ready: {len(fronts)} front ends, {len(workers)} workers (logs in {logs})")
        urls = [f"{p.base()}/mcp" for p in fronts]
        ids = anyio.run(create, urls, args.tasks)
        victim = workers[0]
        base = victim.base()
        assert base is not None
        wait_for("the first worker to run tasks",
                 lambda: metric(base, "keel_attempts_running") > 0)  # fmt: skip
        victim.kill()
        workers[0] = Process("worker-0-again", ["worker", "--app", "deploy_local:app",
                             "--store", args.store, "--metrics-port", "0",
                             "--worker-id", "worker-0-again"], logs, env)  # fmt: skip
        wait_for("the restarted worker to be ready", lambda: ready(workers[0]))
        probe = fronts[0].base()
        assert probe is not None
        wait_for(f"{len(ids)} tasks to complete",
                 lambda: metric(probe, "keel_tasks", status="completed") >= len(ids))  # fmt: skip
        created = sum(metric(p.base() or "", "keel_tasks_created_total") for p in fronts)
        expiries = sum(metric(p.base() or "", "keel_lease_expiries_total") for p in workers)
        completed = {p.name: metric(p.base() or "", "keel_tasks", status="completed")
                     for p in fronts + workers}  # fmt: skip
        readiness = {p.name: json.loads(get(f"{p.base()}/readyz")[1]) for p in fronts + workers}
        print(json.dumps({"tasks": len(ids), "created_by_front_ends": created,
                          "lease_expiries_recovered": expiries, "completed_gauge": completed,
                          "readyz": readiness}, indent=1))  # fmt: skip
        if created != len(ids):
            problems.append(f"front ends counted {created} creations, not {len(ids)}")
        if any(v != len(ids) for v in completed.values()):
            problems.append(f"keel_tasks{{status=completed}} is not {len(ids)} everywhere")
        if expiries < 1:
            problems.append("no expired lease was recovered after the kill")
        if not all(r["ready"] for r in readiness.values()):
            problems.append("a process is not ready at the end")
    finally:
        codes = {p.name: p.stop() for p in fronts + workers}
    if any(codes.values()):
        problems.append(f"exit codes after SIGTERM: {codes}")
    for problem in problems:
        print(f"deploy_local: FAILED: {problem}", file=sys.stderr)
    print("deploy_local: ok" if not problems else f"deploy_local: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
