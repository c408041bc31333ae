"""Polls of a task in the task's trace: ``tasks/*`` requests parented to its stored context.

The ``mcp`` SDK opens a root span for every request that brings no ``traceparent`` in
its ``_meta``; its spans fall back to the current context when there is none
(``mcp.shared._otel.extract_trace_context``). :class:`TracePolls`, placed before the SDK's
OpenTelemetry middleware (the first of ``server.middleware``, outermost-first), makes the
context a task was created in (see :mod:`keel.telemetry.tracing`) the current one while
a ``tasks/get``, ``tasks/update``, ``tasks/cancel``, ``tasks/result`` of that task is
handled: the SDK's span of the poll becomes a child of the task's ``tools/call`` span
instead of a trace of its own. It costs one store read of the task per poll, and only
when spans are recorded; a request that brings its own ``traceparent`` keeps it.

It runs before authorization: it reads the stored context of whatever task id a
request names, and uses it only for the server's own span of that request.
"""

from __future__ import annotations

import logging
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from opentelemetry import context as otel_context

from keel.errors import KeelError
from keel.runtime import Keel
from keel.telemetry import tracing

__all__ = ["POLLS", "TracePolls"]

log = logging.getLogger("keel.mcp")

POLLS = frozenset({"tasks/get", "tasks/update", "tasks/cancel", "tasks/result"})
"""The requests about one task (``params.taskId``), of both protocol generations."""


class TracePolls:
    """The middleware (see the module doc)."""

    def __init__(self, app: Keel) -> None:
        self.app = app

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        task_id = (ctx.params or {}).get("taskId") if ctx.method in POLLS else None
        if not isinstance(task_id, str) or not tracing.enabled():
            return await call_next(ctx)
        if ctx.meta and "traceparent" in ctx.meta:  # the client's own context wins
            return await call_next(ctx)
        try:
            carrier = (await self.app.store.get(task_id)).trace_context
        except KeelError as exc:  # the handler will meet the same and answer it
            log.debug("no trace context for a poll of %s: %s", task_id, exc)
            carrier = None
        parent = tracing.parent_of(carrier)
        if parent is None:
            return await call_next(ctx)
        token = otel_context.attach(parent)
        try:
            return await call_next(ctx)
        finally:
            otel_context.detach(token)
