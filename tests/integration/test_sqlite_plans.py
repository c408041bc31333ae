"""Planned writes: a group worked out from a snapshot, then checked under the write lock.

When other processes write the same SQLite file, a store works out each group of writes
against a read snapshot before it takes the write lock, and under the lock only checks
that the rows it read are unchanged and executes what it recorded (see
``keel.store.sqlite.planning``). These tests hold the write lock from another connection
while a plan waits for it, change rows under the plan, and check that a stale plan is
never used: the writes then run as they would without one.

The connection holding the lock is a plain ``sqlite3`` connection in this process: it
stands in for another process, and lets each test decide exactly what changes while the
plan waits. Whether a plan (or a part of it) was used is observed by wrapping
``Planner.holds``.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from contract.support import FakeClock
from keel.errors import ConfigurationError, IdempotencyConflict, LeaseLost, StoreError
from keel.model import InputRequest, Status, Task
from keel.store import SqliteStore, open_store
from keel.store.base import Op
from keel.store.sqlite import CLAIMS_CONTENDED, PlanMode
from keel.store.sqlite.connection import Connection
from keel.store.sqlite.planning import Planner

pytestmark = pytest.mark.anyio

T = TypeVar("T")
JOB = "job"
WAIT = 10.0  # seconds any condition below may take (they take milliseconds)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "keel.db"


@pytest.fixture
def verdicts(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Every check of a planned part under the lock: True if the plan was used."""
    seen: list[bool] = []
    original = Planner.holds

    def recorded(self: Planner, part: Any) -> bool:
        holds = original(self, part)
        seen.append(holds)
        return holds

    monkeypatch.setattr(Planner, "holds", recorded)
    return seen


@pytest.fixture
def holder(db: Path) -> Iterator[sqlite3.Connection]:
    """Another writer's connection (autocommit; the tests begin and end its transaction)."""
    SqliteStore(db).close_sync()  # the schema, in WAL mode
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture
async def store(db: Path, holder: sqlite3.Connection) -> AsyncIterator[SqliteStore]:
    """A store that plans every group, as it does while other processes write."""
    opened = SqliteStore(db, plan="always")
    try:
        yield opened
    finally:
        await opened.close()


def _in_thread(store: SqliteStore) -> bool:
    """Whether a group of ``store``'s writes runs in a worker thread (waiting for the lock)."""
    return store._lane is not None and store._lane.flushing


def _sql(holder: sqlite3.Connection, statement: str, *params: object) -> Callable[[], None]:
    """What another writer does while a plan waits: one statement in its transaction."""

    def run() -> None:
        holder.execute(statement, params)

    return run


async def _until(condition: Callable[[], bool], what: str) -> None:
    try:
        async with asyncio.timeout(WAIT):
            while not condition():  # noqa: ASYNC110 - the store offers no event for it
                await asyncio.sleep(0.001)  # polling a condition, bounded by WAIT
    except TimeoutError:
        pytest.fail(f"not within {WAIT} s: {what}")


async def _while_locked(
    store: SqliteStore,
    holder: sqlite3.Connection,
    write: Callable[[], Awaitable[T]],
    meanwhile: Callable[[], None],
) -> asyncio.Task[T]:
    """Start ``write`` on ``store`` while ``holder`` holds the write lock; once the store
    has planned it and waits for the lock, run ``meanwhile`` (under the holder's lock)
    and commit. Returns the write's task."""
    holder.execute("BEGIN IMMEDIATE")
    try:
        task = asyncio.ensure_future(write())
        await _until(lambda: _in_thread(store), "the write waits for the lock in a thread")
        meanwhile()
    except BaseException:
        holder.execute("ROLLBACK")
        raise
    holder.execute("COMMIT")
    return task


async def _complete_while(
    store: SqliteStore,
    holder: sqlite3.Connection,
    task_id: str,
    fence: int,
    meanwhile: Callable[[], None],
) -> asyncio.Task[Task]:
    """Complete a task with ``{"done": True}`` while ``meanwhile`` runs under the lock."""
    return await _while_locked(
        store, holder, lambda: store.complete(task_id, {"done": True}, fence=fence), meanwhile
    )


