"""Push notifications for tasks: ``subscriptions/listen`` with ``notifications.taskIds``.

A client that declared the tasks extension sends ``subscriptions/listen`` naming the
tasks it waits for; the response is a stream (SSE on HTTP) that carries, in order:

1. ``notifications/subscriptions/acknowledged``: the filter honoured, ``taskIds`` only
   the caller's own tasks (an unknown id and another principal's are left out alike,
   never confirmed);
2. for each honoured task, ``notifications/tasks`` with its current state, then one
   more each time it changes (status, ``statusMessage``, input requests, its result):
   the full detailed task, identical to what ``tasks/get`` answers at that moment.
   Changes that follow each other faster than the stream is written are coalesced into
   the latest state, never sent out of order; a write that moves only
   ``lastUpdatedAt`` (a worker renewing its lease) sends nothing; after a task's
   terminal state nothing more is sent for it;
3. the SDK's core events (``toolsListChanged`` …) the listen asked for, as before;
4. the listen's result, the spec's graceful close: on a graceful server stop, and once
   every task of a listen that asked for tasks only has ended (nothing more can come).

A 2025-11-25 client (a handshake session) that asked ``tasks/get`` for a task gets
``notifications/tasks/status`` (the 2025 ``Task``) on each change of it after that,
until it ends, on its session's own channel (the GET stream on HTTP):
:meth:`TaskPush.watch_session`, called by :mod:`keel.mcp.v2025`.

Every frame carries ``_meta["io.modelcontextprotocol/subscriptionId"]`` = the listen
request's id. No ``notifications/progress`` or ``notifications/message`` is ever sent on
it. A client that did not declare the extension and asks for task ids gets ``-32021``.

Task events come from the store's change feed (:mod:`keel.store.changes`): one reader per
server fans committed changes out to the streams that watch those tasks, and each stream
re-reads its task from the store, so a change committed by a worker in another process
(SQLite on one machine, PostgreSQL anywhere) reaches every front end's listeners, and
nothing is sent that is not committed.

The hooks, for the SDK (``mcp`` 2.3.0, pinned): its ``Extension`` cannot bind
``subscriptions/listen``, its event union is closed and its handler drops ``taskIds``
from the ack. So :class:`TaskPush` serves ``subscriptions/listen`` itself as a
``Server.middleware`` (public, provisional: the lowest public seam; covered by
``tests/tasks_extension/test_push_wire.py``), and owns the server's subscription bus
(``MCPServer(subscriptions=push.bus)``, a public parameter), so the SDK's four core
events still reach every listen stream::

    push = tasks.push()
    server = MCPServer(
        "app",
        extensions=[tasks],
        middleware=[tasks.middleware(), push],
        subscriptions=push.bus,
        lifespan=push.lifespan(keel_lifespan(app)),
    )

``push.close()`` ends every open stream gracefully (``keel serve`` calls it when a
signal stops the server, on HTTP and on stdio, where it then waits for
``push.wait_closed()`` before it stops serving); the feed reader stops with the lifespan.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import anyio
import anyio.abc
from mcp.server import MCPServer, ServerRequestContext
from mcp.server.context import CallNext, HandlerResult
from mcp.server.mcpserver import require_client_extension
from mcp.server.subscriptions import InMemorySubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import (
    SUBSCRIPTION_ID_META_KEY,
    ServerEvent,
    event_matches,
    event_to_notification,
)
from mcp_types import (
    INTERNAL_ERROR,
    Notification,
    RequestId,
    ServerNotification,
    SubscriptionFilter,
    SubscriptionsAcknowledgedNotification,
    SubscriptionsAcknowledgedNotificationParams,
    SubscriptionsListenResult,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from keel.errors import KeelError, TaskNotFound
from keel.mcp.answers import error_of
from keel.mcp.wire import TASKS_EXTENSION, listen_refused
from keel.model import Task
from keel.runtime import Keel

__all__ = ["MAX_STREAMS", "MAX_TASK_IDS", "TaskNotification", "TaskPush"]

log = logging.getLogger("keel.mcp.push")

MODERN = frozenset(MODERN_PROTOCOL_VERSIONS)
MAX_STREAMS = 10_000  # open listen streams one server serves at once
MAX_TASK_IDS = 1_000  # task ids one listen may name
MAX_EVENTS = 1_024  # distinct core events a stream may have pending before it is ended
FEED_RETRY = 1.0  # seconds before the feed reader tries again after the store failed
SEND_WAIT = 10.0  # seconds a 2025-11-25 session's notification may take before it is dropped

Lifespan = Callable[[MCPServer[Any]], AbstractAsyncContextManager[dict[str, Any]]]


class TaskNotification(Notification[dict[str, Any], Literal["notifications/tasks"]]):
    """``notifications/tasks``: params are the detailed task as ``tasks/get`` answers it
    (plain JSON, so a ``ttlMs: null`` is sent as it is) plus the stream's ``_meta``."""

    method: Literal["notifications/tasks"] = "notifications/tasks"
    params: dict[str, Any]


