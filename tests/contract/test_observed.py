"""Contract: a store's observer hears exactly what each write committed, on every adapter.

The metrics of :mod:`keel.telemetry.metrics` are counted from what the store commits
(:mod:`keel.store.observed`): idempotent repeats, refused writes and reads count nothing.
A known workload, every counter checked.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from contract.support import ERROR, LEASE, FakeClock, ask
from keel.errors import InvalidPayload, TaskAlreadyTerminal
from keel.model import Status
from keel.store import Store, TxStore
from keel.store.observed import Committed
from keel.telemetry.metrics import Metrics

pytestmark = pytest.mark.anyio


class Heard:
    """An observer that keeps every commit it hears of."""

    def __init__(self) -> None:
        self.commits: list[Committed] = []

    def committed(self, commit: Committed) -> None:
        self.commits.append(commit)


def observed(store: Store) -> tuple[Metrics, Heard]:
    assert isinstance(store, TxStore)
    metrics, heard = Metrics(), Heard()

    class Both:
        def committed(self, commit: Committed) -> None:
            metrics.committed(commit)
            heard.committed(commit)

    store.observer = Both()
    return metrics, heard


def value(metrics: Metrics, name: str, **labels: str) -> float:
    got = metrics.registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


async def test_a_create_and_its_idempotent_repeat_are_heard_of_once(store: Store) -> None:
    """One create commits one transition; the repeat with the same key commits none."""
    metrics, heard = observed(store)
    first = await store.create(name="job", idempotency_key="k")
    again = await store.create(name="job", idempotency_key="k")
    assert again.task_id == first.task_id
    assert [len(c.transitions) for c in heard.commits] == [1, 0]
    transition = heard.commits[0].transitions[0]
    assert transition.old is None
    assert transition.new == first
    assert transition.event.to_status is Status.WORKING
    assert value(metrics, "keel_tasks_created_total", tool="job") == 1


async def test_a_leased_complete_is_heard_of_with_its_history_row_and_both_tasks(
    store: Store, clock: FakeClock
) -> None:
    """The commit record of a worker's complete: one transition whose event is the
    history row stored, whose old task is the claimed one and new task the one returned
    (the records are built without their __init__: keel.store.observed.committed)."""
    await store.create(name="job")
    (held,) = await store.claim(["job"], worker="w1", lease_seconds=LEASE)
    _, heard = observed(store)
    now = clock.advance(2)
    done = await store.complete(held.task_id, {"ok": 1}, fence=held.fence)
    (commit,) = heard.commits
    assert (commit.what, commit.result) == ("complete", done)
    assert type(commit) is Committed
    assert commit.seconds >= 0
    (transition,) = commit.transitions
    assert transition.old == held
    assert transition.new == done
    assert transition.task == done
    (*_, stored) = await store.history(held.task_id)
    assert transition.event == stored
    assert (stored.from_status, stored.to_status, stored.at) == (
        Status.WORKING,
        Status.COMPLETED,
        now,
    )
    assert stored.actor == "worker:w1"


async def test_every_counter_is_exact_after_a_known_workload(
    store: Store, clock: FakeClock
) -> None:
    """Creates, claims, completions, retries, a dead letter, input, a cancel and a lease
    expiry, with repeats and refused writes among them: each counted exactly once."""
    metrics, _ = observed(store)
    a = await store.create(name="job", idempotency_key="a")
    await store.create(name="job", idempotency_key="a")  # repeat: not a new task
    b = await store.create(name="job", max_attempts=2)
    c = await store.create(name="other", input_requests={"svc": ask()})
    clock.advance(5)
    claimed = await store.claim(["job"], worker="w1", lease_seconds=LEASE, limit=10)
    assert {t.task_id for t in claimed} == {a.task_id, b.task_id}
    by_id = {t.task_id: t for t in claimed}
    clock.advance(2)
    await store.complete(a.task_id, {"ok": True}, fence=by_id[a.task_id].fence)
    await store.complete(a.task_id, {"ok": True}, fence=by_id[a.task_id].fence)  # repeat
    await store.retry(b.task_id, ERROR, fence=by_id[b.task_id].fence, delay_seconds=0)
    (b2,) = await store.claim(["job"], worker="w1", lease_seconds=LEASE)
    clock.advance(1)
    await store.retry(b.task_id, ERROR, fence=b2.fence, delay_seconds=0)  # the last attempt
    clock.advance(7)
    await store.provide_input(c.task_id, {"svc": {"service": "db"}})
    (c1,) = await store.claim(["other"], worker="w2", lease_seconds=LEASE)
    await store.cancel(c.task_id)
    await store.cancel(c.task_id)  # cancelling a cancelled task returns it
    with pytest.raises(TaskAlreadyTerminal):
        await store.complete(c.task_id, 1, fence=c1.fence)  # refused: counts nothing
    d = await store.create(name="job")
    await store.claim(["job"], worker="w3", lease_seconds=LEASE)
    clock.advance(LEASE + 1)
    assert [t.task_id for t in await store.recover_expired()] == [d.task_id]

    expected = {
        ("keel_tasks_created_total", "job"): 3,
        ("keel_tasks_created_total", "other"): 1,
        ("keel_tasks_completed_total", "job"): 1,
        ("keel_tasks_failed_total", "job"): 2,  # b dead-lettered, d's lease expired
        ("keel_tasks_dead_lettered_total", "job"): 2,
        ("keel_task_retries_total", "job"): 1,
        ("keel_lease_expiries_total", "job"): 1,
        ("keel_tasks_cancelled_total", "other"): 1,
        ("keel_task_input_requests_total", "other"): 1,
        ("keel_tasks_completed_total", "other"): 0,
        ("keel_queue_wait_seconds_count", "job"): 4,
        ("keel_queue_wait_seconds_count", "other"): 1,
        ("keel_input_wait_seconds_count", "other"): 1,
        ("keel_input_wait_seconds_sum", "other"): 15,  # created at 0, answered at 15
    }
    got = {key: value(metrics, key[0], tool=key[1]) for key in expected}
    assert got == expected
    assert value(metrics, "keel_queue_wait_seconds_sum", tool="job") == 5 + 5 + 0 + 0
    assert value(metrics, "keel_claim_batch_size_count") == 4
    assert value(metrics, "keel_claim_batch_size_sum") == 2 + 1 + 1 + 1
    outcomes = {
        outcome: value(metrics, "keel_attempt_duration_seconds_count", tool=tool, outcome=outcome)
        for tool, outcome in [
            ("job", "completed"),
            ("job", "error"),
            ("other", "cancelled"),
            ("job", "recovered"),
        ]
    }
    assert outcomes == {"completed": 1, "error": 2, "cancelled": 1, "recovered": 1}
    assert value(metrics, "keel_attempt_duration_seconds_sum", tool="job", outcome="completed") == 2
    assert value(metrics, "keel_store_commit_seconds_count", op="create") == 5


async def test_a_trace_context_is_kept_with_the_task_and_out_of_its_steps(
    store: Store, clock: FakeClock
) -> None:
    """create(trace_context=…) keeps it on the task, in the same transaction; steps()
    know nothing of it; a repeat of the create keeps the first one; every later write
    and every read (a claim included) carries it."""
    carrier = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
               "tracestate": "vendor=x"}  # fmt: skip
    task = await store.create(name="job", idempotency_key="t", trace_context=carrier)
    assert task.trace_context == carrier
    again = {"traceparent": "00-11111111111111111111111111111111-2222222222222222-01"}
    repeat = await store.create(name="job", idempotency_key="t", trace_context=again)
    assert repeat.trace_context == carrier
    assert await store.steps(task.task_id) == {}
    (claimed,) = await store.claim(["job"], worker="w1", lease_seconds=LEASE)
    assert claimed.trace_context == carrier
    await store.save_step(task.task_id, "fetch", 1, fence=claimed.fence)
    done = await store.complete(task.task_id, 2, fence=claimed.fence)
    assert done.trace_context == (await store.get(task.task_id)).trace_context == carrier
    assert await store.steps(task.task_id) == {"fetch": 1}
    assert (await store.create(name="job", trace_context={})).trace_context is None
    assert (await store.create(name="job")).trace_context is None


@pytest.mark.parametrize(
    "carrier",
    [{"traceparent": 1}, ["traceparent"], {"traceparent": "x\x00"}, {"t": "x" * 5000}],
    ids=["not-text", "not-an-object", "nul", "too-long"],
)
async def test_a_bad_trace_context_is_refused_and_creates_nothing(
    store: Store, carrier: object
) -> None:
    """A trace context that is not an object of storable strings, or is over its bound,
    is an InvalidPayload naming it, and no task is created."""
    with pytest.raises(InvalidPayload, match="trace context"):
        await store.create(name="job", trace_context=carrier)  # type: ignore[arg-type]
    assert await store.list() == []


async def test_a_claim_records_its_time_and_the_task_keeps_it(
    store: Store, clock: FakeClock
) -> None:
    """claimed_at is the latest claim's time: a heartbeat or a status message leaves it,
    the attempt's end keeps it, the next claim replaces it."""
    task = await store.create(name="job", max_attempts=2)
    assert task.claimed_at is None
    first = clock.advance(3)
    (claimed,) = await store.claim(["job"], worker="w1", lease_seconds=LEASE)
    assert claimed.claimed_at == first
    clock.advance(4)
    await store.renew(task.task_id, fence=claimed.fence, lease_seconds=LEASE)
    await store.set_status_message(task.task_id, "busy", fence=claimed.fence)
    retried = await store.retry(task.task_id, ERROR, fence=claimed.fence, delay_seconds=0)
    assert retried.claimed_at == first
    second = clock.advance(5)
    (again,) = await store.claim(["job"], worker="w2", lease_seconds=LEASE)
    assert again.claimed_at == second
    assert (await store.get(task.task_id)).claimed_at == second