async def test_a_plan_whose_task_changed_meanwhile_is_not_used(store, holder, verdicts):
    """A completion planned while the task was this worker's is not executed as planned
    when another writer took the task over before the lock came: the completion runs
    again under the lock and is refused with LeaseLost; the other writer's lease stands."""
    await store.create(name=JOB)
    [mine] = await store.claim([JOB], worker="me", lease_seconds=60)
    taken_over = _sql(  # what recovery and a claim by another worker write
        holder,
        "UPDATE tasks SET fence = fence + 1, lease_owner = 'other', attempt = attempt + 1 "
        "WHERE task_id = ?",
        mine.task_id,
    )
    verdicts.clear()
    write = await _complete_while(store, holder, mine.task_id, mine.fence, taken_over)
    with pytest.raises(LeaseLost):
        await write
    assert verdicts == [False]
    now = await store.get(mine.task_id)
    assert (now.status, now.lease_owner, now.fence) == (Status.WORKING, "other", mine.fence + 1)
    assert now.result is None


async def test_an_answer_given_elsewhere_while_the_plan_waited_is_kept(store, holder, verdicts):
    """The lost update a stale plan would cause: a task waits for answers ``a`` and ``b``;
    this store plans the answer to ``a`` while ``b`` is still open; another writer stores
    the answer to ``b`` (status and fence stay as they were). The plan is not used: the
    answer to ``a`` is merged with ``b``'s under the lock, and the task runs on."""
    text = {"type": "string"}
    task = await store.create(
        name=JOB, input_requests={"a": InputRequest("A?", text), "b": InputRequest("B?", text)}
    )
    assert task.status is Status.INPUT_REQUIRED
    b_answered = _sql(
        holder,
        """UPDATE tasks SET input_responses = '{"b":"from elsewhere"}' WHERE task_id = ?""",
        task.task_id,
    )
    verdicts.clear()
    write = await _while_locked(
        store, holder, lambda: store.provide_input(task.task_id, {"a": "here"}), b_answered
    )
    answered = await write
    assert verdicts == [False]
    assert answered.input_responses == {"a": "here", "b": "from elsewhere"}
    assert answered.status is Status.WORKING
    assert await store.get(task.task_id) == answered


async def test_a_plan_whose_rows_are_unchanged_is_used(store, holder, verdicts):
    """Another writer that commits something else while the plan waits does not void it:
    the completion is executed as planned, and the other writer's task is untouched."""
    mine = await store.create(name=JOB)
    other = await store.create(name=JOB, arguments={"n": 2})
    [claimed] = await store.claim([JOB], worker="me", lease_seconds=60)
    assert claimed.task_id == mine.task_id
    elsewhere = _sql(
        holder,
        "UPDATE tasks SET status_message = 'from elsewhere' WHERE task_id = ?",
        other.task_id,
    )
    verdicts.clear()
    write = await _complete_while(store, holder, mine.task_id, claimed.fence, elsewhere)
    done = await write
    assert verdicts == [True]
    assert (done.status, done.result) == (Status.COMPLETED, {"done": True})
    assert await store.get(mine.task_id) == done
    assert (await store.get(other.task_id)).status_message == "from elsewhere"
    history = await store.history(mine.task_id)
    assert [e.to_status for e in history] == [Status.WORKING] * 2 + [Status.COMPLETED]


LEASED_ELSEWHERE = (
    "UPDATE tasks SET fence = fence + 1, lease_owner = 'other', lease_expires_at = 1e12 "
    "WHERE task_id IN (SELECT value FROM json_each(?))"
)


