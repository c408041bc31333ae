"""A cheap MCP tasks client for load benchmarks: the 2026-07-28 wire over raw HTTP/1.1.

The official client (``mcp.Client`` with ``TasksClientExtension``) costs a few
milliseconds of CPU per request; 32 of them on a 2-core machine cannot poll every 10 ms
(``docs/benchmarks.md``, "Push notifications under load"). This one speaks exactly the
wire ``keel serve`` answers, with next to no work of its own: one keep-alive HTTP/1.1
connection per client (asyncio streams), request bytes built once per task, and only
what it must parse (the status line, ``content-length`` or the chunked SSE body, the
JSON of each answer). Each client calls a task tool in a loop and follows the task to
its end in one of two ways:

* **poll**: ``tasks/get`` every ``interval`` seconds (after each answer) until the task
  is terminal; a terminal ``tasks/get`` carries the tool's result;
* **push**: ``subscriptions/listen`` with ``notifications.taskIds = [task]`` on the same
  connection: an SSE stream of the acknowledgement (first), ``notifications/tasks``
  frames (each the full task, the terminal one with its result), then the listen's
  result, which ends the stream once its task has ended (``keel.mcp.push``).

It checks what it reads and fails loudly (:class:`WireError`) on a JSON-RPC error, an
HTTP status other than 200, a frame out of order or of another method, another task's
or another subscription's frame, or a task that did not complete; and it counts what it
did (:class:`Counts`).

Run as a program, it is one load process of ``bench/push_bench.py --load --raw-clients``:

    python bench/_raw_client.py URL CLIENTS push|poll [--interval 0.01] [--seconds 0.2]

prints ``ready`` once every client has finished one task, then answers each ``mark``
line on stdin with its counts so far (one JSON line), and ends at ``stop`` or at the
end of stdin.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncGenerator
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

__all__ = ["Connection", "Counts", "WireError", "poll_task", "push_task", "run_clients"]

VERSION = "2026-07-28"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
ACKNOWLEDGED = "notifications/subscriptions/acknowledged"
STATUSES = frozenset({"working", "input_required", "completed", "failed", "cancelled"})
TERMINAL = frozenset({"completed", "failed", "cancelled"})
META = json.dumps(
    {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS_EXTENSION: {}}},
        "io.modelcontextprotocol/clientInfo": {"name": "keel-raw-bench", "version": "0"},
    },
    separators=(",", ":"),
)
MAX_HEAD = 64  # header lines an answer may have
WARM_UP = 300.0  # seconds every client gets to finish its first task


class WireError(RuntimeError):
    """The server answered something this client does not accept."""


@dataclass
class Counts:
    """What the clients of one process did (cumulative)."""

    tasks: int = 0  # tasks followed to their (completed) end
    requests: int = 0  # HTTP requests sent: calls, polls and listens
    polls: int = 0  # tasks/get among them
    listens: int = 0  # subscriptions/listen among them
    frames: int = 0  # SSE frames read on listen streams (acks, notifications, results)
    task_ms: float = 0.0  # sum over tasks: from sending the call to seeing the end


class Connection:
    """One keep-alive HTTP/1.1 connection to an MCP endpoint (``http://host:port/path``)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"need http://host:port/path, got {url!r}")
        self.host, self.port, self.path = parts.hostname, parts.port, parts.path or "/"
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._close_after = False  # the server said it closes the connection after this answer

    def request(self, method: str, name: str | None, body: str) -> bytes:
        """The bytes of one POST of ``body`` (a JSON-RPC request) with the headers a
        2026-07-28 client sends: ``Mcp-Method``, and ``Mcp-Name`` for tools and tasks."""
        payload = body.encode()
        named = f"Mcp-Name: {name}\r\n" if name is not None else ""
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
            f"MCP-Protocol-Version: {VERSION}\r\nMcp-Method: {method}\r\n{named}"
            f"Content-Length: {len(payload)}\r\n\r\n"
        )
        return head.encode() + payload

    async def _send(self, request: bytes) -> asyncio.StreamReader:
        if self._writer is None or self._writer.is_closing():
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        self._writer.write(request)
        await self._writer.drain()
        return self._reader

    async def _head(self, reader: asyncio.StreamReader, content_type: bytes) -> dict[bytes, bytes]:
        """Read the status line and the headers (names lowercased): a 200 answer of
        ``content_type``, else WireError."""
        status = await reader.readline()
        if not status.startswith(b"HTTP/1.1 "):
            raise WireError(f"not an HTTP/1.1 answer: {status!r}")
        headers: dict[bytes, bytes] = {}
        for _ in range(MAX_HEAD):
            line = await reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        else:
            raise WireError("an answer with too many header lines")
        if status.split(b" ", 2)[1] != b"200":
            length = int(headers.get(b"content-length", b"0"))
            body = await reader.readexactly(length) if length else b""
            raise WireError(f"HTTP {status.strip().decode()}: {body[:500]!r}")
        if not headers.get(b"content-type", b"").startswith(content_type):
            raise WireError(f"expected {content_type.decode()}, got {headers!r}")
        if headers.get(b"connection", b"").lower() == b"close":
            self._close_after = True
        return headers

    def _done(self) -> None:
        """After an answer: drop the connection if the server said it closes it."""
        if self._close_after:
            self.close()
            self._close_after = False

    async def call(self, request: bytes) -> dict[str, Any]:
        """Send ``request``; its JSON answer (``application/json``)."""
        try:
            reader = await self._send(request)
            headers = await self._head(reader, b"application/json")
            answer = json.loads(await reader.readexactly(int(headers[b"content-length"])))
        except BaseException:
            self.close()  # whatever is left of the answer must not be read as the next one
            raise
        self._done()
        if not isinstance(answer, dict):
            raise WireError(f"not a JSON-RPC message: {answer!r}")
        return answer

    async def frames(self, request: bytes) -> AsyncGenerator[dict[str, Any]]:
        """Send ``request``; each JSON-RPC message of its SSE answer, to the stream's end
        (chunked transfer encoding; ``data:`` lines, keep-alive comments skipped). Use it
        with ``contextlib.aclosing``: a stream left before its end closes the connection."""
        read_to_end = False
        try:
            reader = await self._send(request)
            headers = await self._head(reader, b"text/event-stream")
            if headers.get(b"transfer-encoding", b"").lower() != b"chunked":
                raise WireError(f"expected a chunked stream, got {headers!r}")
            pending = b""
            while size := int((await reader.readline()).split(b";", 1)[0], 16):
                pending += (await reader.readexactly(size + 2))[:-2]
                events = pending.replace(b"\r\n", b"\n").split(b"\n\n")
                pending = events.pop()  # what follows the last complete event
                for event in events:
                    for line in event.split(b"\n"):
                        if line.startswith(b"data:"):
                            yield _message(line[5:])
            if await reader.readline() != b"\r\n":  # the chunked body's end: no trailers
                raise WireError("a chunked stream with trailers")
            if pending.strip():
                raise WireError(f"the stream ended inside an event: {pending[:200]!r}")
            read_to_end = True
        finally:
            if not read_to_end:
                self.close()
        self._done()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _message(data: bytes) -> dict[str, Any]:
    message = json.loads(data)
    if not isinstance(message, dict):
        raise WireError(f"not a JSON-RPC message: {message!r}")
    return message


