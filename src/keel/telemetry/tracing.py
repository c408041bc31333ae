"""Traces of tasks (OpenTelemetry): one trace per task, across processes and restarts.

The ``mcp`` SDK opens a span for every request (``tools/call NAME`` …). When a task is
created inside a recorded span, the span's context (W3C ``traceparent``/``tracestate``)
is stored with the task, in the same transaction (:attr:`keel.model.Task.trace_context`).
Every attempt, whichever process runs it, is then a span parented to that stored
context, and so is every ``ctx.step``: a step's span does not hang below its attempt's,
because a process killed mid-attempt never exports the attempt's open span, and a child
whose parent is missing breaks the trace. So the trace of a task is the ``tools/call``
span with, below it, each attempt and each step, in any process:

* ``keel.attempt NAME`` (kind CONSUMER): ``mcp.task.id``, ``mcp.task.attempt``,
  ``mcp.task.fence``, ``mcp.task.worker``, ``gen_ai.tool.name``, the messaging
  conventions' ``messaging.*`` (the task a message, its tool the destination), and how it ended:
  ``mcp.task.outcome`` and ``mcp.task.status`` (the status it left the task in). Events
  ``mcp.task.input_requested`` (the attempt parks) and ``mcp.task.input_received`` (an
  attempt resumes with answers): the input wait is between the two;
* ``keel.step NAME``: the same task attributes and ``mcp.task.step.replayed``: a step
  whose recorded result is returned is a zero-length span marked replayed, not re-timed.

Keel uses the API only (a dependency). Without an SDK (``pip install 'keel-tasks[otel]'``
and a configured tracer provider) nothing is recorded, stored or read: the cost is one
check per attempt.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, StatusCode, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from keel.errors import ConfigurationError
from keel.model import Task

__all__ = [
    "FILE_ENV",
    "TRACER",
    "attempt_span",
    "configure_from_environment",
    "current_carrier",
    "enabled",
    "file_rotation",
    "parent_of",
    "step_span",
    "use_tracer_provider",
]

log = logging.getLogger("keel.telemetry")

TRACER = "keel"
_PROPAGATOR = TraceContextTextMapPropagator()
FILE_ENV = "KEEL_OTEL_FILE"  # export spans to this file as OTLP/JSON lines
FILE_MAX_BYTES_ENV = "KEEL_OTEL_FILE_MAX_BYTES"  # rotate it past this size (0: never)
FILE_BACKUPS_ENV = "KEEL_OTEL_FILE_BACKUPS"  # rotated files kept beside it
_provider: TracerProvider | None = None


def use_tracer_provider(provider: TracerProvider | None) -> None:
    """Keel's spans go to ``provider`` (None: the global one, ``trace.set_tracer_provider``)."""
    global _provider  # noqa: PLW0603 - one process-wide setting, as OpenTelemetry's own
    _provider = provider


_tracers: dict[int, tuple[TracerProvider, trace.Tracer]] = {}


def _tracer() -> trace.Tracer:
    """Keel's tracer from the current provider (kept: ``get_tracer`` is not cheap)."""
    provider = _provider or trace.get_tracer_provider()
    kept = _tracers.get(id(provider))
    if kept is None or kept[0] is not provider:
        kept = _tracers[id(provider)] = (provider, provider.get_tracer(TRACER))
    return kept[1]


def enabled() -> bool:
    """Whether spans are recorded at all (an SDK provider is set)."""
    provider = _provider or trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def current_carrier() -> dict[str, str] | None:
    """The current span's context as W3C headers, to store with a new task (None: no
    recorded span is current)."""
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier or None


def parent_of(carrier: Mapping[str, str] | None) -> Context | None:
    """The context stored with a task, to parent its spans to (None: none stored)."""
    if not carrier:
        return None
    return _PROPAGATOR.extract(dict(carrier))


def _task_attributes(task: Task, worker: str) -> dict[str, Any]:
    return {
        "mcp.task.id": task.task_id,
        "mcp.task.attempt": task.attempt,
        "mcp.task.fence": task.fence,
        "mcp.task.worker": worker,
        "gen_ai.tool.name": task.name or "",
    }


def _messaging(task: Task, worker: str) -> dict[str, Any]:
    """An attempt is a consumer processing a message, in OpenTelemetry's messaging
    semantic conventions: the task is the message, its tool the destination."""
    return {
        "messaging.system": "keel",
        "messaging.operation.type": "process",
        "messaging.operation.name": "attempt",
        "messaging.destination.name": task.name or "",
        "messaging.message.id": task.task_id,
        "messaging.client.id": worker,
    }


