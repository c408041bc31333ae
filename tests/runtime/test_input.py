"""Input and checkpoints: ``ctx.elicit`` parks a task (no lease, no worker slot, no attempt
spent) and replays the answer; ``ctx.step`` results are not recomputed on a re-run."""

from __future__ import annotations

from typing import Any

import pytest

from keel.errors import InputRejected, InvalidPayload, UnknownInputKey
from keel.model import Status, Task
from keel.runtime import InputDeclined, Keel, TaskContext
from keel.store import MemoryStore, Store

from .support import APPROVAL, SERVICE, eventually, parks, running, settles, worker

pytestmark = pytest.mark.anyio


async def test_elicit_parks_the_task_and_frees_the_worker(store: Store) -> None:
    """A parked task holds no lease, no worker slot and no attempt; its answer replays."""
    app = Keel(store)
    runs: list[int] = []

    @app.task("ask", max_attempts=1)
    async def ask(ctx: TaskContext) -> str:
        runs.append(ctx.fence)
        answer = await ctx.elicit("Which service is affected?", SERVICE)
        return f"diagnosing {answer['service']}"

    @app.task("other")
    async def other(ctx: TaskContext) -> str:
        return "ran while the first one waited"

    waiting = await app.submit("ask")
    w = worker(app, concurrency=1)
    async with running(w):
        parked = await parks(store, waiting.task_id)
        assert (parked.lease_owner, parked.lease_expires_at) == (None, None)
        assert (parked.attempt, parked.fence) == (1, 1)
        assert parked.status_message == "Which service is affected?"
        assert list(parked.pending_input) == ["input-1"]
        assert parked.pending_input["input-1"].schema == SERVICE
        await eventually(lambda: not w.running, "the worker to free the slot")

        meanwhile = await app.submit("other")
        assert (await settles(store, meanwhile.task_id)).status is Status.COMPLETED

        await store.provide_input(waiting.task_id, {"input-1": {"service": "payments"}})
        done = await settles(store, waiting.task_id)

    assert done.status is Status.COMPLETED
    assert done.result["content"][0]["text"] == "diagnosing payments"
    assert (done.attempt, done.fence, runs) == (1, 2, [1, 2])
    reasons = [e.reason for e in await store.history(waiting.task_id)]
    assert "waiting for input 'input-1'" in reasons


async def test_steps_are_not_rerun_after_input(store: Store) -> None:
    """A step recorded before the task parked is replayed, not re-executed, on resume."""
    app = Keel(store)
    executed: list[str] = []
    per_attempt: list[list[str]] = []

    def load(incident: str) -> dict[str, Any]:
        executed.append("load")
        return {"incident": incident, "deploys": 3}

    async def correlate(service: str) -> str:
        executed.append("correlate")
        return f"deploy 2 of {service}"

    @app.task("diagnose")
    async def diagnose(ctx: TaskContext, incident: str) -> dict[str, Any]:
        try:
            loaded = await ctx.step("load", load, incident)
            service = (await ctx.elicit("Which service?", SERVICE))["service"]
            cause = await ctx.step("correlate", correlate, service)
            return {"loaded": loaded, "cause": cause}
        finally:
            per_attempt.append(list(ctx.step_calls))

    task = await app.submit("diagnose", {"incident": "INC-7"})
    async with running(worker(app)):
        await parks(store, task.task_id)
        assert await store.steps(task.task_id) == {"load": {"incident": "INC-7", "deploys": 3}}
        await store.provide_input(task.task_id, {"input-1": {"service": "payments"}})
        done = await settles(store, task.task_id)

    assert executed == ["load", "correlate"]
    assert per_attempt == [["load"], ["correlate"]]
    assert done.result["structuredContent"] == {
        "loaded": {"incident": "INC-7", "deploys": 3},
        "cause": "deploy 2 of payments",
    }


async def test_keys_follow_call_order_or_are_given(store: Store) -> None:
    """Input keys follow call order unless given; replays find answers; waits spend no attempt."""
    app = Keel(store)

    @app.task("triage", max_attempts=1)
    async def triage(ctx: TaskContext) -> dict[str, Any]:
        first = await ctx.elicit("Service?", SERVICE)
        second = await ctx.elicit("Backup service?", SERVICE)
        approval = await ctx.elicit("Roll back?", APPROVAL, key="rollback")
        return {"first": first, "second": second, "approval": approval}

    task = await app.submit("triage")
    answers = [
        ("input-1", {"service": "payments"}),
        ("input-2", {"service": "ledger"}),
        ("rollback", {"approved": True}),
    ]
    async with running(worker(app)):
        for key, value in answers:
            parked = await parks(store, task.task_id)
            assert list(parked.pending_input) == [key]
            await store.provide_input(task.task_id, {key: value})
        done = await settles(store, task.task_id)

    assert done.status is Status.COMPLETED
    assert list(done.input_requests) == ["input-1", "input-2", "rollback"]
    assert done.result["structuredContent"] == {
        "first": {"service": "payments"},
        "second": {"service": "ledger"},
        "approval": {"approved": True},
    }
    assert (done.attempt, done.fence) == (1, 4)


