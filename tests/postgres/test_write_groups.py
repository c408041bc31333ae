"""Two write transactions of one event loop at once (``write_groups``, 2 by default): a
group held up by a lock does not hold up the writes queued after it."""

from __future__ import annotations

import asyncio

import anyio
import pytest
from psycopg import sql

from keel.model import Status
from keel.store import PostgresStore

from .pg import admin, store_url

pytestmark = [pytest.mark.postgres, pytest.mark.anyio]

WAIT = 10.0  # seconds any step may take at most


async def _waiting_for_lock(app_name: str) -> None:
    """Until a backend of ``app_name`` waits for a row lock (bounded)."""
    with anyio.fail_after(WAIT), admin() as conn:
        query = ("SELECT count(*) FROM pg_stat_activity "
                 "WHERE application_name = %s AND wait_event_type = 'Lock'")  # fmt: skip
        while True:
            if conn.execute(query, (app_name,)).fetchone() == (1,):
                return
            await anyio.sleep(0.005)  # polling another session's state under a deadline


async def test_a_group_waiting_for_a_lock_does_not_hold_up_the_next(schema):
    app_name = f"{schema}_writes"
    store = PostgresStore(store_url(schema, application_name=app_name))
    try:
        assert store.options.write_groups == 2
        task = await store.create(name="job")
        with admin() as other:  # another session holds the task's row
            other.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            other.execute("BEGIN")
            other.execute("SELECT 1 FROM tasks WHERE task_id = %s FOR UPDATE", (task.task_id,))
            cancelling = asyncio.ensure_future(store.cancel(task.task_id))
            await _waiting_for_lock(app_name)
            with anyio.fail_after(WAIT):  # the next group commits meanwhile
                created = await store.create(name="job")
            assert created.status is Status.WORKING
            assert not cancelling.done()
            other.execute("COMMIT")
        with anyio.fail_after(WAIT):
            cancelled = await cancelling
        assert cancelled.status is Status.CANCELLED
        assert {t.task_id for t in await store.list()} == {task.task_id, created.task_id}
    finally:
        await store.close()