@contextmanager
def attempt_span(task: Task, worker: str, parent: Context | None) -> Iterator[Span]:
    """The span of one attempt of ``task`` (see the module doc); an error escaping it is
    recorded on it. Without an SDK, the API's invalid span, at no cost."""
    if not enabled():
        yield trace.INVALID_SPAN
        return
    with _tracer().start_as_current_span(
        f"keel.attempt {task.name or ''}".strip(),
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes={**_task_attributes(task, worker), **_messaging(task, worker)},
    ) as span:
        if task.input_responses and span.is_recording():
            span.add_event(
                "mcp.task.input_received", {"mcp.task.input.keys": list(task.input_responses)}
            )
        yield span


def end_attempt(span: Span, outcome: str, status: str, *, error: str | None = None) -> None:
    """Say on the attempt's span how it ended and the status it left the task in."""
    if not span.is_recording():
        return
    span.set_attributes({"mcp.task.outcome": outcome, "mcp.task.status": status})
    if error is not None:
        span.set_status(StatusCode.ERROR, error)


def input_requested(span: Span, keys: tuple[str, ...]) -> None:
    if span.is_recording():
        span.add_event("mcp.task.input_requested", {"mcp.task.input.keys": list(keys)})


@contextmanager
def step_span(
    name: str, task: Task, worker: str, parent: Context | None, *, replayed: bool
) -> Iterator[Span]:
    """The span of one ``ctx.step`` (a replayed step's ends at once)."""
    attributes = {**_task_attributes(task, worker), "mcp.task.step.name": name,
                  "mcp.task.step.replayed": replayed}  # fmt: skip
    with _tracer().start_as_current_span(
        f"keel.step {name}", context=parent, attributes=attributes
    ) as span:
        yield span


def file_rotation() -> dict[str, int]:
    """The span file's rotation, from ``KEEL_OTEL_FILE_MAX_BYTES`` and
    ``KEEL_OTEL_FILE_BACKUPS`` (unset: :mod:`keel.telemetry.span_file`'s defaults), as
    :class:`~keel.telemetry.span_file.FileSpanExporter`'s keyword arguments.

    Raises:
        ConfigurationError: a value that is not a whole number >= 0.
    """
    settings = {}
    for name, option in ((FILE_MAX_BYTES_ENV, "max_bytes"), (FILE_BACKUPS_ENV, "backups")):
        text = os.environ.get(name, "").strip()
        if not text:
            continue
        if not (text.isascii() and text.isdigit()):  # no sign, no "1e6", no "1_000"
            raise ConfigurationError(f"{name}={text!r}: expected a whole number >= 0")
        settings[option] = int(text)
    return settings


def configure_from_environment(service: str) -> bool:
    """Export spans when asked, with the ``[otel]`` extra installed: by OTLP/HTTP when
    OpenTelemetry's standard variables say where (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``; a batch processor), and to a file as OTLP/JSON
    lines when ``KEEL_OTEL_FILE`` names one (each span as it ends, rotated by size:
    ``KEEL_OTEL_FILE_MAX_BYTES``, ``KEEL_OTEL_FILE_BACKUPS``, see
    :mod:`keel.telemetry.span_file`); both if both are set. Service name
    ``OTEL_SERVICE_NAME``, else ``service``. What ``keel serve`` and ``keel worker`` call;
    True if spans are now exported.

    Raises:
        ConfigurationError: ``KEEL_OTEL_FILE`` names a file that cannot be opened, or
            a rotation setting is not a whole number >= 0.
    """
    otlp = any(os.environ.get(v) for v in ("OTEL_EXPORTER_OTLP_ENDPOINT",
                                           "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))  # fmt: skip
    file = os.environ.get(FILE_ENV)
    if not otlp and not file:
        return False
    rotation = file_rotation() if file else {}
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider as SdkProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        from keel.telemetry.span_file import FileSpanExporter
    except ImportError:
        log.warning(
            "spans are asked for (OTEL_EXPORTER_OTLP_* or KEEL_OTEL_FILE) but the SDK is "
            "not installed: pip install 'keel-tasks[otel]'; no spans are exported"
        )
        return False
    name = os.environ.get("OTEL_SERVICE_NAME") or service
    provider = SdkProvider(resource=Resource.create({"service.name": name}))
    if otlp:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if file:
        try:
            exporter = FileSpanExporter(file, **rotation)
        except OSError as exc:
            raise ConfigurationError(f"{FILE_ENV}={file}: cannot write spans there: {exc}") from exc
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # the SDK's MCP spans go there too
    return True