async def test_elicit_many_waits_until_every_answer_is_in(store: Store) -> None:
    """elicit_many keeps the task waiting, unclaimed, until every request is answered."""
    app = Keel(store)

    @app.task("change")
    async def change(ctx: TaskContext) -> dict[str, Any]:
        return await ctx.elicit_many(
            {"service": ("Which service?", SERVICE), "approval": ("Approve?", APPROVAL)}
        )

    task = await app.submit("change")
    async with running(worker(app)):
        parked = await parks(store, task.task_id)
        assert sorted(parked.pending_input) == ["approval", "service"]

        half = await store.provide_input(task.task_id, {"service": {"service": "payments"}})
        assert half.status is Status.INPUT_REQUIRED
        assert list(half.pending_input) == ["approval"]
        assert (half.fence, half.lease_owner) == (1, None)

        await store.provide_input(task.task_id, {"approval": {"approved": False}})
        done = await settles(store, task.task_id)

    assert done.result["structuredContent"] == {
        "service": {"service": "payments"},
        "approval": {"approved": False},
    }
    assert done.fence == 2


@pytest.mark.parametrize("action", ["decline", "cancel"])
async def test_declined_input_raises_input_declined(store: Store, action: str) -> None:
    """A declined (or cancelled) request replays as InputDeclined, which the handler catches."""
    app = Keel(store)

    @app.task("ask")
    async def ask(ctx: TaskContext) -> str:
        try:
            answer = await ctx.elicit("Which service?", SERVICE)
        except InputDeclined as exc:
            return f"no answer to {exc.key}: {exc.action}"
        return str(answer)

    task = await app.submit("ask")
    async with running(worker(app)):
        await parks(store, task.task_id)
        await store.provide_input(task.task_id, {}, declined={"input-1": action})
        done = await settles(store, task.task_id)

    assert done.status is Status.COMPLETED
    assert done.result["content"][0]["text"] == f"no answer to input-1: {action}"


async def test_cancelled_input_message_reads_well() -> None:
    """InputDeclined's message for a cancelled request says 'cancelled'."""
    assert (
        str(InputDeclined("input-1", "decline"))
        == "input request 'input-1' was declined by the user"
    )
    assert (
        str(InputDeclined("input-1", "cancel"))
        == "input request 'input-1' was cancelled by the user"
    )


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"type": "array", "items": {"type": "string"}}, "object schema"),
        ({"type": "object", "properties": {"where": {"type": "object"}}}, "'where'"),
        ({"type": "object", "properties": {"hosts": {"type": "array"}}}, "'hosts'"),
        ({"type": "object", "properties": {"any": {}}}, "'any'"),
    ],
)
async def test_non_elicitation_schemas_are_refused(
    store: Store, schema: dict[str, Any], named: str
) -> None:
    """A schema elicitation cannot present is refused, naming the problem; nothing is asked."""
    app = Keel(store)

    @app.task("ask")
    async def ask(ctx: TaskContext) -> str:
        try:
            await ctx.elicit("Where?", schema)
        except InvalidPayload as exc:
            return str(exc)
        return "asked"

    task = await app.submit("ask")
    async with running(worker(app)):
        done = await settles(store, task.task_id)

    message = done.result["content"][0]["text"]
    assert named in message
    assert "elicitation" in message
    assert done.input_requests == {}
    assert all(e.to_status is not Status.INPUT_REQUIRED for e in await store.history(task.task_id))


async def test_invalid_answers_are_refused_and_the_request_stays(store: Store) -> None:
    """An answer violating its schema is refused; the task waits on; the handler does not run."""
    app = Keel(store)
    runs = 0

    @app.task("ask")
    async def ask(ctx: TaskContext) -> str:
        nonlocal runs
        runs += 1
        return "go" if (await ctx.elicit("Approve?", APPROVAL))["approved"] else "stop"

    task = await app.submit("ask")
    async with running(worker(app)):
        before = await parks(store, task.task_id)
        with pytest.raises(InputRejected, match="approved"):
            await store.provide_input(task.task_id, {"input-1": {"approved": "yes"}})
        assert await store.get(task.task_id) == before
        await store.provide_input(task.task_id, {"input-1": {"approved": True}})
        done = await settles(store, task.task_id)
    assert (done.result["content"][0]["text"], runs) == ("go", 2)


