"""Contract: reclaim, purge, list, history, size limits and import, on every adapter."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from keel import (
    ImportFailed,
    InvalidPayload,
    PayloadTooLarge,
    Reclaimed,
    Status,
    Task,
    TaskNotFound,
)
from keel.model import INTERNAL_ERROR, Limits

from .support import ERROR, JOB, LEASE, WORKER, ask, claimed, everything, refused

pytestmark = pytest.mark.anyio


# --- reclaim ----------------------------------------------------------------------------


async def test_reclaim_fails_stale_live_tasks_and_explains_each(store, clock):
    """reclaim fails every live task idle past the timeout and returns why, task by task."""
    working = await store.create()
    waiting = await store.create(input_requests={"svc": ask()})
    clock.advance(100)
    [first, second] = await store.reclaim(60)
    by_id = {r.task_id: r for r in (first, second)}
    assert by_id[working.task_id] == Reclaimed(
        working.task_id, Status.WORKING, 100.0, by_id[working.task_id].reason
    )
    assert by_id[waiting.task_id].previous_status is Status.INPUT_REQUIRED
    assert by_id[waiting.task_id].idle_seconds == 100.0
    for task in (working, waiting):
        reason = by_id[task.task_id].reason
        assert "100" in reason
        assert "60" in reason
        got = await store.get(task.task_id)
        assert got.status is Status.FAILED
        assert got.updated_at == clock.now
        assert got.error == {"code": INTERNAL_ERROR, "message": reason}
        event = (await store.history(task.task_id))[-1]
        assert (event.from_status, event.to_status) == (task.status, Status.FAILED)
        assert (event.actor, event.reason) == ("reclaim", reason)


async def test_reclaim_leaves_finished_and_fresh_tasks_untouched(store, clock):
    """Completed, failed, cancelled and recently updated tasks survive reclaim unchanged."""
    done = await store.create()
    await store.complete(done.task_id, {"ok": True})
    failed = await store.create()
    await store.fail(failed.task_id, ERROR)
    cancelled = await store.create()
    await store.cancel(cancelled.task_id)
    stale = await store.create()
    clock.advance(100)
    await store.create()
    await store.create(input_requests={"svc": ask()})
    touched = await store.create()
    clock.advance(1)
    await store.set_status_message(touched.task_id, "still alive")
    before = {t.task_id: entry for entry in await everything(store) for t in [entry[0]]}
    reclaimed = await store.reclaim(60)
    assert [r.task_id for r in reclaimed] == [stale.task_id]
    after = {t.task_id: entry for entry in await everything(store) for t in [entry[0]]}
    del before[stale.task_id], after[stale.task_id]
    assert after == before


async def test_reclaim_fails_a_stale_leased_task_and_drops_its_lease(store, clock):
    """A running task whose worker stopped updating it is reclaimed and loses its lease."""
    lease = await claimed(store)
    clock.advance(1000)
    [why] = await store.reclaim(600)
    assert why.task_id == lease.task_id
    got = await store.get(lease.task_id)
    assert (got.status, got.leased, got.lease_expires_at) == (Status.FAILED, False, None)


async def test_reclaim_at_exactly_the_timeout_keeps_the_task(store, clock):
    """A task idle exactly the timeout is not stale yet (more than the timeout is)."""
    await store.create()
    clock.advance(60)
    assert await store.reclaim(60) == []
    clock.advance(0.5)
    assert len(await store.reclaim(60)) == 1


async def test_reclaim_twice_changes_nothing_the_second_time(store, clock):
    """A second reclaim finds nothing: reclaimed tasks are failed, hence terminal."""
    await store.create()
    clock.advance(100)
    assert len(await store.reclaim(10)) == 1
    before = await everything(store)
    assert await store.reclaim(10) == []
    assert await everything(store) == before


@pytest.mark.parametrize("seconds", [-1, math.nan, math.inf, "60"])
async def test_reclaim_refuses_a_bad_timeout(store, seconds):
    """reclaim with a negative, non-finite or non-number timeout raises InvalidPayload."""
    await store.create()
    await refused(store, InvalidPayload, lambda: store.reclaim(seconds))


# --- purge ------------------------------------------------------------------------------


async def test_purge_deletes_only_finished_tasks_past_their_ttl(store, clock):
    """purge deletes finished tasks whose created_at + ttl passed, never live ones."""
    done = await store.create(ttl=10)
    await store.complete(done.task_id, 1)
    failed = await store.create(ttl=10)
    await store.fail(failed.task_id, ERROR)
    cancelled = await store.create(ttl=10)
    await store.cancel(cancelled.task_id)
    kept_long = await store.create(ttl=1000)
    await store.complete(kept_long.task_id, 1)
    kept_forever = await store.create()
    await store.complete(kept_forever.task_id, 1)
    live = [
        await store.create(ttl=0),
        await store.create(ttl=5, input_requests={"svc": ask()}),
        await claimed(store, ttl=1),
    ]
    assert await store.purge() == []
    clock.advance(11)
    survivors = {t.task_id for t in await store.list()} - {
        done.task_id,
        failed.task_id,
        cancelled.task_id,
    }
    before = [e for e in await everything(store) if e[0].task_id in survivors]
    purged = await store.purge()
    assert sorted(purged) == sorted([done.task_id, failed.task_id, cancelled.task_id])
    assert await everything(store) == before
    assert {t.task_id for t in live} <= survivors
    assert await store.purge() == []


async def test_purge_takes_history_and_steps_with_the_task(store, clock):
    """A purged task is gone with its history and steps: every read says TaskNotFound."""
    lease = await claimed(store, ttl=5)
    await store.save_step(lease.task_id, "s", 1, fence=lease.fence)
    await store.complete(lease.task_id, 1, fence=lease.fence)
    clock.advance(6)
    assert await store.purge() == [lease.task_id]
    for read in (store.get, store.history, store.steps):
        with pytest.raises(TaskNotFound):
            await read(lease.task_id)
    # Importing the same id again must not resurrect the old history or steps.
    await store.import_tasks([dataclasses.replace(lease, status=Status.WORKING, ttl=None)])
    assert await store.steps(lease.task_id) == {}
    assert [e.reason for e in await store.history(lease.task_id)] == ["imported"]


async def test_purge_frees_the_idempotency_key(store, clock):
    """After its task is purged, an idempotency key creates a new task."""
    first = await store.create(idempotency_key="k", arguments={"a": 1}, ttl=1)
    await store.complete(first.task_id, 1)
    clock.advance(2)
    assert await store.create(idempotency_key="k", arguments={"a": 1}) == (
        await store.get(first.task_id)
    ), "the key stays bound until the purge"
    assert await store.purge() == [first.task_id]
    second = await store.create(idempotency_key="k", arguments={"a": 2})
    assert second.task_id != first.task_id
    assert second.status is Status.WORKING


async def test_purge_honours_its_limit(store, clock):
    """purge deletes at most ``limit`` tasks per call."""
    for _ in range(3):
        task = await store.create(ttl=1)
        await store.cancel(task.task_id)
    clock.advance(2)
    assert len(await store.purge(limit=2)) == 2
    assert len(await store.purge(limit=2)) == 1
    assert await store.list() == []


# --- counts -----------------------------------------------------------------------------


async def test_counts_are_every_status_zeros_included(store):
    """counts() names every status, with 0 for those no task has: an empty store is all
    zeros, and each task counts once, in its current status."""
    assert await store.counts() == dict.fromkeys(Status, 0)
    await store.create()
    await store.create(input_requests={"svc": ask()})
    done = await claimed(store)
    await store.complete(done.task_id, {"content": []}, fence=done.fence)
    cancelled = await store.create()
    await store.cancel(cancelled.task_id)
    before = await everything(store)
    counts = await store.counts()
    assert counts == {
        **dict.fromkeys(Status, 0),
        Status.WORKING: 1,
        Status.INPUT_REQUIRED: 1,
        Status.COMPLETED: 1,
        Status.CANCELLED: 1,
    }
    assert await everything(store) == before, "counting changes nothing"


# --- list -------------------------------------------------------------------------------


async def _five(store, clock) -> list[Task]:
    tasks = []
    for i in range(5):
        tasks.append(await store.create(owner="alice" if i % 2 else "bob"))
        clock.advance(1)
    return tasks


async def test_list_is_in_creation_order(store, clock):
    """list returns tasks oldest first."""
    tasks = await _five(store, clock)
    assert list(await store.list()) == tasks


async def test_list_is_in_creation_order_within_one_clock_tick(store):
    """Tasks created at the same clock reading still list in creation order."""
    ids = [(await store.create()).task_id for _ in range(10)]
    assert [t.task_id for t in await store.list()] == ids
    assert [t.task_id for t in await store.list(limit=3, after=ids[4])] == ids[5:8]


async def test_claim_is_in_creation_order_within_one_clock_tick(store):
    """Tasks ready at the same instant are claimed in the order they were created."""
    ids = [(await store.create(name=JOB)).task_id for _ in range(10)]
    got = await store.claim([JOB], worker=WORKER, lease_seconds=LEASE, limit=10)
    assert [t.task_id for t in got] == ids


async def test_list_pages_with_after(store, clock):
    """Pages of ``limit`` tasks, each continuing after the last id of the previous one."""
    tasks = await _five(store, clock)
    seen, after = [], None
    while page := await store.list(limit=2, after=after):
        assert len(page) <= 2
        seen.extend(page)
        after = page[-1].task_id
    assert seen == tasks


async def test_list_filters_by_status_and_owner(store, clock):
    """status and owner filters combine, and paging works under a filter."""
    tasks = await _five(store, clock)
    await store.complete(tasks[1].task_id, 1)
    await store.complete(tasks[4].task_id, 1)
    done = [t.task_id for t in await store.list(status=Status.COMPLETED)]
    assert done == [tasks[1].task_id, tasks[4].task_id]
    assert [t.task_id for t in await store.list(owner="alice")] == [
        tasks[1].task_id,
        tasks[3].task_id,
    ]
    assert [t.task_id for t in await store.list(owner="bob", status=Status.WORKING)] == [
        tasks[0].task_id,
        tasks[2].task_id,
    ]
    assert [t.task_id for t in await store.list(status=Status.WORKING, after=tasks[0].task_id)] == [
        tasks[2].task_id,
        tasks[3].task_id,
    ]
    assert await store.list(owner="nobody") == []


async def test_list_accepts_a_status_by_its_wire_name(store):
    """list(status="input_required") works like the enum member."""
    waiting = await store.create(input_requests={"svc": ask()})
    await store.create()
    assert [t.task_id for t in await store.list(status="input_required")] == [waiting.task_id]


async def test_list_limit_zero_is_empty(store):
    """list(limit=0) returns nothing."""
    await store.create()
    assert await store.list(limit=0) == []


# --- history ----------------------------------------------------------------------------


async def test_history_explains_a_whole_life_and_only_grows(store, clock):
    """Each transition appends one event (from, to, reason, actor); earlier ones never change."""
    task = await store.create(name=JOB, max_attempts=2, input_requests={"svc": ask()})
    seen = list(await store.history(task.task_id))

    async def step(expect_from, expect_to, actor, words):
        clock.advance(1)
        history = list(await store.history(task.task_id))
        assert history[: len(seen)] == seen, "history is append-only"
        assert len(history) == len(seen) + 1
        event = history[-1]
        assert (event.from_status, event.to_status) == (expect_from, expect_to)
        assert event.actor == actor
        assert event.task_id == task.task_id
        assert event.at == clock.now - 1
        assert words in event.reason
        seen.append(event)

    W, IR, C = Status.WORKING, Status.INPUT_REQUIRED, Status.COMPLETED
    await store.provide_input(task.task_id, {"svc": {"service": "payments"}}, actor="human")
    await step(IR, W, "human", "received")
    [lease] = await store.claim([JOB], worker=WORKER, lease_seconds=LEASE)
    await step(W, W, f"worker:{WORKER}", "claimed")
    await store.retry(task.task_id, ERROR, fence=lease.fence, delay_seconds=0)
    await step(W, W, f"worker:{WORKER}", "attempt 1/2 failed")
    [lease] = await store.claim([JOB], worker="w2", lease_seconds=LEASE)
    await step(W, W, "worker:w2", "claimed")
    await store.request_input(task.task_id, {"more": ask()}, fence=lease.fence)
    await step(W, IR, "worker:w2", "more")
    await store.provide_input(task.task_id, {"more": {"service": "db"}})
    await step(IR, W, "client", "received")
    [lease] = await store.claim([JOB], worker="w3", lease_seconds=LEASE)
    await step(W, W, "worker:w3", "claimed")
    await store.complete(task.task_id, {"ok": True}, fence=lease.fence)
    await step(W, C, "worker:w3", "completed")
    assert [e.at for e in seen] == sorted(e.at for e in seen)


async def test_history_is_per_task(store):
    """A task's history holds only its own events."""
    a = await store.create()
    b = await store.create()
    await store.complete(b.task_id, 1)
    assert [e.task_id for e in await store.history(a.task_id)] == [a.task_id]
    assert {e.task_id for e in await store.history(b.task_id)} == {b.task_id}


