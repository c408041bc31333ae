"""Live pages: server-sent events from the store's change feed (``store.changes()``).

``GET /events`` streams one ``change`` event each time committed writes touched tasks
(any task; with ``?task=ID``, that one): its data is the changed ids, space-separated,
or ``*`` ("re-read everything", after the feed (re)started). A page that holds a
``data-live`` element opens the stream and, on each event, fetches itself again and
swaps that element's content in (a few lines of script in ``base.html``; without
script the page is still whole, only not live). A comment every :data:`KEEPALIVE`
seconds keeps proxies from closing a quiet stream.
"""

from __future__ import annotations

import asyncio
import contextlib

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from keel.store import Change, Store

__all__ = ["KEEPALIVE", "events"]

KEEPALIVE = 15.0  # seconds of quiet before a comment line is sent


def _event(change: Change, task_id: str | None) -> str | None:
    """The SSE text for one item of the feed (None: nothing this stream watches)."""
    if change.task_ids is None:
        return "event: change\ndata: *\n\n"
    if task_id is None or task_id in change.task_ids:
        shown = [task_id] if task_id is not None else sorted(change.task_ids)[:100]
        return f"event: change\ndata: {' '.join(shown)}\n\n"
    return None


class EventStream(Response):
    """A ``text/event-stream`` of the store's changes until the client goes away.

    Three tasks share the connection: the feed, the keep-alive ticker, and a watch on
    the client's disconnect, which ends the others.
    """

    media_type = "text/event-stream"

    def __init__(self, store: Store, task_id: str | None) -> None:
        super().__init__(headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
        # A stream has no length: the body is sent in pieces until the client leaves.
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        self.store, self.task_id = store, task_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._stream(receive, send)
        except asyncio.CancelledError:
            # The server stopping cuts open streams after its grace (uvicorn cancels the
            # request's task): that ends this response; it is not an error to log.
            return

    async def _stream(self, receive: Receive, send: Send) -> None:
        lock = anyio.Lock()

        async def emit(text: str) -> None:
            async with lock:
                await send({"type": "http.response.body", "body": text.encode(), "more_body": True})

        async def follow() -> None:
            async for change in self.store.changes():
                text = _event(change, self.task_id)
                if text is not None:
                    await emit(text)

        async def keep_alive() -> None:
            while True:
                await anyio.sleep(KEEPALIVE)
                await emit(": keepalive\n\n")

        start = {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
        with contextlib.suppress(OSError):  # the client went away mid-send
            await send(start)
            await emit("retry: 1000\n\n")  # reconnect after a second if it drops
            async with anyio.create_task_group() as tg:
                tg.start_soon(follow)
                tg.start_soon(keep_alive)
                while (await receive())["type"] != "http.disconnect":
                    pass
                tg.cancel_scope.cancel()


def events(store: Store, request: Request) -> Response:
    """The event stream of ``request`` (``?task=ID`` narrows it to one task)."""
    return EventStream(store, request.query_params.get("task") or None)
