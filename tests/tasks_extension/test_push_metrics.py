"""``keel_notification_streams``: the open ``subscriptions/listen`` streams of a server
built with telemetry (:func:`keel.mcp.serving.app_server`), read with prometheus_client's
own text parser."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from keel.mcp.serving import app_server
from keel.runtime import Keel
from keel.store import SqliteStore
from keel.telemetry import Telemetry
from tasks_extension.support import WAIT, build_app, listen, poll, post, serve_http

pytestmark = pytest.mark.anyio


def streams(telemetry: Telemetry) -> float:
    """``keel_notification_streams`` as /metrics says it."""
    text = telemetry.metrics.exposition().decode()
    [family] = [f for f in text_string_to_metric_families(text)
                if f.name == "keel_notification_streams"]  # fmt: skip
    [sample] = family.samples
    return sample.value


async def test_open_listen_streams_are_counted(tmp_path: Path) -> None:
    """None open: 0; two listens open: 2; both disconnected: 0 again."""
    app = build_app(Keel(SqliteStore(tmp_path / "keel.db")))
    telemetry = Telemetry(expect_workers=True)
    telemetry.attach(app.store)
    server = app_server(app, "keel-tests", telemetry=telemetry)
    async with serve_http(server) as url:
        created = await post(url, "tools/call", {"name": "ask", "arguments": {"incident_id": "1"}})
        task_id = created.result["taskId"]
        await poll(url, task_id, "input_required")
        assert streams(telemetry) == 0
        async with (
            listen(url, {"taskIds": [task_id]}, request_id=1) as first,
            listen(url, {"taskIds": [task_id]}, request_id=2) as second,
        ):
            for stream in (first, second):
                ack = await stream.notification()
                assert ack["method"] == "notifications/subscriptions/acknowledged"
            assert streams(telemetry) == 2
        with anyio.fail_after(WAIT):  # the server sees the disconnects a moment later
            while True:
                if streams(telemetry) == 0:
                    break
                await anyio.sleep(0.02)