Wire = Callable[[Task], dict[str, Any]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def _visible(wire: dict[str, Any]) -> dict[str, Any]:
    """What a client sees change: all but ``lastUpdatedAt`` (a lease renewal moves it)."""
    return {k: v for k, v in wire.items() if k != "lastUpdatedAt"}


@dataclass(eq=False)
class _Session:
    """A 2025-11-25 session that asked for tasks: each change goes out through ``send``."""

    owner: str
    wire: Wire
    send: Send
    watched: set[str] = field(default_factory=set)
    dirty: set[str] = field(default_factory=set)
    sent: dict[str, dict[str, Any]] = field(default_factory=dict)
    wake: anyio.Event = field(default_factory=anyio.Event)

    def mark(self, task_ids: Iterable[str]) -> None:
        self.dirty.update(task_ids)
        self.wake.set()


@dataclass(eq=False)
class _Stream:
    """One open listen stream: what it watches and what it still has to send."""

    owner: str
    core: SubscriptionFilter
    uris: frozenset[str]
    request_id: RequestId  # the listen request's: its answer ends the stream
    watched: set[str] = field(default_factory=set)
    dirty: set[str] = field(default_factory=set)
    events: dict[ServerEvent, None] = field(default_factory=dict)
    sent: dict[str, dict[str, Any]] = field(default_factory=dict)
    wake: anyio.Event = field(default_factory=anyio.Event)
    closed: bool = False

    def mark(self, task_ids: Iterable[str]) -> None:
        self.dirty.update(task_ids)
        self.wake.set()

    def event(self, event: ServerEvent) -> None:
        if not event_matches(self.core, self.uris, event):
            return
        if len(self.events) >= MAX_EVENTS and event not in self.events:
            log.warning("listen stream backlog full; ending the stream")
            self.close()
            return
        self.events[event] = None
        self.wake.set()

    def close(self) -> None:
        self.closed = True
        self.wake.set()


def _requested(params: Any) -> tuple[SubscriptionFilter, list[str] | None]:
    """The core filter a listen asked for (only true flags kept, as the SDK acks them)
    and its task ids (None: it asked for none).

    Raises:
        MCPError: -32602 when ``notifications`` or ``taskIds`` is malformed.
    """
    notifications = params.get("notifications") if isinstance(params, dict) else None
    if not isinstance(notifications, dict):
        raise error_of(listen_refused("params.notifications must be an object"))
    task_ids = notifications.get("taskIds")
    if task_ids is not None and (
        not isinstance(task_ids, list) or not all(isinstance(i, str) for i in task_ids)
    ):
        raise error_of(listen_refused("notifications.taskIds must be an array of task ids"))
    if task_ids is not None and len(task_ids) > MAX_TASK_IDS:
        raise error_of(listen_refused(f"notifications.taskIds names more than {MAX_TASK_IDS}"))
    uris = notifications.get("resourceSubscriptions")
    if uris is not None and (
        not isinstance(uris, list) or not all(isinstance(u, str) for u in uris)
    ):
        raise error_of(listen_refused("notifications.resourceSubscriptions must be URIs"))
    core = SubscriptionFilter(
        tools_list_changed=True if notifications.get("toolsListChanged") is True else None,
        prompts_list_changed=True if notifications.get("promptsListChanged") is True else None,
        resources_list_changed=True if notifications.get("resourcesListChanged") is True else None,
        resource_subscriptions=list(uris) if uris else None,
    )
    return core, None if task_ids is None else list(dict.fromkeys(task_ids))


class TaskPush:
    """Serves ``subscriptions/listen`` for a Keel app's tasks (see the module doc).

    Args:
        app: the Keel app whose store is read and followed.
        wire: a task as ``tasks/get`` answers it (``TasksExtension`` passes its own).
        owner: the principal of a request (the owner its tasks are stored under).
    """

    def __init__(
        self,
        app: Keel,
        *,
        wire: Callable[[Task], dict[str, Any]],
        owner: Callable[[ServerRequestContext[Any, Any]], str],
    ) -> None:
        self.app = app
        self.bus = InMemorySubscriptionBus()
        """The server's subscription bus: pass it as ``MCPServer(subscriptions=…)``."""
        self._wire = wire
        self._owner = owner
        self._streams: set[_Stream] = set()
        self._sessions: dict[object, _Session] = {}  # by the SDK's session object
        self._watchers: dict[str, set[_Stream | _Session]] = {}
        self._running = False
        self._tg: anyio.abc.TaskGroup | None = None
        self._emptied = anyio.Event()  # set (and replaced) each time the last stream ends

    @property
    def streams(self) -> int:
        """How many listen streams are open."""
        return len(self._streams)

    # --- the lifespan: the feed reader ----------------------------------------------

    def lifespan(self, inner: Lifespan | None = None) -> Lifespan:
        """A ``MCPServer(lifespan=…)``: ``inner`` (say, ``keel_lifespan(app)``) with the
        change-feed reader running inside it; streams end gracefully when it ends."""

        @asynccontextmanager
        async def lifespan(server: MCPServer[Any]) -> AsyncIterator[dict[str, Any]]:
            async with contextlib.AsyncExitStack() as stack:
                state = await stack.enter_async_context(inner(server)) if inner else {}
                await stack.enter_async_context(self.running())
                yield state

        return lifespan

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Follow the store's change feed while the block runs; then end every stream."""
        async with anyio.create_task_group() as tg:
            started = anyio.Event()
            tg.start_soon(self._follow, started)
            with anyio.fail_after(30):  # the feed's first item comes at once
                await started.wait()
            self._running, self._tg = True, tg
            try:
                yield
            finally:
                self._running, self._tg = False, None
                self.close()
                tg.cancel_scope.cancel()

    def close(self) -> None:
        """End every open stream gracefully: each sends its listen result as its last
        frame (the spec's graceful close). Idempotent; returns at once."""
        for stream in list(self._streams):
            stream.close()

    async def wait_closed(self) -> list[RequestId]:
        """Wait until no listen stream is open (after :meth:`close`, each returns its
        result to the transport once it has sent what it had). The ids of the listen
        requests that were open: their answers are what the transport still writes.

        ``keel serve --transport stdio`` waits for this on SIGTERM, then for those
        answers to be written, before it stops serving: cancelling the server at once
        would cut the streams without their result (``keel.mcp.serving.run_stdio``)."""
        ids = [stream.request_id for stream in self._streams]
        while self._streams:
            await self._emptied.wait()
        return ids

    async def _follow(self, started: anyio.Event) -> None:
        """Fan the store's committed changes out to the streams watching those tasks."""
        while True:
            try:
                async for change in self.app.store.changes():
                    started.set()
                    if change.task_ids is None:  # anything may have changed: re-read all
                        listeners: list[_Stream | _Session] = [*self._streams]
                        for each in [*listeners, *self._sessions.values()]:
                            each.mark(each.watched)
                        continue
                    for task_id in change.task_ids:
                        for stream in self._watchers.get(task_id, ()):
                            stream.mark((task_id,))
            except KeelError as exc:  # the store failed: try again; streams re-read then
                log.warning("task change feed failed (%s); retrying", exc)
            started.set()
            await anyio.sleep(FEED_RETRY)

    # --- the middleware: one listen stream --------------------------------------------

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        if (
            ctx.method != "subscriptions/listen"
            or ctx.protocol_version not in MODERN
            or ctx.request_id is None
        ):
            return await call_next(ctx)
        core, task_ids = _requested(ctx.params)
        if task_ids is not None:
            require_client_extension(ctx, TASKS_EXTENSION)  # -32021
        if not self._running:  # no lifespan of ours: the SDK serves the core events
            if task_ids is None:
                return await call_next(ctx)
            raise MCPError(INTERNAL_ERROR, "task notifications are not running on this server")
        if len(self._streams) >= MAX_STREAMS:
            raise MCPError(INTERNAL_ERROR, "Subscription limit reached")
        uris = frozenset(core.resource_subscriptions or ())
        stream = _Stream(self._owner(ctx), core, uris, ctx.request_id)
        # Watch before reading: a change committed from now on marks the stream.
        self._watch(stream, task_ids or ())
        unsubscribe = self.bus.subscribe(stream.event)
        try:
            return await self._serve(ctx, stream, task_ids)
        finally:
            unsubscribe()
            self._unwatch(stream, set(stream.watched))
            self._streams.discard(stream)
            if not self._streams:
                self._emptied.set()
                self._emptied = anyio.Event()

    def _watch(self, stream: _Stream | _Session, task_ids: Iterable[str]) -> None:
        if isinstance(stream, _Stream):
            self._streams.add(stream)
        for task_id in task_ids:
            stream.watched.add(task_id)
            self._watchers.setdefault(task_id, set()).add(stream)

    def _unwatch(self, stream: _Stream | _Session, task_ids: Iterable[str]) -> None:
        for task_id in task_ids:
            stream.watched.discard(task_id)
            watchers = self._watchers.get(task_id)
            if watchers is not None:
                watchers.discard(stream)
                if not watchers:
                    del self._watchers[task_id]

    async def _serve(
        self, ctx: ServerRequestContext[Any, Any], stream: _Stream, task_ids: list[str] | None
    ) -> SubscriptionsListenResult:
        meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: ctx.request_id}
        first: dict[str, Task] = {}
        for task_id in task_ids or ():
            task = await self._read(stream, task_id)
            if task is not None:
                first[task_id] = task
        honored = stream.core.model_copy()
        if task_ids is not None:
            honored = SubscriptionFilter.model_validate(
                {**honored.model_dump(by_alias=True, exclude_none=True), "taskIds": list(first)}
            )
        await ctx.session.send_notification(
            SubscriptionsAcknowledgedNotification(
                params=SubscriptionsAcknowledgedNotificationParams(
                    notifications=honored, _meta=meta
                )
            ),
            related_request_id=ctx.request_id,
        )
        for task in first.values():
            await self._send(ctx, stream, task, meta)
        # A stream for tasks only ends, gracefully, once they all have: nothing more comes.
        only_tasks = task_ids is not None and stream.core == SubscriptionFilter()
        while not stream.closed and not (only_tasks and not stream.watched):
            await stream.wake.wait()
            stream.wake = anyio.Event()
            await self._drain(ctx, stream, meta)
        await self._drain(ctx, stream, meta)  # what came before the close still goes out
        return SubscriptionsListenResult(_meta=meta)

    async def _drain(
        self, ctx: ServerRequestContext[Any, Any], stream: _Stream, meta: dict[str, Any]
    ) -> None:
        """Send the stream's pending core events, then the state of its changed tasks."""
        while stream.events:
            event = next(iter(stream.events))
            del stream.events[event]
            await ctx.session.send_notification(
                event_to_notification(event, meta), related_request_id=ctx.request_id
            )
        dirty, stream.dirty = stream.dirty & stream.watched, set()
        for task_id in dirty:
            task = await self._read(stream, task_id)
            if task is not None:
                await self._send(ctx, stream, task, meta)

    async def _read(self, stream: _Stream | _Session, task_id: str) -> Task | None:
        """The task as the store has it now, if it is the stream owner's; else it is no
        longer watched (unknown, another principal's or purged: all alike)."""
        try:
            return await self.app.store.get(task_id, owner=stream.owner)
        except TaskNotFound:
            self._unwatch(stream, (task_id,))
            return None
        except KeelError as exc:  # unavailable for now: the feed's next item re-reads it
            log.warning("cannot read task %s for a listen stream: %s", task_id, exc)
            return None

    async def _send(
        self,
        ctx: ServerRequestContext[Any, Any],
        stream: _Stream,
        task: Task,
        meta: dict[str, Any],
    ) -> None:
        """``notifications/tasks`` with the task, unless the stream sent this very state
        (a lease renewal moves only ``lastUpdatedAt``: no change a client sees)."""
        wire = self._wire(task)
        seen = _visible(wire)
        if stream.sent.get(task.task_id) != seen:
            stream.sent[task.task_id] = seen
            # The SDK's ServerNotification union lacks the extension's notification, which
            # the session only serializes: the cast is for the type checker alone.
            notification = cast(
                "ServerNotification", TaskNotification(params={**wire, "_meta": meta})
            )
            await ctx.session.send_notification(notification, related_request_id=ctx.request_id)
        if task.status.terminal:
            self._unwatch(stream, (task.task_id,))
            stream.sent.pop(task.task_id, None)

    # --- 2025-11-25 sessions ----------------------------------------------------------

    def watch_session(self, key: object, owner: str, task: Task, wire: Wire, send: Send) -> None:
        """A 2025-11-25 session (``key``: the SDK's session object) asked for ``task``:
        each later change of it is sent as ``send(wire(task))`` until it ends. Nothing
        when push is not running, or for a task that has ended already."""
        if self._tg is None or task.status.terminal:
            return
        session = self._sessions.get(key)
        if session is None:
            if len(self._sessions) >= MAX_STREAMS:
                return
            session = self._sessions[key] = _Session(owner, wire, send)
            self._tg.start_soon(self._serve_session, key, session)
        if task.task_id not in session.watched:
            session.sent[task.task_id] = _visible(wire(task))  # what the caller just saw
            self._watch(session, (task.task_id,))
            session.mark((task.task_id,))  # it may have changed since the caller read it

    async def _serve_session(self, key: object, session: _Session) -> None:
        """Send a session's watched tasks as they change, until none is left or a send
        fails (the session is gone)."""
        try:
            while session.watched:
                await session.wake.wait()
                session.wake = anyio.Event()
                dirty, session.dirty = session.dirty & session.watched, set()
                for task_id in dirty:
                    task = await self._read(session, task_id)
                    if task is None:
                        continue
                    wire = session.wire(task)
                    if session.sent.get(task_id) != _visible(wire):
                        session.sent[task_id] = _visible(wire)
                        with anyio.fail_after(SEND_WAIT):
                            await session.send(wire)
                    if task.status.terminal:
                        self._unwatch(session, (task_id,))
        except Exception as exc:  # fan-out boundary: a closed or stuck session only ends its own
            log.debug("2025-11-25 session no longer takes task notifications: %r", exc)
        finally:
            self._unwatch(session, set(session.watched))
            self._sessions.pop(key, None)
