"""A COMMIT that succeeded but whose answer was lost must not be applied twice.

The store talks to PostgreSQL through :class:`~pg_scale.proxy.CommitDropProxy`, armed
before each write: the server commits the write, the proxy swallows the answer and
drops the connection, and the store — which cannot know whether its write happened —
retries on a new connection. Each write of the store protocol is put through that, and
checked from a second store that talks to the server directly: the write is there
exactly once (one task, one history entry, one step record, one claim, the attempt
count right), and the call returned what the first try would have.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import pytest

from acceptance.apps.harness import WorkerProcess, eventually, fleet
from keel.model import InputRequest, Status
from keel.store import Store, open_store

from .proxy import CommitDropProxy
from .support import (
    APP,
    CLAIMED,
    Ledger,
    all_task_ids,
    app_env,
    check_task,
    read_back,
    read_effects,
    until_ready,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.postgres]

T = TypeVar("T")
NAME = "pg_steps"
SERVICE = {"type": "object", "required": ["service"], "properties": {"service": {"type": "string"}}}


def via(url: str, port: int) -> str:
    """``url`` with its host and port replaced by the proxy's."""
    parts = urlsplit(url)
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{port}"))


@pytest.fixture
def proxy(pg_url: Callable[..., str]) -> Iterator[CommitDropProxy]:
    parts = urlsplit(pg_url())
    running = CommitDropProxy(parts.hostname or "127.0.0.1", parts.port or 5432).start()
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
async def stores(
    pg_url: Callable[..., str], proxy: CommitDropProxy
) -> AsyncIterator[tuple[Store, Store]]:
    """(through the proxy, direct). Notifications are off so that the only COMMITs the
    proxy sees are those of the writes under test."""
    direct = open_store(pg_url())
    await direct.list(limit=1)  # the schema exists before the proxied store opens
    proxied = open_store(via(pg_url(notify="off", pool_max="1"), proxy.port))
    try:
        yield proxied, direct
    finally:
        await proxied.close()
        await direct.close()


async def answer_lost(proxy: CommitDropProxy, call: Awaitable[T]) -> T:
    """Run ``call`` with the answer to its COMMIT lost; check that it was, and that the
    server did commit."""
    before = len(proxy.swallowed)
    proxy.arm()
    result = await call
    assert proxy.armed == 0, "the call committed no write through the proxy"
    assert len(proxy.swallowed) == before + 1, proxy.swallowed
    assert proxy.swallowed[-1] == "COMMIT", (proxy.swallowed[-1], proxy.swallowed_sql[-1])
    return result


def first_verb(statements: list[str]) -> str:
    """What a swallowed transaction did, in short (``a claim``, or its first writing
    statement's verb and table: ``UPDATE tasks``), for the summary line."""
    if any("SKIP LOCKED" in sql.upper() for sql in statements):
        return "a claim"
    for sql in statements:
        if m := re.search(r"\b(INSERT\s+INTO|DELETE\s+FROM)\s+([\w.\"]+)", sql, re.I):
            return f"{m[1].split()[0].upper()} {m[2]}"
        if m := re.search(r"\bUPDATE\s+([\w.\"]+)(\s+(AS\s+)?\w+)?\s+SET\b", sql, re.I):
            return f"UPDATE {m[1]}"
    return "?"


def claims(history: Any) -> list[int]:
    """The fences of the claims in a history."""
    return [int(m["fence"]) for e in history if (m := CLAIMED.fullmatch(e.reason))]