async def _claim_while(
    store: SqliteStore, holder: sqlite3.Connection, limit: int, taken_elsewhere: list[str]
) -> list[str]:
    """Claim up to ``limit`` tasks while another writer leases ``taken_elsewhere``."""
    write = await _while_locked(
        store,
        holder,
        lambda: store.claim([JOB], worker="me", lease_seconds=60, limit=limit),
        _sql(holder, LEASED_ELSEWHERE, json.dumps(taken_elsewhere)),
    )
    return [t.task_id for t in await write]


async def test_a_planned_claim_takes_the_next_tasks_when_others_took_the_first(
    store, holder, verdicts
):
    """Under contention a planned claim reads spare ready tasks: when another writer
    claims the first ones while the plan waits, the claim takes the next ones, and no
    task is leased twice."""
    store.planner.contended = CLAIMS_CONTENDED  # as after a claim lost a task to another
    ids = [(await store.create(name=JOB, arguments={"n": n})).task_id for n in range(6)]
    verdicts.clear()
    assert await _claim_while(store, holder, 2, ids[:2]) == ids[2:4]
    assert verdicts[-1] is True  # the claim's own part was used
    owners = {t.task_id: t.lease_owner for t in await store.list(limit=10)}
    assert owners == dict(zip(ids, ["other", "other", "me", "me", None, None], strict=True))


@pytest.fixture
async def timed(
    db: Path, holder: sqlite3.Connection
) -> AsyncIterator[tuple[SqliteStore, FakeClock]]:
    """A store that plans every group, on a fake clock, after claims lost tasks to
    another process (so a planned claim works out only its spares). A task claimed as
    planned carries the plan's time; one claimed under the lock, the time after the
    test advanced the clock while the plan waited (less than PLAN_MAX_AGE)."""
    clock = FakeClock()
    opened = SqliteStore(db, clock=clock, plan="always")
    try:
        yield opened, clock
    finally:
        await opened.close()


async def _queue(store: SqliteStore, clock: FakeClock, count: int) -> list[str]:
    """``count`` ready tasks, each ready a millisecond after the one before."""
    ids = []
    for n in range(count):
        ids.append((await store.create(name=JOB, arguments={"n": n})).task_id)
        clock.advance(0.001)
    store.planner.contended = CLAIMS_CONTENDED  # as after a claim lost tasks to another
    return ids


def _later(clock: FakeClock, then: Callable[[], None]) -> Callable[[], None]:
    """While the plan waits: the clock moves on 10 ms, then ``then`` runs."""

    def run() -> None:
        clock.advance(0.01)
        then()

    return run


async def _claimed(store: SqliteStore, ids: list[str]) -> dict[str, tuple[Any, ...]]:
    """Per claimed task: (lease owner, fence, updated_at, claims in its history)."""
    out = {}
    for t in await store.list(limit=100):
        if t.task_id in ids and t.lease_owner is not None:
            history = await store.history(t.task_id)
            claims = sum(1 for e in history if e.reason.startswith("claimed"))
            out[t.task_id] = (t.lease_owner, t.fence, t.updated_at, claims)
    return out


async def test_a_contended_claim_takes_head_tasks_still_free_first(timed, holder, verdicts):
    """Under contention a plan reads twice the tasks it needs and works out only the
    second half (spares), expecting the head of the queue to go to the other process.
    Head tasks still free under the lock are claimed there; planned spares fill up the
    rest: the claim takes the first tasks still free, each claimed once."""
    store, clock = timed
    ids = await _queue(store, clock, 7)
    planned_at = clock()
    verdicts.clear()
    write = await _while_locked(
        store,
        holder,
        lambda: store.claim([JOB], worker="me", lease_seconds=60, limit=3),
        _later(clock, _sql(holder, LEASED_ELSEWHERE, json.dumps(ids[:1]))),
    )
    assert [t.task_id for t in await write] == ids[1:4]
    assert verdicts[-1] is False  # the claim went on under the lock
    live = planned_at + 0.01
    claimed = await _claimed(store, ids)
    assert claimed.pop(ids[0])[:2] == ("other", 1)
    assert claimed == {
        ids[1]: ("me", 1, live, 1),  # head, still free: under the lock
        ids[2]: ("me", 1, live, 1),
        ids[3]: ("me", 1, planned_at, 1),  # the first spare, as planned
    }