async def test_an_attempt_is_timed_once_by_whichever_handle_ends_it(
    store: Store, reopen: Callable[[], Store], clock: FakeClock
) -> None:
    """Claimed through one handle (one process), ended through another (a restarted or
    other process): the attempt's duration is observed exactly once, by the handle that
    wrote the end, from the claim's time: a completion, a cancel and a recovered lease."""
    other = reopen()
    here, _ = observed(store)
    there, _ = observed(other)
    a = await store.create(name="job")
    b = await store.create(name="job")
    c = await store.create(name="job")
    clock.advance(1)
    claimed = {t.task_id: t for t in await store.claim(["job"], worker="w1",
                                                       lease_seconds=LEASE, limit=3)}  # fmt: skip
    clock.advance(2)
    await other.complete(a.task_id, 1, fence=claimed[a.task_id].fence)
    clock.advance(3)
    await other.cancel(b.task_id)
    clock.advance(LEASE)
    assert [t.task_id for t in await other.recover_expired()] == [c.task_id]

    def durations(metrics: Metrics) -> dict[str, tuple[float, float]]:
        name = "keel_attempt_duration_seconds"
        seen = {}
        for outcome in ("completed", "cancelled", "recovered"):
            labels = {"tool": "job", "outcome": outcome}
            seen[outcome] = (value(metrics, f"{name}_count", **labels),
                             value(metrics, f"{name}_sum", **labels))  # fmt: skip
        return seen

    assert durations(there) == {"completed": (1, 2), "cancelled": (1, 5),
                                "recovered": (1, 5 + LEASE)}  # fmt: skip
    assert durations(here) == {"completed": (0, 0), "cancelled": (0, 0), "recovered": (0, 0)}
    assert value(here, "keel_queue_wait_seconds_count", tool="job") == 3
    assert value(there, "keel_queue_wait_seconds_count", tool="job") == 0