async def test_every_write_with_a_lost_commit_answer_is_applied_once(
    stores: tuple[Store, Store], proxy: CommitDropProxy
) -> None:
    """create (with and without an idempotency key), claim, save_step, set_status_message,
    renew, retry, request_input, provide_input, complete, cancel, fail, release and
    recover_expired each have the answer to their COMMIT lost once; each still returns
    normally, and the direct view shows it applied exactly once."""
    proxied, direct = stores

    # create, no key: the retry must not make a second task.
    one = await answer_lost(proxy, proxied.create(name=NAME, arguments={"n": 1}, max_attempts=5))
    assert await all_task_ids(direct) == [one.task_id]
    assert [e.reason for e in await direct.history(one.task_id)] == ["created"]
    assert (await direct.get(one.task_id)).arguments == {"n": 1}

    # create with an idempotency key: one task bound to it, the one returned.
    two = await answer_lost(
        proxy, proxied.create(name=NAME, arguments={"n": 2}, idempotency_key="k-2")
    )
    assert await all_task_ids(direct) == [one.task_id, two.task_id]
    again = await direct.create(name=NAME, arguments={"n": 2}, idempotency_key="k-2")
    assert again.task_id == two.task_id

    # claim: one task leased once (the retry claims neither it again nor the next task).
    [claimed] = await answer_lost(
        proxy, proxied.claim([NAME], worker="wA", lease_seconds=60, limit=1)
    )
    assert claimed.task_id == one.task_id
    stored = await direct.get(one.task_id)
    assert (stored.fence, stored.attempt, stored.lease_owner) == (claimed.fence, 1, "wA")
    assert claims(await direct.history(one.task_id)) == [claimed.fence]
    assert (await direct.get(two.task_id)).lease_owner is None
    assert claims(await direct.history(two.task_id)) == []
    fence = claimed.fence

    # cancel: one cancellation.
    cancelled = await answer_lost(proxy, proxied.cancel(two.task_id, reason="no longer needed"))
    assert cancelled.status is Status.CANCELLED
    history = await direct.history(two.task_id)
    assert [e.to_status for e in history].count(Status.CANCELLED) == 1, history

    # save_step: one record, the first value.
    events = len(await direct.history(one.task_id))
    await answer_lost(proxy, proxied.save_step(one.task_id, "s0", {"v": 1}, fence=fence))
    assert dict(await direct.steps(one.task_id)) == {"s0": {"v": 1}}

    # set_status_message and renew: applied; no history entry of their own.
    await answer_lost(proxy, proxied.set_status_message(one.task_id, "half way", fence=fence))
    assert (await direct.get(one.task_id)).status_message == "half way"
    renewed = await answer_lost(proxy, proxied.renew(one.task_id, fence=fence, lease_seconds=120))
    assert (await direct.get(one.task_id)).lease_expires_at == renewed.lease_expires_at
    assert len(await direct.history(one.task_id)) == events

    # retry: the attempt ends once; the next claim is attempt 2 (not 3).
    error = {"code": -32603, "message": "try again"}
    await answer_lost(proxy, proxied.retry(one.task_id, error, fence=fence, delay_seconds=0))
    history = await direct.history(one.task_id)
    assert len(history) == events + 1, history
    assert history[-1].to_status is Status.WORKING, history[-1]
    [claimed] = await answer_lost(
        proxy, proxied.claim([NAME], worker="wB", lease_seconds=60, limit=1)
    )
    assert (claimed.task_id, claimed.attempt) == (one.task_id, 2)
    assert claims(await direct.history(one.task_id)) == [fence, claimed.fence]
    fence = claimed.fence

    # request_input, then provide_input (unleased): one entry each.
    events = len(await direct.history(one.task_id))
    asked = {"service": InputRequest("Which service?", SERVICE)}
    await answer_lost(proxy, proxied.request_input(one.task_id, asked, fence=fence))
    assert (await direct.get(one.task_id)).status is Status.INPUT_REQUIRED
    await answer_lost(proxy, proxied.provide_input(one.task_id, {"service": {"service": "db"}}))
    task = await direct.get(one.task_id)
    assert task.status is Status.WORKING, task
    assert len(await direct.history(one.task_id)) == events + 2

    # complete: one completion, the result given.
    [claimed] = await direct.claim([NAME], worker="wC", lease_seconds=60, limit=1)
    assert claimed.task_id == one.task_id
    done = await answer_lost(
        proxy, proxied.complete(one.task_id, {"ok": True}, fence=claimed.fence, actor="worker:wC")
    )
    assert done.status is Status.COMPLETED
    history = await direct.history(one.task_id)
    assert [e.to_status for e in history].count(Status.COMPLETED) == 1, history
    assert history[-1].to_status is Status.COMPLETED
    assert (await direct.get(one.task_id)).result == {"ok": True}

    # fail (unleased): one failure.
    three = await direct.create(name="other", arguments={"n": 3})
    failed = await answer_lost(proxy, proxied.fail(three.task_id, {"code": -1, "message": "no"}))
    assert failed.status is Status.FAILED
    history = await direct.history(three.task_id)
    assert [e.to_status for e in history].count(Status.FAILED) == 1, history

    # release: given back once, not a failed attempt.
    four = await direct.create(name="four", max_attempts=5)
    [held] = await direct.claim(["four"], worker="wD", lease_seconds=60, limit=1)
    events = len(await direct.history(four.task_id))
    await answer_lost(proxy, proxied.release(four.task_id, fence=held.fence, reason="stopping"))
    task = await direct.get(four.task_id)
    assert (task.status, task.lease_owner, task.attempt) == (Status.WORKING, None, 1), task
    assert len(await direct.history(four.task_id)) == events + 1

    # recover_expired: an expired lease recovered once (attempt + 1, not + 2).
    five = await direct.create(name="five", max_attempts=5)
    [held] = await direct.claim(["five"], worker="wE", lease_seconds=0.2, limit=1)

    async def expired() -> bool | None:
        task = await direct.get(five.task_id)
        assert task.lease_expires_at is not None
        return True if task.lease_expires_at < time.time() else None

    await eventually(expired, within=10, what="the lease to expire")
    events = len(await direct.history(five.task_id))
    recovered = await answer_lost(proxy, proxied.recover_expired())
    assert [t.task_id for t in recovered] == [five.task_id]
    task = await direct.get(five.task_id)
    assert (task.attempt, task.lease_owner) == (2, None), task
    assert len(await direct.history(five.task_id)) == events + 1

    assert await all_task_ids(direct) == [
        one.task_id,
        two.task_id,
        three.task_id,
        four.task_id,
        five.task_id,
    ]
    assert proxy.swallowed == ["COMMIT"] * 15