# --- size limits ------------------------------------------------------------------------

SMALL = Limits(max_arguments_bytes=64, max_input_bytes=64, max_result_bytes=64, max_step_bytes=64)


def _sized(n: int) -> dict[str, str]:
    """A JSON object whose compact encoding is exactly ``n`` bytes."""
    value = {"v": "x" * (n - len('{"v":""}'))}
    assert len(json.dumps(value, separators=(",", ":"))) == n
    return value


async def test_arguments_over_the_limit_are_refused(make_store):
    """Arguments one byte over the limit raise PayloadTooLarge; at the limit they pass."""
    store = make_store(limits=SMALL)
    await store.create(arguments=_sized(64))
    error = await refused(store, PayloadTooLarge, lambda: store.create(arguments=_sized(65)))
    assert (error.what, error.size, error.limit) == ("arguments", 65, 64)
    assert "65" in str(error)
    assert "64" in str(error)


async def test_size_is_counted_in_utf8_bytes(make_store):
    """Sizes are bytes of UTF-8, not characters: 30 two-byte characters exceed 64 bytes."""
    store = make_store(limits=SMALL)
    await refused(store, PayloadTooLarge, lambda: store.create(arguments={"v": "é" * 30}))


async def test_input_over_the_limit_is_refused(make_store):
    """An answer over the input limit raises PayloadTooLarge; the task keeps waiting."""
    store = make_store(limits=SMALL)
    task = await store.create(input_requests={"any": ask(schema={})})
    await refused(
        store, PayloadTooLarge, lambda: store.provide_input(task.task_id, {"any": _sized(65)})
    )
    got = await store.provide_input(task.task_id, {"any": _sized(64)})
    assert got.status is Status.WORKING