def _result(answer: dict[str, Any], request_id: int | str) -> dict[str, Any]:
    """The ``result`` of a JSON-RPC response to ``request_id``, or WireError."""
    if answer.get("jsonrpc") != "2.0" or answer.get("id") != request_id:
        raise WireError(f"not the answer to request {request_id!r}: {answer!r}")
    if "error" in answer:
        raise WireError(f"JSON-RPC error to request {request_id!r}: {answer['error']!r}")
    result = answer.get("result")
    if not isinstance(result, dict):
        raise WireError(f"an answer without a result object: {answer!r}")
    return result


def _task(task: Any, task_id: str) -> str:
    """The status of ``task`` (a detailed task of ``task_id``); WireError if it is not
    one, or if it ended otherwise than completed with a tool result."""
    if not isinstance(task, dict) or task.get("taskId") != task_id:
        raise WireError(f"not task {task_id}: {task!r}")
    status = task.get("status")
    if status not in STATUSES:
        raise WireError(f"task {task_id} has no valid status: {task!r}")
    if status in TERMINAL:
        result = task.get("result")
        if (
            status != "completed"
            or not isinstance(result, dict)
            or result.get("isError") is not False
            or not isinstance(result.get("content"), list)
        ):
            raise WireError(f"task {task_id} did not complete with a result: {task!r}")
    return str(status)


def _call_body(number: int, tool: str, arguments: str) -> str:
    return (
        f'{{"jsonrpc":"2.0","id":{number},"method":"tools/call","params":'
        f'{{"name":"{tool}","arguments":{arguments},"_meta":{META}}}}}'
    )


async def create(conn: Connection, counts: Counts, number: int, tool: str, arguments: str) -> str:
    """``tools/call`` of ``tool`` (task-augmented: the extension is declared): the task id."""
    counts.requests += 1
    answer = await conn.call(conn.request("tools/call", tool, _call_body(number, tool, arguments)))
    created = _result(answer, number)
    task_id = created.get("taskId")
    if created.get("resultType") != "task" or not isinstance(task_id, str):
        raise WireError(f"tools/call did not create a task: {created!r}")
    if created.get("status") not in STATUSES:
        raise WireError(f"tools/call created a task without a valid status: {created!r}")
    return task_id


async def poll_task(
    conn: Connection, counts: Counts, number: int, task_id: str, interval: float
) -> None:
    """``tasks/get`` every ``interval`` seconds until the task has completed."""
    body = (
        f'{{"jsonrpc":"2.0","id":{number},"method":"tasks/get","params":'
        f'{{"taskId":"{task_id}","_meta":{META}}}}}'
    )
    request = conn.request("tasks/get", task_id, body)
    while True:
        await asyncio.sleep(interval)
        counts.requests += 1
        counts.polls += 1
        if _task(_result(await conn.call(request), number), task_id) in TERMINAL:
            return