LOSSY_TASKS = 200
LOSSES = 30  # COMMIT answers lost while the worker runs them


async def test_a_worker_whose_commit_answers_get_lost_runs_every_task_once(
    tmp_path: Path, pg_url: Callable[..., str], proxy: CommitDropProxy
) -> None:
    """A ``keel worker`` process talks to PostgreSQL through the proxy, which loses the
    answer to one of its writing COMMITs after another (claims, step records,
    completions, renewals: whatever comes next) while it runs 200 two-step tasks. Every
    task still completes exactly once, each step recorded once and never run again, and
    no lease is lost: each retried write applied once."""
    direct = open_store(pg_url())
    effects = tmp_path / "effects.jsonl"
    try:
        ids = [
            (await direct.create(name=NAME, arguments={"steps": 2, "work_ms": 2})).task_id
            for _ in range(LOSSY_TASKS)
        ]
        with fleet() as workers:
            worker = WorkerProcess(
                store=via(pg_url(pool_max="2"), proxy.port),
                worker_id="lossy",
                logs=tmp_path,
                env=app_env(effects, lease=5.0),
                concurrency=8,
                app=APP,
            )
            workers.append(worker)
            await until_ready(worker)

            async def done() -> bool | None:
                # One answer lost at a time, each as soon as the previous one was.
                if proxy.armed == 0 and len(proxy.swallowed) < LOSSES:
                    proxy.arm()
                seen = await direct.statuses(ids)
                return True if all(s.terminal for s, _ in seen.values()) else None

            await eventually(done, within=120, what="every task", every=0.02)
            assert worker.terminate() == 0, worker.output()
            assert " raised " not in worker.log_path.read_text(), worker.output()
        assert len(proxy.swallowed) >= LOSSES // 2, proxy.swallowed
        assert set(proxy.swallowed) == {"COMMIT"}, proxy.swallowed
        assert await all_task_ids(direct) == ids
        by_task = read_effects(effects)
        seen = await read_back(direct, ids)
        ledger = Ledger()  # nobody was killed: a recovered lease fails the check
        for task_id in ids:
            task, history, steps = seen[task_id]
            check_task(
                task_id, task.status, task.result, history, steps, by_task[task_id], 2, ledger
            )
    finally:
        await direct.close()
    kinds = sorted(Counter(map(first_verb, proxy.swallowed_sql)).items())
    print(f"{len(proxy.swallowed)} COMMIT answers lost: {kinds}")