async def test_a_contended_claim_nobody_raced_takes_the_head(timed, holder, verdicts):
    """If the other process claimed nothing meanwhile, the whole head is still free: the
    claim takes it under the lock, and none of the spares it planned."""
    store, clock = timed
    ids = await _queue(store, clock, 4)
    planned_at = clock()
    write = await _while_locked(
        store,
        holder,
        lambda: store.claim([JOB], worker="me", lease_seconds=60, limit=2),
        _later(clock, lambda: None),
    )
    assert [t.task_id for t in await write] == ids[:2]
    live = planned_at + 0.01
    assert await _claimed(store, ids) == {ids[0]: ("me", 1, live, 1), ids[1]: ("me", 1, live, 1)}


async def test_contended_claims_in_one_group_never_take_a_task_twice(timed, holder, verdicts):
    """Two claims queued together, both planned: the second (limit 1) reads the first's
    head as its own head and spare. Another writer takes the first task meanwhile. The
    second claim takes its planned spare; the first takes its first spare as planned and
    the rest under the lock, around the second's. Every task is claimed once."""
    store, clock = timed
    ids = await _queue(store, clock, 8)
    planned_at = clock()

    async def both() -> list[Sequence[Task]]:
        return list(
            await asyncio.gather(
                store.claim([JOB], worker="me", lease_seconds=60, limit=3),
                store.claim([JOB], worker="me", lease_seconds=60, limit=1),
            )
        )

    verdicts.clear()
    write = await _while_locked(
        store, holder, both, _later(clock, _sql(holder, LEASED_ELSEWHERE, json.dumps(ids[:1])))
    )
    first, second = await write
    assert verdicts == [True, False, True]  # the group's first part; then each claim
    assert [t.task_id for t in first] == [ids[2], ids[3], ids[4]]
    assert [t.task_id for t in second] == [ids[1]]
    live = planned_at + 0.01
    claimed = await _claimed(store, ids)
    assert {tid: v for tid, v in claimed.items() if tid != ids[0]} == {
        ids[1]: ("me", 1, planned_at, 1),  # the second claim's spare, as planned
        ids[2]: ("me", 1, live, 1),
        ids[3]: ("me", 1, planned_at, 1),  # the first claim's first spare, as planned
        ids[4]: ("me", 1, live, 1),
    }


async def test_a_contended_claim_that_fails_under_the_lock_writes_nothing(timed, holder):
    """A claim that took planned spares and then fails claiming the rest under the lock
    (here a head task's row cannot be decoded) writes nothing: not even the spares it
    took. The store is as the other writer left it."""
    store, clock = timed
    ids = await _queue(store, clock, 7)
    holder.execute(
        "UPDATE tasks SET input_responses = '{bad' WHERE task_id = ?", (ids[2],)
    )  # a row the plan reads but does not decode (head); the claim under the lock does
    write = await _while_locked(
        store,
        holder,
        lambda: store.claim([JOB], worker="me", lease_seconds=60, limit=3),
        _sql(holder, LEASED_ELSEWHERE, json.dumps(ids[:1])),
    )
    with pytest.raises(json.JSONDecodeError):
        await write
    # Read with SQL: the store itself cannot list the row made undecodable.
    leased = holder.execute("SELECT task_id, lease_owner FROM tasks WHERE lease_owner IS NOT NULL")
    assert leased.fetchall() == [(ids[0], "other")]  # only the other writer's
    claims = holder.execute("SELECT count(*) FROM task_events WHERE reason LIKE 'claimed%'")
    assert claims.fetchone() == (0,)


async def test_a_planned_claim_whose_tasks_are_all_gone_claims_under_the_lock(
    store, holder, verdicts
):
    """Without contention a plan reads no spares; if another writer takes every task it
    planned to claim, the claim runs under the lock and finds the ones still ready."""
    ids = [(await store.create(name=JOB, arguments={"n": n})).task_id for n in range(3)]
    verdicts.clear()
    assert await _claim_while(store, holder, 1, ids[:1]) == ids[1:2]
    assert verdicts[-1] is False
    assert store.planner.contended == CLAIMS_CONTENDED  # spares from now on


