"""PostgreSQL down: calls are answered within the store timeout, as what they are; when it
comes back the first call succeeds at once; an attempt that finished during the outage
records its outcome afterwards instead of being dead-lettered.

On a private throwaway cluster (never the shared server): a real ``keel serve
--no-worker --store-timeout`` front end driven by the official MCP client, and an
in-process worker on its own store, while the cluster is stopped (``pg_ctl stop -m
fast``) and started again.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from acceptance.apps.harness import eventually
from keel.mcp.wire import STORE_UNAVAILABLE
from keel.model import Status
from keel.store import open_store
from runtime.support import outcome_through_outage

from .cluster import PrivateCluster
from .support import FrontEnd, app_env, create_task, get_task, mcp_client

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.postgres]

STORE_TIMEOUT = 2.0  # seconds (keel serve --store-timeout): short, to keep the test short
SLACK = 3.0  # seconds for the answer to cross HTTP and a loaded 2-core machine
BACK_WITHIN = 5.0  # seconds the first call after the restart may take at most (bound)


async def _refused(call: object) -> MCPError:
    """The MCPError a call ends with, within the timeout and its slack."""
    with anyio.fail_after(STORE_TIMEOUT + SLACK):
        try:
            await call  # type: ignore[misc]
        except MCPError as exc:
            return exc
    raise AssertionError("the call succeeded with PostgreSQL down")


def _two_tasks(url: str) -> Callable[[], Awaitable[bool | None]]:
    """A probe: True once the store holds two tasks."""

    async def probe() -> bool | None:
        store = open_store(url)
        try:
            return True if len(await store.list(limit=10)) >= 2 else None
        finally:
            await store.close()

    return probe


async def test_calls_with_postgres_down_are_answered_unavailable_in_time(
    tmp_path: Path, private_cluster: PrivateCluster
) -> None:
    """tools/call and tasks/get with the server stopped: -32050 naming the store (no
    password) and the refused connection, with data.retryAfterMs, within the timeout;
    started again, the next call succeeds within a bounded moment."""
    cluster = private_cluster
    url = cluster.url("postgres", schema="keel_outage")
    store = open_store(url)
    await store.list(limit=1)  # the schema exists before keel serve starts
    await store.close()
    env = {**app_env(tmp_path / "effects.jsonl", lease=30.0), "KEEL_STORE_TIMEOUT": "2"}
    front_end = FrontEnd(store=url, name="fe", logs=tmp_path, env=env)
    try:
        await front_end.ready()
        async with mcp_client(front_end.url) as client, Client(front_end.url) as plain:
            task_id = await create_task(client, "pg_steps", {"steps": 1})
            inline: list[MCPError] = []
            ended = anyio.Event()

            async def wait_inline() -> None:
                # A client without the tasks extension waits for the result inline (no
                # worker runs it): the outage ends its wait as well.
                try:
                    await plain.call_tool("pg_steps", {"steps": 1})
                except MCPError as exc:
                    inline.append(exc)
                finally:
                    ended.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait_inline)
                await eventually(_two_tasks(url), within=30, what="the inline call's task")
                await anyio.to_thread.run_sync(cluster.stop, "fast")
                with anyio.fail_after(STORE_TIMEOUT + SLACK):
                    await ended.wait()
            assert inline, "the inline call succeeded with PostgreSQL down"
            assert inline[0].error.code == STORE_UNAVAILABLE, inline[0].error
            for call in (
                get_task(client, task_id),
                create_task(client, "pg_steps", {"steps": 1}),
                get_task(client, task_id),
            ):
                error = (await _refused(call)).error
                assert error.code == STORE_UNAVAILABLE, error
                assert error.message.startswith(
                    f"store postgresql://postgres@127.0.0.1:{cluster.port}/postgres"
                ), error.message
                assert re.search("connection refused", error.message, re.I), error.message
                assert error.data == {"retryAfterMs": 1000}
            await anyio.to_thread.run_sync(cluster.start)
            with anyio.fail_after(BACK_WITHIN):
                assert (await get_task(client, task_id))["taskId"] == task_id
    finally:
        front_end.stop()
    assert "Traceback" not in front_end.output(), front_end.output()


async def test_an_outcome_written_during_an_outage_is_recorded_after_it(
    private_cluster: PrivateCluster,
) -> None:
    """A handler finishes while PostgreSQL is down for longer than its lease, on its one
    and only attempt: the worker writes its result once the server is back (the lease
    was not recovered behind its back), so the task completes instead of being
    dead-lettered as "stopped renewing its lease"."""
    cluster = private_cluster
    store = open_store(cluster.url("postgres", schema="keel_late"), timeout=1.0)
    try:
        done, history = await outcome_through_outage(
            store,
            lease=1.5,
            result="done",
            break_store=lambda: anyio.to_thread.run_sync(cluster.stop, "fast"),
            mend_store=lambda: anyio.to_thread.run_sync(cluster.start),
        )
        assert done.status is Status.COMPLETED, history
        assert done.attempt == 1
        reasons = [e.reason for e in history]
        assert not any("renewing" in r or "expired" in r for r in reasons), reasons
    finally:
        await store.close()
