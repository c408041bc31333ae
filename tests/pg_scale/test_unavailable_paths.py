"""PostgreSQL stopped: every request path of both protocol generations (tools/call,
tasks/get, tasks/update, tasks/cancel, tasks/result, tasks/list with and without a
cursor) answers ``-32050`` naming the store, with ``data.retryAfterMs``, within the
store timeout; never ``-32603``.

On a private throwaway cluster (never the shared server), stopped with ``pg_ctl stop -m
fast`` once the client's session is open.
"""

from __future__ import annotations

import anyio
import pytest

from keel.mcp.wire import STORE_UNAVAILABLE
from keel.runtime import Keel
from keel.store import PostgresStore
from tasks_extension.store_paths import OWNER, PATHS, server_without_workers, store_errors
from tasks_extension.support import build_app, serve_http

from .cluster import PrivateCluster

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.postgres]

STORE_TIMEOUT = 1.0  # seconds: short, to keep the test short
SLACK = 5.0  # seconds for HTTP and a loaded 2-core machine on top of the timeout


async def test_every_path_answers_postgres_down_as_unavailable(
    private_cluster: PrivateCluster,
) -> None:
    cluster = private_cluster
    url = cluster.url("postgres", schema="keel_paths")
    app = build_app(Keel(PostgresStore(url, timeout=STORE_TIMEOUT)))
    task = await app.store.create(name="kept", owner=OWNER)
    took: dict[str, float] = {}
    try:
        async with serve_http(server_without_workers(app)) as served:
            errors = await store_errors(
                served,
                task.task_id,
                before=lambda: anyio.to_thread.run_sync(cluster.stop, "fast"),
                took=took,
            )
    finally:
        await app.store.close()
    assert set(errors) == set(PATHS)
    for path, error in errors.items():
        assert error["code"] == STORE_UNAVAILABLE, (path, error)
        assert error["message"].startswith(
            f"store postgresql://postgres@127.0.0.1:{cluster.port}/postgres"
        ), (path, error)
        assert error["data"]["retryAfterMs"] > 0, (path, error)
        assert took[path] <= STORE_TIMEOUT + SLACK, (path, took[path])