async def test_answers_keyed_by_no_open_request_are_refused(store: Store) -> None:
    """Keel.answer refuses answers none of whose keys is an open request (the answer object
    itself, a mistyped key, a key already answered), naming the keys expected; nothing
    changes. A mix with an open key is accepted (the others are ignored, as the store does)."""
    app = Keel(store)

    @app.task("change")
    async def change(ctx: TaskContext) -> dict[str, Any]:
        return await ctx.elicit_many(
            {"service": ("Which service?", SERVICE), "approval": ("Approve?", APPROVAL)}
        )

    task = await app.submit("change")
    async with running(worker(app)):
        before = await parks(store, task.task_id)
        with pytest.raises(UnknownInputKey) as refused:
            await app.answer(task.task_id, {"services": "payments"})
        assert str(refused.value) == (
            f"task {task.task_id} has no input request 'services'; pending: 'service', "
            "'approval' (answers are keyed by input request)"
        )
        assert (refused.value.keys, refused.value.expected) == (
            ["services"],
            ["service", "approval"],
        )
        assert isinstance(refused.value, InvalidPayload)
        with pytest.raises(UnknownInputKey, match="no answer given"):
            await app.answer(task.task_id, {})
        with pytest.raises(UnknownInputKey, match="no input request 'typo'"):
            await app.answer(task.task_id, {}, declined={"typo": "decline"})
        assert await store.get(task.task_id) == before

        half = await app.answer(
            task.task_id, {"service": {"service": "payments"}, "extra": {"ignored": True}}
        )
        assert list(half.pending_input) == ["approval"]
        with pytest.raises(UnknownInputKey) as again:
            await app.answer(task.task_id, {"service": {"service": "ledger"}})
        assert str(again.value) == (
            f"input 'service' of task {task.task_id} was already answered; pending: "
            "'approval' (answers are keyed by input request)"
        )
        assert await store.get(task.task_id) == half
        await app.answer(task.task_id, {"approval": {"approved": True}})
        done = await settles(store, task.task_id)
    assert done.result["structuredContent"]["service"] == {"service": "payments"}


async def test_except_exception_does_not_swallow_parking(store: Store) -> None:
    """A handler that wraps elicit in ``except Exception`` still parks (and is not retried)."""
    app = Keel(store)

    @app.task("careless")
    async def careless(ctx: TaskContext) -> str:
        try:
            answer = await ctx.elicit("Which service?", SERVICE)
        except Exception:
            return "swallowed"
        return answer["service"]

    task = await app.submit("careless")
    async with running(worker(app)):
        parked = await parks(store, task.task_id)
        assert parked.attempt == 1
        await store.provide_input(task.task_id, {"input-1": {"service": "payments"}})
        done = await settles(store, task.task_id)
    assert done.result["content"][0]["text"] == "payments"


async def test_step_key_is_stable_across_runs_of_a_task() -> None:
    """ctx.step_key(name) is the same on every run of a task's step, and differs by step."""
    task = Task("t-1", Status.WORKING, "", "job", {}, 0.0, 0.0)
    first = TaskContext(MemoryStore(), task, steps={}, worker="w1")
    again = TaskContext(MemoryStore(), task, steps={}, worker="w2")
    assert first.step_key("charge") == again.step_key("charge") == "t-1/charge"
    assert first.step_key("charge") != first.step_key("refund")


class WatchedStore(MemoryStore):
    """A MemoryStore that counts the worker's watch reads (``statuses``)."""

    reads = 0

    async def statuses(self, task_ids: Any) -> Any:
        seen = await super().statuses(task_ids)
        self.reads += 1
        return seen


async def test_a_watch_read_while_the_attempt_parks_does_not_stop_it() -> None:
    """The task is input_required at the attempt's own fence from the moment its request
    commits until the handler has left: the watch loop reads it so in between (two reads
    here, while the handler's cleanup runs) and must not take it for another attempt's,
    which would cancel that cleanup and record the attempt as stopped, not parked."""
    store = WatchedStore()
    app = Keel(store)
    cleaned: list[int] = []

    @app.task("ask")
    async def ask(ctx: TaskContext) -> str:
        try:
            answer = await ctx.elicit("Which service is affected?", SERVICE)
        finally:
            asked_at = store.reads
            await eventually(lambda: store.reads >= asked_at + 2, "two watch reads")
            cleaned.append(ctx.fence)
        return str(answer["service"])

    waiting = await app.submit("ask")
    w = worker(app, concurrency=1)  # watch_interval 0.01 s
    async with running(w):
        await parks(store, waiting.task_id)
        await eventually(lambda: not w.running, "the attempt to end")
    assert cleaned == [1]
    parked = await store.get(waiting.task_id)
    assert (parked.status, parked.fence, parked.lease_owner) == (Status.INPUT_REQUIRED, 1, None)