async def push_task(conn: Connection, counts: Counts, number: int, task_id: str) -> None:
    """``subscriptions/listen`` on the task: the ack first, its states, then the listen's
    result right after the terminal state, and nothing after that."""
    listen_id = f"L{number}"
    body = (
        f'{{"jsonrpc":"2.0","id":"{listen_id}","method":"subscriptions/listen","params":'
        f'{{"notifications":{{"taskIds":["{task_id}"]}},"_meta":{META}}}}}'
    )
    counts.requests += 1
    counts.listens += 1
    seen = "start"  # start -> acked -> ended (terminal state) -> closed (listen result)
    request = conn.request("subscriptions/listen", None, body)
    async with contextlib.aclosing(conn.frames(request)) as frames:
        async for frame in frames:
            counts.frames += 1
            seen = _next(seen, frame, listen_id, task_id)
    if seen != "closed":
        raise WireError(f"the listen stream of {task_id} ended at {seen}")


def _next(seen: str, frame: dict[str, Any], listen_id: str, task_id: str) -> str:
    """Where a listen stream is after ``frame`` (see :func:`push_task`), or WireError."""
    method, params = frame.get("method"), frame.get("params")
    if seen == "ended" and method is None:
        result = _result(frame, listen_id)
        if (result.get("_meta") or {}).get(SUBSCRIPTION_ID) != listen_id:
            raise WireError(f"listen result without its subscription id: {frame!r}")
        return "closed"
    if not isinstance(params, dict) or seen in ("ended", "closed"):
        raise WireError(f"unexpected frame after {seen}: {frame!r}")
    if (params.get("_meta") or {}).get(SUBSCRIPTION_ID) != listen_id:
        raise WireError(f"frame without subscription id {listen_id}: {frame!r}")
    if seen == "start":
        honoured = (params.get("notifications") or {}).get("taskIds")
        if method != ACKNOWLEDGED or honoured != [task_id]:
            raise WireError(f"the listen's first frame is not its ack of {task_id}: {frame!r}")
        return "acked"
    if method != "notifications/tasks":
        raise WireError(f"a {method!r} frame on a task listen stream: {frame!r}")
    return "ended" if _task(params, task_id) in TERMINAL else seen


async def client(
    url: str,
    counts: Counts,
    *,
    listening: bool,
    interval: float,
    tool: str,
    arguments: str,
    warm: asyncio.Event,
) -> None:
    """One client: call ``tool``, follow the task to its end, again, until cancelled."""
    conn = Connection(url)
    number = 0
    try:
        while True:
            number += 1
            started = time.monotonic()
            task_id = await create(conn, counts, number, tool, arguments)
            if listening:
                await push_task(conn, counts, number, task_id)
            else:
                await poll_task(conn, counts, number, task_id, interval)
            counts.tasks += 1
            counts.task_ms += (time.monotonic() - started) * 1000
            warm.set()
    finally:
        conn.close()


async def run_clients(
    url: str, clients: int, *, listening: bool, interval: float, seconds: float
) -> None:
    """The load process: ``clients`` clients of ``slow_compute`` (``seconds`` each);
    ``ready``, then ``mark`` -> counts, ``stop`` (see the module doc)."""
    counts = Counts()
    arguments = json.dumps({"seconds": seconds})
    warm = [asyncio.Event() for _ in range(clients)]
    loop = asyncio.get_running_loop()
    tasks = [
        loop.create_task(
            client(
                url,
                counts,
                listening=listening,
                interval=interval,
                tool="slow_compute",
                arguments=arguments,
                warm=event,
            )
        )
        for event in warm
    ]
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    try:
        all_warm = loop.create_task(asyncio.wait([loop.create_task(e.wait()) for e in warm]))
        done, _ = await asyncio.wait(
            [all_warm, *tasks], timeout=WARM_UP, return_when=asyncio.FIRST_COMPLETED
        )
        if not done:
            raise WireError(f"not every client finished a task within {WARM_UP} s")
        for task in done:
            task.result()  # a client that failed while warming up: its error
        print("ready", flush=True)
        while (await stdin.readline()).strip() == b"mark":
            for task in tasks:
                if task.done():
                    task.result()  # a client failed: its WireError ends the process
            print(json.dumps(asdict(counts)), flush=True)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("clients", type=int)
    parser.add_argument("mode", choices=("push", "poll"))
    parser.add_argument("--interval", type=float, default=0.010, help="seconds between polls")
    parser.add_argument("--seconds", type=float, default=0.2, help="slow_compute's duration")
    args = parser.parse_args()
    asyncio.run(
        run_clients(
            args.url,
            args.clients,
            listening=args.mode == "push",
            interval=args.interval,
            seconds=args.seconds,
        )
    )


if __name__ == "__main__":
    main()
