"""Single execution: workers racing for the same tasks, in threads (each with its own
event loop and SQLite connection) and in real OS processes, run one attempt of a task at
a time; a stale attempt's completion is refused with LeaseLost and the stored result is
the live attempt's.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from contract.support import FakeClock
from keel.errors import LeaseLost, TaskAlreadyTerminal
from keel.model import Status
from keel.runtime import Keel, TaskContext
from keel.store import SqliteStore

from .support import POLL, WAIT, eventually, running, worker

pytestmark = pytest.mark.anyio

THREADS = 4
TASKS = 48
LEASE = 30.0  # seconds of store time; heartbeats (every 10 s of real time) never fire


class Threads:
    """Worker threads, each running ``serve(index)`` in its own event loop; errors kept."""

    def __init__(self, count: int, serve: Callable[[int], Awaitable[None]]) -> None:
        self.errors: list[BaseException] = []
        self.threads = [
            # Daemon threads: a hung one fails its test (join) without hanging the session.
            threading.Thread(target=self._main, args=(serve, i), name=f"worker-{i}", daemon=True)
            for i in range(count)
        ]

    def _main(self, serve: Callable[[int], Awaitable[None]], index: int) -> None:
        try:
            anyio.run(serve, index)
        except BaseException as exc:  # reported by join(), not lost in a thread
            self.errors.append(exc)

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    async def join(self) -> None:
        for thread in self.threads:
            await anyio.to_thread.run_sync(thread.join, WAIT)
        assert not any(t.is_alive() for t in self.threads), "a worker thread did not stop"
        assert self.errors == []


async def _all_terminal(store: SqliteStore, ids: list[str]) -> bool:
    seen = await store.statuses(ids)
    return len(seen) == len(ids) and all(status.terminal for status, _ in seen.values())


async def _wait_flag(flag: threading.Event) -> None:
    """Wait (bounded) for an event set by another thread, without blocking the loop."""
    with anyio.fail_after(WAIT):
        while True:
            if flag.is_set():
                return
            await anyio.sleep(POLL)


async def test_threads_racing_to_claim_run_each_task_once(
    tmp_path: Path, clock: FakeClock, sqlite_store: SqliteStore
) -> None:
    """Workers in four threads racing on one SQLite file run every task exactly once."""
    # The first handlers wait until a second thread runs one: the overlap is asserted.
    db = tmp_path / "keel.db"
    ids = [
        (await sqlite_store.create(name="race", arguments={"n": n}, max_attempts=1)).task_id
        for n in range(TASKS)
    ]
    lock = threading.Lock()
    starts: list[tuple[str, int, str]] = []
    workers_seen: set[str] = set()
    overlap = threading.Event()  # two workers have had handlers running at once
    barrier = threading.Barrier(THREADS)

    async def serve(index: int) -> None:
        store = SqliteStore(db, clock=clock)
        app = Keel(store)

        @app.task("race", max_attempts=1)
        async def race(ctx: TaskContext, n: int) -> dict[str, Any]:
            with lock:
                starts.append((ctx.task_id, ctx.fence, ctx.worker))
                workers_seen.add(ctx.worker)
                if len(workers_seen) >= 2:
                    overlap.set()
            await ctx.step("work", lambda: ctx.worker)
            await _wait_flag(overlap)  # the first handlers wait for another thread's
            return {"n": n, "worker": ctx.worker, "fence": ctx.fence}

        try:
            await anyio.to_thread.run_sync(partial(barrier.wait, WAIT))
            # The watch loop runs too: attempts claimed during its status read are not judged.
            w = worker(app, concurrency=2, worker_id=f"thread-{index}")
            async with running(w):
                await eventually(partial(_all_terminal, store, ids), "every task to end")
        finally:
            await store.close()

    threads = Threads(THREADS, serve)
    threads.start()
    await threads.join()

    per_task = Counter(task_id for task_id, _, _ in starts)
    assert sorted(per_task) == sorted(ids)
    assert set(per_task.values()) == {1}, "a task ran more than once"
    ran_by = {task_id: who for task_id, _, who in starts}
    assert all(fence == 1 for _, fence, _ in starts)
    assert len(set(ran_by.values())) >= 2
    for task_id in ids:
        task = await sqlite_store.get(task_id)
        assert (task.status, task.attempt, task.fence) == (Status.COMPLETED, 1, 1)
        assert task.result["structuredContent"]["worker"] == ran_by[task_id]
        assert await sqlite_store.steps(task_id) == {"work": ran_by[task_id]}
        claims = [e for e in await sqlite_store.history(task_id) if e.reason.startswith("claimed")]
        assert len(claims) == 1


async def test_threads_take_over_expired_attempts_one_at_a_time(
    tmp_path: Path, clock: FakeClock, sqlite_store: SqliteStore
) -> None:
    """Across threads, expired attempts are taken over, stopped and fenced out (LeaseLost)."""
    # Two attempts hang in two threads (concurrency 1 each); their leases expire on the store
    # clock; idle workers in other threads take over. Stale completions get LeaseLost while
    # the live attempts run, and each stored result is its live attempt's.
    db = tmp_path / "keel.db"
    ids = [
        (await sqlite_store.create(name="hang", arguments={"n": n}, max_attempts=3)).task_id
        for n in range(2)
    ]
    lock = threading.Lock()
    events: list[tuple[str, int, str, str]] = []  # (task, fence, worker, what)
    checked = threading.Event()  # the test has tried the stale completions

    async def serve(index: int) -> None:
        store = SqliteStore(db, clock=clock)
        app = Keel(store)

        @app.task("hang", lease_seconds=LEASE, max_attempts=3)
        async def hang(ctx: TaskContext, n: int) -> dict[str, Any]:
            with lock:
                events.append((ctx.task_id, ctx.fence, ctx.worker, "start"))
            if ctx.fence == 1:
                try:
                    await anyio.sleep_forever()
                finally:
                    with lock:
                        events.append((ctx.task_id, ctx.fence, ctx.worker, "stopped"))
            await _wait_flag(checked)
            return {"fence": ctx.fence, "worker": ctx.worker}

        try:
            async with running(worker(app, concurrency=1, worker_id=f"thread-{index}")):
                await eventually(partial(_all_terminal, store, ids), "every task to end")
        finally:
            await store.close()

    threads = Threads(THREADS, serve)
    threads.start()
    try:

        async def first_claims() -> list[Any] | None:
            tasks = [await sqlite_store.get(i) for i in ids]
            return tasks if all(t.fence == 1 and t.leased for t in tasks) else None

        stale = await eventually(first_claims, "both tasks to be claimed by hanging attempts")
        assert len({t.lease_owner for t in stale}) == 2  # concurrency 1: two workers hang
        clock.advance(LEASE + 1)

        async def taken_over() -> list[Any] | None:
            tasks = [await sqlite_store.get(i) for i in ids]
            return tasks if all(t.fence == 2 and t.leased for t in tasks) else None

        live = await eventually(taken_over, "both tasks to be claimed again")
        for old, new in zip(stale, live, strict=True):
            assert new.lease_owner != old.lease_owner
            with pytest.raises(LeaseLost):
                await sqlite_store.complete(old.task_id, {"stale": True}, fence=1)
    finally:
        checked.set()
        await threads.join()

    for old, new in zip(stale, live, strict=True):
        done = await sqlite_store.get(old.task_id)
        assert done.status is Status.COMPLETED
        assert done.result["structuredContent"] == {"fence": 2, "worker": new.lease_owner}
        assert (done.attempt, done.closed_fence) == (2, 2)
        with pytest.raises(TaskAlreadyTerminal):
            await sqlite_store.complete(old.task_id, {"stale": True}, fence=1)
        mine = [(f, w, what) for t, f, w, what in events if t == old.task_id]
        assert (1, old.lease_owner, "start") in mine
        assert (1, old.lease_owner, "stopped") in mine  # the stale attempt did not run on
        assert (2, new.lease_owner, "start") in mine
        assert len(mine) == 3


# --- real OS processes ------------------------------------------------------------------

HERE = Path(__file__).parent
PROCESSES = 3
STARTUP = 60.0  # seconds a helper may take to import keel and open its store
FINISH = 60.0  # seconds for the whole race (typically one or two)


class Racers:
    """``_racer.py`` processes over one SQLite file, released together by a barrier."""

    def __init__(self, tmp_path: Path, db: Path, ids: list[str]) -> None:
        self.tmp_path = tmp_path
        self.db = db
        self.log = tmp_path / "race.log"
        self.ids_path = tmp_path / "ids.json"
        self.ids_path.write_text(json.dumps(ids))
        self.procs: list[anyio.abc.Process] = []
        self.stdout: list[BufferedByteReceiveStream] = []
        self.stderr_paths: list[Path] = []

    async def start(self, count: int, *, lease: float, concurrency: int, watch: float) -> None:
        args = [str(self.db), str(self.log), str(self.ids_path), str(lease), str(concurrency)]
        for i in range(count):
            err = self.tmp_path / f"racer-{i}.stderr"
            self.stderr_paths.append(err)
            with err.open("wb") as stderr:
                proc = await anyio.open_process(
                    [sys.executable, str(HERE / "_racer.py"), *args, str(watch)],
                    stderr=stderr,
                    cwd=self.tmp_path,
                )
            self.procs.append(proc)
            assert proc.stdout is not None
            self.stdout.append(BufferedByteReceiveStream(proc.stdout))
        for i in range(count):
            await self.expect(i, b"ready", STARTUP)
        for proc in self.procs:  # the barrier: all of them start claiming now
            assert proc.stdin is not None
            await proc.stdin.send(b"go\n")

    async def expect(self, i: int, word: bytes, within: float) -> None:
        with anyio.move_on_after(within):
            line = await self.stdout[i].receive_until(b"\n", 1000)
            assert line == word, f"racer {i} said {line!r}, not {word!r}\n{self.stderr(i)}"
            return
        raise AssertionError(f"racer {i}: no {word!r} within {within}s\n{self.stderr(i)}")

    async def finish(self) -> None:
        for i, proc in enumerate(self.procs):
            await self.expect(i, b"done", FINISH)
            with anyio.fail_after(STARTUP):
                assert await proc.wait() == 0, self.stderr(i)

    async def close(self) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                proc.kill()
            with anyio.CancelScope(shield=True):
                await proc.aclose()

    def stderr(self, i: int) -> str:
        return f"--- stderr of racer {i} ---\n{self.stderr_paths[i].read_text()[-3000:]}"

    def lines(self) -> list[list[str]]:
        return [line.split() for line in self.log.read_text().splitlines()]


def check_fencing(lines: list[list[str]]) -> set[tuple[str, int]]:
    """No write was accepted from an attempt after a newer attempt of its task began.

    Sound from the log order alone: an accepted write committed after its ``try`` line,
    and a ``start`` line follows its claim, so a ``try TASK a`` after ``start TASK b``
    (b > a) that ends ``ok`` would be a write the store took from a stale attempt.
    Returns the (task, fence) pairs that tried to write after a newer attempt began.
    """
    newest: dict[str, int] = {}
    tried_after_newer: set[tuple[str, int]] = set()
    for words in lines:
        kind, task_id, fence = words[0], words[1], int(words[2])
        if kind == "start":
            newest[task_id] = max(newest.get(task_id, 0), fence)
        elif kind in {"try", "stale"} and newest.get(task_id, 0) > fence:
            tried_after_newer.add((task_id, fence))
        if kind == "ok":
            assert (task_id, fence) not in tried_after_newer, f"stale write accepted: {words}"
        if kind == "stale":
            assert words[3] == "LeaseLost", f"a stale completion was not refused: {words}"
    return tried_after_newer


async def check_history(store: SqliteStore, task_id: str) -> None:
    """Leases never overlap: each claim comes after the previous lease ended."""
    held = False
    for event in await store.history(task_id):
        if event.reason.startswith("claimed by "):
            assert not held, f"task {task_id} claimed while leased: {event}"
            held = True
        elif (
            event.actor == "recovery"
            or event.to_status.terminal
            or (event.reason.startswith(("released by ", "attempt ")))
        ):
            held = False


@pytest.mark.slow
async def test_processes_racing_to_claim_run_each_task_once(tmp_path: Path) -> None:
    """Worker processes racing on one SQLite file run every task exactly once."""
    db = tmp_path / "race.db"
    store = SqliteStore(db)
    racers: Racers | None = None
    try:
        ids = [
            (await store.create(name="race", arguments={"n": n}, max_attempts=20)).task_id
            for n in range(TASKS)
        ]
        racers = Racers(tmp_path, db, ids)
        # Leases long enough never to expire; the watch loop polls as it would in production.
        await racers.start(PROCESSES, lease=10.0, concurrency=2, watch=0.2)
        await racers.finish()

        lines = racers.lines()
        check_fencing(lines)
        starts = [w for w in lines if w[0] == "start"]
        assert Counter(w[1] for w in starts) == Counter(dict.fromkeys(ids, 1))
        pids = {w[1]: int(w[3]) for w in starts}
        assert len(set(pids.values())) >= 2
        for task_id in ids:
            task = await store.get(task_id)
            assert (task.status, task.attempt, task.fence) == (Status.COMPLETED, 1, 1)
            assert task.result["structuredContent"] == {"fence": 1, "pid": pids[task_id]}
            await check_history(store, task_id)
    finally:
        if racers is not None:
            await racers.close()
        await store.close()


@pytest.mark.slow
async def test_a_paused_process_is_fenced_out(tmp_path: Path) -> None:
    """A paused process loses its task on lease expiry; its stale complete gets LeaseLost."""
    # The paused process's event loop is blocked (no heartbeat) until another process runs
    # the task; the stored result is the live attempt's, leases never overlap, and no stale
    # write is ever accepted.
    db = tmp_path / "race.db"
    store = SqliteStore(db)
    racers: Racers | None = None
    try:
        stalls = [
            (await store.create(name="race", arguments={"n": n, "stall": True}, max_attempts=20))
            for n in range(2)
        ]
        plain = [
            (await store.create(name="race", arguments={"n": n}, max_attempts=20))
            for n in range(2, 6)
        ]
        ids = [t.task_id for t in stalls + plain]
        racers = Racers(tmp_path, db, ids)
        # Concurrency 1: a paused process stalls only the attempt that paused it.
        await racers.start(PROCESSES, lease=1.0, concurrency=1, watch=0.02)
        await racers.finish()

        lines = racers.lines()
        stale_writers = check_fencing(lines)
        assert {(t.task_id, 1) for t in stalls} <= stale_writers  # the check had work to do
        assert not [w for w in lines if w[0] == "stall-timeout"]
        for stall in stalls:
            stale = [w for w in lines if w[0] == "stale" and w[1] == stall.task_id]
            assert stale == [["stale", stall.task_id, "1", "LeaseLost"]]
        for task_id in ids:
            task = await store.get(task_id)
            assert task.status is Status.COMPLETED
            assert task.result["structuredContent"]["fence"] == task.fence == task.closed_fence
            owner = [int(w[3]) for w in lines if w[:3] == ["start", task_id, str(task.fence)]]
            assert task.result["structuredContent"]["pid"] in owner
            await check_history(store, task_id)
        for stall in stalls:
            task = await store.get(stall.task_id)
            assert task.fence >= 2
            assert task.attempt >= 2
            history = await store.history(stall.task_id)
            assert any(e.actor == "recovery" and "expired" in e.reason for e in history)
    finally:
        if racers is not None:
            await racers.close()
        await store.close()