async def test_result_over_the_limit_is_refused(make_store):
    """A result over the limit raises PayloadTooLarge; the task stays working."""
    store = make_store(limits=SMALL)
    task = await store.create()
    error = await refused(store, PayloadTooLarge, lambda: store.complete(task.task_id, _sized(65)))
    assert error.what == "result"
    assert (await store.complete(task.task_id, _sized(64))).status is Status.COMPLETED


async def test_error_over_the_limit_is_refused(make_store):
    """A failure whose error is over the result limit raises PayloadTooLarge."""
    store = make_store(limits=SMALL)
    task = await store.create()
    await refused(
        store,
        PayloadTooLarge,
        lambda: store.fail(task.task_id, {"code": 1, "message": "m", "data": "x" * 64}),
    )


async def test_step_value_over_the_limit_is_refused(make_store):
    """A step value over the limit raises PayloadTooLarge; nothing is recorded."""
    store = make_store(limits=SMALL)
    lease = await claimed(store)
    await refused(
        store,
        PayloadTooLarge,
        lambda: store.save_step(lease.task_id, "s", _sized(65), fence=lease.fence),
    )
    await store.save_step(lease.task_id, "s", _sized(64), fence=lease.fence)
    assert await store.steps(lease.task_id) == {"s": _sized(64)}


