"""Push over stdio (issue 16): ``keel serve --transport stdio`` as a real subprocess,
driven by a raw stdio client (JSON-RPC lines on its stdin and stdout, 2026-07-28
envelopes). A SIGTERM while a ``subscriptions/listen`` stream is open closes the stream
as over HTTP: its last frame is the listen's JSON-RPC result carrying the subscription
id (the spec's graceful close), not a request cut off without an answer; then stdout
ends and the server exits 0.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from tasks_extension.support import meta

from .apps.harness import APPS, KEEL, worker_env

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
WAIT = 30.0  # seconds for any one step (the server imports its app and opens the store)
MAX_LINE = 1 << 20  # bytes one JSON-RPC line may take


class StdioClient:
    """JSON-RPC lines to and from a server process's stdin and stdout."""

    def __init__(self, process: Process) -> None:
        assert process.stdin is not None
        assert process.stdout is not None
        self.process = process
        self.stdin = process.stdin
        self.lines = BufferedByteReceiveStream(process.stdout)

    async def send(self, request_id: int | str, method: str, params: dict[str, Any]) -> None:
        message = {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": method,
            "params": {**params, "_meta": meta()},
        }
        await self.stdin.send(json.dumps(message).encode() + b"\n")

    async def frame(self) -> dict[str, Any] | None:
        """The next frame on stdout, or None once stdout has ended."""
        with anyio.fail_after(WAIT):
            try:
                line = await self.lines.receive_until(b"\n", MAX_LINE)
            except (anyio.EndOfStream, anyio.IncompleteRead):
                return None
        frame: dict[str, Any] = json.loads(line)
        return frame

    async def expect(self) -> dict[str, Any]:
        """The next frame, which must come."""
        frame = await self.frame()
        assert frame is not None, "stdout ended"
        return frame

    async def terminate(self) -> tuple[list[dict[str, Any]], int]:
        """SIGTERM the server: every frame it writes until stdout ends, and its exit code."""
        self.process.send_signal(signal.SIGTERM)
        frames: list[dict[str, Any]] = []
        while (frame := await self.frame()) is not None:
            frames.append(frame)
        with anyio.fail_after(WAIT):
            return frames, await self.process.wait()


async def serve_stdio(tmp_path: Path) -> Process:
    """``keel serve --transport stdio`` of the steps app, started (``async with`` it)."""
    argv = [str(KEEL), "serve", "--app", "steps_app:app", "--transport", "stdio"]
    argv += ["--store", str(tmp_path / "keel.db"), "--data-dir", str(tmp_path / "data")]
    env = worker_env(tmp_path / "effects.jsonl")
    return await anyio.open_process(argv, cwd=APPS, env=env, stderr=None)


@pytest.mark.requirement("B4.27")
async def test_a_sigterm_closes_stdio_listen_streams_gracefully(tmp_path: Path) -> None:
    """SIGTERM to ``keel serve --transport stdio`` while a listen stream on a held task is
    open: after the ack and the task's state, the stream's last frame is the listen's
    result with the subscription id; nothing follows it, stdout ends, exit code 0."""
    async with await serve_stdio(tmp_path) as process:
        client = StdioClient(process)
        await client.send(1, "tools/call", {"name": "hold", "arguments": {}})
        created = await client.expect()
        assert created.get("id") == 1, created
        task_id = created["result"]["taskId"]
        await client.send("bye", "subscriptions/listen", {"notifications": {"taskIds": [task_id]}})
        ack = await client.expect()
        assert ack["method"] == "notifications/subscriptions/acknowledged", ack
        assert ack["params"]["notifications"]["taskIds"] == [task_id]
        state = await client.expect()
        assert state["method"] == "notifications/tasks", state
        assert state["params"]["taskId"] == task_id
        frames, code = await client.terminate()
    answers = [f for f in frames if "method" not in f]
    assert answers, f"the stream was cut without its result: {frames}"
    assert answers[-1] is frames[-1], frames  # the result is the stream's last frame
    assert answers[-1]["id"] == "bye", answers
    assert answers[-1]["result"]["_meta"][SUBSCRIPTION_ID] == "bye", answers
    assert all(f["params"]["_meta"][SUBSCRIPTION_ID] == "bye" for f in frames[:-1]), frames
    assert code == 0


@pytest.mark.requirement("B4.27")
async def test_a_sigterm_writes_every_open_listen_streams_result(tmp_path: Path) -> None:
    """Three listen streams open on a held task when SIGTERM comes: each one's result
    (with its subscription id) is written, as that stream's last frame, before stdout
    ends: the server waits for the results to reach stdout, not for a fixed time."""
    listens = ["a", "b", "c"]
    async with await serve_stdio(tmp_path) as process:
        client = StdioClient(process)
        await client.send(1, "tools/call", {"name": "hold", "arguments": {}})
        task_id = (await client.expect())["result"]["taskId"]
        for listen in listens:
            await client.send(
                listen, "subscriptions/listen", {"notifications": {"taskIds": [task_id]}}
            )
        states = 0
        while states < len(listens):  # each stream's ack, then the task's state
            frame = await client.expect()
            states += frame["method"] == "notifications/tasks"
        frames, code = await client.terminate()
    for listen in listens:
        mine = [
            f
            for f in frames
            if f.get("id") == listen
            or f.get("params", {}).get("_meta", {}).get(SUBSCRIPTION_ID) == listen
        ]
        assert mine, f"nothing more of stream {listen}: {frames}"
        assert mine[-1].get("id") == listen, mine  # its result is its last frame
        assert mine[-1]["result"]["_meta"][SUBSCRIPTION_ID] == listen, mine
    assert code == 0