async def test_a_key_bound_elsewhere_while_the_plan_waited_is_seen(store, holder, verdicts):
    """A create with an idempotency key planned while the key was free, bound by another
    writer before the lock came, is not inserted as planned (the unique index refuses
    it): it runs again under the lock and meets the other task, as any late create does."""
    bound_elsewhere = _sql(
        holder,
        "INSERT INTO tasks (task_id, status, owner, name, arguments, created_at, updated_at, "
        "idempotency_key, ready_at) "
        "VALUES ('elsewhere', 'working', '', 'other-job', '{}', 1, 1, 'k', 1)",
    )
    verdicts.clear()
    write = await _while_locked(
        store, holder, lambda: store.create(name=JOB, idempotency_key="k"), bound_elsewhere
    )
    with pytest.raises(IdempotencyConflict) as refused:
        await write
    assert refused.value.task_id == "elsewhere"
    assert verdicts == [False]
    assert [t.task_id for t in await store.list(limit=10)] == ["elsewhere"]


async def test_writes_of_one_group_to_the_same_task_see_each_other(store, verdicts):
    """Writes queued together are planned together: a status message and the completion
    of the same task, and two creates with the same idempotency key, end exactly as if
    run one after the other."""
    await store.create(name=JOB)
    [task] = await store.claim([JOB], worker="me", lease_seconds=60)
    verdicts.clear()
    said, done, first, again = await asyncio.gather(
        store.set_status_message(task.task_id, "almost", fence=task.fence),
        store.complete(task.task_id, {"ok": 1}, fence=task.fence),
        store.create(name=JOB, idempotency_key="same"),
        store.create(name=JOB, idempotency_key="same"),
    )
    assert verdicts == [True]  # one group, one plan, used
    assert said.status_message == "almost"
    assert (done.status, done.status_message, done.result) == (
        Status.COMPLETED,
        "almost",
        {"ok": 1},
    )
    assert await store.get(task.task_id) == done
    assert first.task_id == again.task_id
    keyed = [t for t in await store.list(limit=10) if t.idempotency_key == "same"]
    assert [t.task_id for t in keyed] == [first.task_id]
    history = await store.history(task.task_id)
    assert [e.to_status for e in history].count(Status.COMPLETED) == 1
    assert history[-1].to_status is Status.COMPLETED


async def test_a_store_alone_does_not_plan_until_another_writer_appears(db, verdicts):
    """Planning pays only when others wait for the lock: a store that is the file's only
    writer runs its groups without a plan, and plans once another connection commits."""
    store = SqliteStore(db)
    other = None
    try:
        for _ in range(3):
            await store.create(name=JOB)
        assert verdicts == []
        other = SqliteStore(db)  # opened now: it has seen every commit so far
        await other.create(name=JOB)
        await store.create(name=JOB)
        assert verdicts == [True]
    finally:
        await store.close()
        if other is not None:
            await other.close()


async def test_a_plan_that_waited_long_for_the_lock_is_not_used(db, holder, verdicts):
    """A plan records times (a lease's expiry, updated_at, history) when it is made. One
    that waited longer than PLAN_MAX_AGE for the lock is not used: the claim is worked
    out again under the lock, and its lease runs from then, not from before the wait."""
    clock = FakeClock()
    store = SqliteStore(db, clock=clock, plan="always")
    try:
        await store.create(name=JOB)
        verdicts.clear()
        write = await _while_locked(
            store,
            holder,
            lambda: store.claim([JOB], worker="me", lease_seconds=5),
            lambda: clock.advance(60),  # the lock was held for a minute
        )
        [got] = await write
        assert got.lease_expires_at == clock() + 5
        assert verdicts == []  # the plan was not even checked
    finally:
        await store.close()