async def test_names_over_the_limit_are_refused(make_store):
    """Task names, keys and owners longer than max_name_chars raise InvalidPayload."""
    store = make_store(limits=Limits(max_name_chars=8))
    for kwargs in ({"name": "n" * 9}, {"idempotency_key": "k" * 9}, {"owner": "o" * 9}):
        await refused(store, InvalidPayload, lambda kw=kwargs: store.create(**kw))
    await store.create(name="n" * 8, idempotency_key="k" * 8, owner="o" * 8)


async def test_cancel_reason_over_the_limit_is_refused(make_store):
    """A cancel reason longer than max_message_chars raises InvalidPayload."""
    store = make_store(limits=Limits(max_message_chars=10))
    task = await store.create()
    with pytest.raises(InvalidPayload):
        await store.cancel(task.task_id, reason="r" * 50)


# --- import -----------------------------------------------------------------------------


def _task(task_id: str, clock, **changes) -> Task:
    base = Task(
        task_id=task_id,
        status=Status.WORKING,
        owner="",
        name=None,
        arguments={"from": "seed"},
        created_at=clock.now - 100,
        updated_at=clock.now - 50,
    )
    return dataclasses.replace(base, **changes)


async def test_import_stores_tasks_as_they_are(store, clock):
    """import_tasks stores whole tasks verbatim (trace context and claim time included),
    with one "imported" event each."""
    tasks = [
        _task("t-working", clock),
        _task(
            "t-waiting",
            clock,
            status=Status.INPUT_REQUIRED,
            input_requests={"input": ask()},
            idempotency_key="incident-1",
        ),
        _task(
            "t-done",
            clock,
            status=Status.COMPLETED,
            result={"summary": "ok"},
            trace_context={"traceparent": f"00-{'1' * 32}-{'2' * 16}-01"},
            claimed_at=clock.now - 60,
        ),
    ]
    await store.import_tasks(tasks, actor="cli")
    for task in tasks:
        got = await store.get(task.task_id)
        # The store fingerprints the create request of imported tasks too (idempotency).
        assert dataclasses.replace(got, request_digest=task.request_digest) == task
        [event] = await store.history(task.task_id)
        assert (event.from_status, event.to_status) == (None, task.status)
        assert (event.reason, event.actor, event.at) == ("imported", "cli", clock.now)
    again = await store.create(
        arguments={"from": "seed"}, idempotency_key="incident-1", input_requests={"input": ask()}
    )
    assert again.task_id == "t-waiting", "imported idempotency keys are bound"


