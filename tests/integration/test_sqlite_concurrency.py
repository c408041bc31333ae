"""Several OS processes writing one SQLite file at the same moment.

The store contract says transitions are conditional writes, so concurrent writers cannot
lose updates, and that a write to a terminal task is answered uniformly with
``TaskAlreadyTerminal`` carrying the stored snapshot. These tests check it with real
processes (each with its own connection, ``BEGIN IMMEDIATE`` and busy timeout), not
threads sharing one connection.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from keel.errors import StoreError
from keel.model import Status
from keel.store import SqliteStore
from keel.store.sqlite import SCHEMA_VERSION

if TYPE_CHECKING:
    from .conftest import Spawner

TASKS = 400
RACERS = 4
SEED = 20260728  # shuffles each racer's order (SEED + racer index): reproducible collisions
RACE_TIMEOUT = 120.0  # seconds for all racers to finish (typically ~1 s)
HOLD = 0.3  # seconds another process keeps a lock: far below any busy timeout used here


async def _create_tasks(db: Path, count: int) -> list[str]:
    store = SqliteStore(db)
    try:
        tasks = await asyncio.gather(*(store.create() for _ in range(count)))
        return [task.task_id for task in tasks]
    finally:
        await store.close()


async def _read_back(db: Path, task_ids: list[str]) -> tuple[str, dict[str, Any]]:
    store = SqliteStore(db)
    try:
        stored = {tid: (await store.get(tid), await store.history(tid)) for tid in task_ids}
        return store.integrity_check(), stored
    finally:
        await store.close()


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["free", "lockstep", "grouped"])
def test_racing_processes_complete_each_task_exactly_once(
    tmp_path: Path, spawn: Spawner, schedule: str
) -> None:
    """Four processes started together each complete the same 400 tasks with their own
    result (synchronous=FULL). Per task exactly one process wins, the stored result and
    history are the winner's, and every loser got ``TaskAlreadyTerminal`` carrying the
    winner's result; no other error ("database is locked" included) reaches a caller.

    ``free``: each process runs through the tasks in its own seeded shuffle, back to back.
    SQLite's busy handler polls, so in practice one process takes the lock over and over
    while the others' first call waits: the others mostly lose, late. ``lockstep``: a
    barrier before every task, so all four attempt the same task at the same moment.
    ``grouped``: as ``free``, but eight concurrent callers per process, whose writes the
    store may commit together in one transaction.

    That the processes really overlapped is asserted, not assumed: their call intervals
    intersect, and in lockstep every process wins some rounds and, in most rounds, every
    loser's call began before the winner's call returned (they contended for the lock).
    """
    db = tmp_path / "race.db"
    task_ids = asyncio.run(_create_tasks(db, TASKS))
    ids_path = tmp_path / "task_ids.json"
    ids_path.write_text(json.dumps(task_ids))

    outs = [tmp_path / f"racer-{i}.json" for i in range(RACERS)]
    racers = [
        spawn(
            "_race_worker.py",
            str(db),
            str(i),
            schedule,
            str(SEED),
            str(ids_path),
            str(outs[i]),
            tag=f"racer-{i}",
        )
        for i in range(RACERS)
    ]
    for racer in racers:  # every racer has imported keel and opened its store
        racer.expect("ready")
    rounds = TASKS if schedule == "lockstep" else 1
    for round_ in range(rounds):
        for racer in racers:  # the barrier: released within microseconds of each other
            racer.send("go")
        if round_ < rounds - 1:
            for racer in racers:
                racer.expect("step", timeout=RACE_TIMEOUT)
    for racer in racers:
        racer.expect("done", timeout=RACE_TIMEOUT)
    codes = [racer.wait() for racer in racers]
    stderr = "".join(racer.stderr() for racer in racers)
    assert codes == [0] * RACERS, stderr
    assert stderr == "", "racers must not log anything (a lock error would show here)"

    runs = [json.loads(out.read_text()) for out in outs]
    errors = [
        (run["index"], tid, o["error"])
        for run in runs
        for tid, o in run["tasks"].items()
        if o["outcome"] == "error"
    ]
    assert errors == [], f"{len(errors)} calls failed unexpectedly, e.g. {errors[:5]}"

    # They ran at the same time: each started before any other had finished.
    assert max(run["first"] for run in runs) < min(run["last"] for run in runs), [
        (run["first"], run["last"]) for run in runs
    ]

    integrity, stored = asyncio.run(_read_back(db, task_ids))
    assert integrity == "ok"
    wins: Counter[int] = Counter()
    contended = 0
    for tid in task_ids:
        outcomes = {run["index"]: run["tasks"][tid] for run in runs}
        winners = [i for i, o in outcomes.items() if o["outcome"] == "won"]
        assert len(winners) == 1, f"task {tid}: winners {winners}"
        (winner,) = winners
        wins[winner] += 1
        expected = {"winner": winner}
        assert outcomes[winner]["result"] == expected
        assert outcomes[winner]["status"] == "completed"
        losers = {i: o for i, o in outcomes.items() if i != winner}
        for i, o in losers.items():
            assert (o["outcome"], o["status"], o["result"]) == ("lost", "completed", expected), (
                f"task {tid}: racer {i} should have lost to racer {winner}: {o}"
            )
        if all(o["started"] < outcomes[winner]["ended"] for o in losers.values()):
            contended += 1

        task, history = stored[tid]
        assert task.status is Status.COMPLETED
        assert task.result == expected
        # Exactly one completion was written, by the winner: losers changed nothing.
        assert [(e.from_status, e.to_status) for e in history] == [
            (None, Status.WORKING),
            (Status.WORKING, Status.COMPLETED),
        ]
        assert history[-1].actor == f"racer-{winner}"

    assert sum(wins.values()) == TASKS
    print(f"{schedule}: wins per racer {dict(sorted(wins.items()))}, {contended} tasks contended")
    if schedule == "lockstep":
        assert all(wins[i] > 0 for i in range(RACERS)), wins
        assert contended >= TASKS // 2, f"only {contended} rounds where all four contended"


@pytest.mark.slow
def test_opening_a_new_store_waits_while_another_process_holds_its_lock(
    tmp_path: Path, spawn: Spawner
) -> None:
    """Opening a brand-new store while another process holds its write lock (as the first
    of two processes started together does while it switches the new file to WAL) waits
    for the lock, as ``busy_timeout`` promises, and then opens a complete schema.

    A plain sqlite3 process holding ``BEGIN IMMEDIATE`` on the new file stands in for the
    first opener, so the collision happens every time instead of once in ~100 opens.
    """
    db = tmp_path / "new.db"
    holder = spawn("_lock_holder.py", str(db), tag="holder")
    holder.expect("locked")
    outcome: dict[str, Any] = {}

    def open_it() -> None:
        try:
            store = SqliteStore(db, busy_timeout=30)
        except StoreError as exc:
            outcome["error"] = exc
        else:
            outcome["schema_version"] = store.schema_version
            store.close_sync()

    opener = threading.Thread(target=open_it)
    opener.start()
    opener.join(HOLD)  # the lock is held all this time: a correct open is still waiting
    waited = opener.is_alive()
    holder.send("release")
    holder.expect("released")
    assert holder.wait() == 0
    opener.join(timeout=60)
    assert not opener.is_alive()
    assert "error" not in outcome, f"open failed while the lock was held: {outcome['error']}"
    assert waited
    assert outcome["schema_version"] == SCHEMA_VERSION