async def test_a_claim_short_of_tasks_others_took_fills_up_under_the_lock(store, holder):
    """A planned claim (no spares) that lost one of its tasks to another writer does not
    come back short while other tasks are ready: it claims under the lock instead."""
    ids = [(await store.create(name=JOB, arguments={"n": n})).task_id for n in range(4)]
    assert await _claim_while(store, holder, 2, ids[:1]) == ids[1:3]


async def test_a_key_lookup_sees_a_task_written_earlier_in_the_group(store):
    """A create whose idempotency key is bound to a task that the same group cancels
    before it answers as it would without a plan: with the cancelled task."""
    task = await store.create(name=JOB, idempotency_key="k")
    cancelled, again = await asyncio.gather(
        store.cancel(task.task_id), store.create(name=JOB, idempotency_key="k")
    )
    assert cancelled.status is Status.CANCELLED
    assert again == cancelled


async def test_a_group_that_failed_after_writing_retries_each_write_waiting_for_the_lock(
    db, holder, monkeypatch
):
    """When a write fails after writing, the group is rolled back and each write retried
    on its own. If another process takes the lock in between, the retries wait for it
    (in a thread, not on the event loop) instead of failing as "busy": only the write
    that failed fails."""
    store = SqliteStore(db)  # the file's only writer: the group runs without a plan
    rollback = Connection.rollback
    taken: list[bool] = []

    def rollback_then_lose_the_lock(self: Connection) -> None:
        writing = self.sql.in_transaction and not taken
        rollback(self)
        if writing:  # another process takes the lock right after the group's rollback
            taken.append(True)
            holder.execute("BEGIN IMMEDIATE")

    def fails_after_writing(tx: Any) -> None:
        tx.put_step("no-such-task", "step", "1", 0.0)  # refused by the foreign key

    try:
        await store.create(name=JOB)  # the reads below begin no write transaction
        monkeypatch.setattr(Connection, "rollback", rollback_then_lose_the_lock)
        created = asyncio.ensure_future(store.create(name=JOB))
        failed = asyncio.ensure_future(store._run(Op(fails_after_writing), write=True))
        await _until(lambda: bool(taken) and _in_thread(store), "the retries wait for the lock")
        holder.execute("COMMIT")
        task = await created
        assert task.status is Status.WORKING
        with pytest.raises(StoreError, match="FOREIGN KEY"):
            await failed
        monkeypatch.undo()
        assert task.task_id in [t.task_id for t in await store.list(limit=10)]
    finally:
        await store.close()


async def test_plan_off_never_plans_even_with_another_writer(db, holder, verdicts):
    """``plan="off"``: the groups of a store whose file another connection writes run
    under the lock, without a plan, and still do what they should."""
    store = SqliteStore(db, plan="off")
    try:
        first = await store.create(name=JOB)
        holder.execute("UPDATE tasks SET status_message = 'elsewhere'")  # another writer
        created = await store.create(name=JOB)
        [claimed] = await store.claim([JOB], worker="me", lease_seconds=60)
        assert verdicts == []
        assert created.status is Status.WORKING
        assert claimed.task_id == first.task_id
        assert claimed.status_message == "elsewhere"
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("query", "mode"),
    [("", PlanMode.AUTO), ("?plan=auto", PlanMode.AUTO), ("?plan=off", PlanMode.OFF)],
)
async def test_the_store_url_chooses_when_to_plan(db, query, mode):
    """``?plan=auto|off`` in a ``sqlite:`` URL reaches the store's planner (auto if absent)."""
    store = open_store(f"sqlite:///{db}{query}")
    try:
        assert isinstance(store, SqliteStore)
        assert store.planner.mode is mode
    finally:
        await store.close()


def test_an_unknown_plan_mode_is_a_configuration_error(db):
    """A misspelt ``?plan=`` is refused when the store opens, naming the choices."""
    with pytest.raises(ConfigurationError, match="plan must be 'auto' or 'off'"):
        open_store(f"sqlite:///{db}?plan=sometimes")