async def test_import_is_all_or_none(store, clock):
    """If one task cannot be imported, none is: ImportFailed names every problem."""
    existing = await store.create(idempotency_key="taken")
    batch = [
        _task("new-1", clock),
        _task(existing.task_id, clock),
        _task("new-2", clock, idempotency_key="taken"),
    ]
    error = await refused(store, ImportFailed, lambda: store.import_tasks(batch))
    assert len(error.problems) == 2
    assert existing.task_id in error.problems[0]
    assert "taken" in error.problems[1]
    with pytest.raises(TaskNotFound):
        await store.get("new-1")


async def test_import_nothing_is_fine(store):
    """Importing an empty list changes nothing."""
    before = await everything(store)
    await store.import_tasks([])
    assert await everything(store) == before


async def test_import_refuses_duplicate_ids_within_the_batch(store, clock):
    """Two tasks with one id in the same batch raise ImportFailed; nothing is stored."""
    await refused(
        store, ImportFailed, lambda: store.import_tasks([_task("dup", clock), _task("dup", clock)])
    )


async def test_import_refuses_duplicate_keys_within_the_batch(store, clock):
    """Two tasks bound to one idempotency key in one batch raise ImportFailed."""
    batch = [_task("a", clock, idempotency_key="k"), _task("b", clock, idempotency_key="k")]
    await refused(store, ImportFailed, lambda: store.import_tasks(batch))


@pytest.mark.parametrize("value", [{1, 2}, math.nan], ids=["set", "nan"])
async def test_import_refuses_non_json_payloads(store, clock, value):
    """A task whose arguments JSON cannot hold raises InvalidPayload; nothing is stored."""
    await refused(
        store,
        InvalidPayload,
        lambda: store.import_tasks([_task("bad", clock, arguments={"v": value})]),
    )


IMPOSSIBLE = {
    "leased-completed": {"status": Status.COMPLETED, "lease_owner": "w", "lease_expires_at": 1.0},
    "lease-without-expiry": {"lease_owner": "w"},
    "failed-without-error": {"status": Status.FAILED},
    "error-on-working": {"error": {"code": 1, "message": "m"}},
    "waiting-for-nothing": {"status": Status.INPUT_REQUIRED},
    "answer-to-nothing": {"input_responses": {"x": 1}},
    "attempt-zero": {"attempt": 0},
    "bad-error": {"status": Status.FAILED, "error": {"message": "no code"}},
    "arguments-not-object": {"arguments": [1]},
}


@pytest.mark.parametrize("changes", IMPOSSIBLE.values(), ids=IMPOSSIBLE.keys())
async def test_import_refuses_an_impossible_task(store, clock, changes):
    """A task that could not exist raises InvalidPayload naming it; nothing is stored."""
    batch = [_task("fine", clock), _task("bad", clock, **changes)]
    error = await refused(store, InvalidPayload, lambda: store.import_tasks(batch))
    assert "bad" in str(error)


# --- close ------------------------------------------------------------------------------


async def test_close_twice_is_safe(store):
    """close() may be called twice."""
    await store.create()
    await store.close()
    await store.close()


async def test_a_task_finishing_after_its_ttl_is_kept_ttl_after_it_finished(store, clock):
    """A task that outlives its ttl is not purged when it ends: it is kept ttl after that."""
    task = await store.create(ttl=60)
    clock.advance(600)  # still working, long past created_at + ttl
    assert await store.purge() == []
    done = await store.complete(task.task_id, {"ok": True})
    assert done.expires_at == clock.now + 60
    assert await store.purge() == []  # the client can still read the outcome
    clock.advance(61)
    assert await store.purge() == [task.task_id]
