"""Logs of a Keel process: one line per committed task transition, text or JSON.

:class:`TransitionLog` is a :class:`~keel.store.observed.CommitObserver`: each history
entry a write of this process committed is logged once, on the ``keel.tasks`` logger at
INFO, with the task id, tool, attempt, worker and a hash of the principal (the task's
owner): never an argument, an input, a result or an error, which may hold what users
typed, unless asked for (``KEEL_LOG_PAYLOADS=on``, :func:`payloads_asked`).
:func:`configure` sets up the process's logging in the chosen format (``--log-format
text|json`` of ``keel serve`` and ``keel worker``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from typing import Any

from keel.errors import ConfigurationError
from keel.model import Status, Task
from keel.store.observed import Committed, Transition

__all__ = [
    "FORMATS",
    "PAYLOADS_VAR",
    "JsonFormatter",
    "TransitionLog",
    "configure",
    "payloads_asked",
    "principal_hash",
]

FORMATS = ("text", "json")
PAYLOAD_FIELDS = ("arguments", "input", "result", "error")
"""What users typed: in a transition's record only when asked for (:data:`PAYLOADS_VAR`)."""
FIELDS = ("task_id", "tool", "from_status", "to_status", "attempt", "worker", "principal",
          "op", *PAYLOAD_FIELDS)  # fmt: skip
"""The fields of a transition's log record (``extra``), in the order text shows them."""
PAYLOADS_VAR = "KEEL_LOG_PAYLOADS"
"""``KEEL_LOG_PAYLOADS=on``: transition lines also carry the arguments (create), the
answers (provide_input), the result and the error, as JSON cut at
:data:`MAX_PAYLOAD_CHARS`: for debugging, where the logs may hold what users typed."""
MAX_PAYLOAD_CHARS = 2000
_ON, _OFF = {"1", "on", "true", "yes"}, {"", "0", "off", "false", "no"}

log = logging.getLogger("keel.tasks")


def principal_hash(owner: str) -> str:
    """A stable, non-reversible name of a principal for logs (``-``: no principal)."""
    if not owner:
        return "-"
    return hashlib.sha256(owner.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _worker(transition: Transition, what: str) -> str:
    old, new = transition.old, transition.new
    if new is not None and new.lease_owner is not None:
        return new.lease_owner
    if old is not None and old.lease_owner is not None:
        return old.lease_owner
    actor = transition.event.actor
    return actor.removeprefix("worker:") if actor.startswith("worker:") else f"({actor})"


def payloads_asked() -> bool:
    """Whether ``KEEL_LOG_PAYLOADS`` asks for payloads in transition lines.

    Raises:
        ConfigurationError: a value other than on/off (``1``/``0``, ``true``/``false``,
            ``yes``/``no``).
    """
    text = os.environ.get(PAYLOADS_VAR, "").strip().lower()
    if text not in _ON | _OFF:
        raise ConfigurationError(f"{PAYLOADS_VAR}={text!r}: expected on or off")
    return text in _ON


def _json(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= MAX_PAYLOAD_CHARS else text[:MAX_PAYLOAD_CHARS] + "…"


def _payloads(transition: Transition) -> dict[str, str]:
    """What users typed that ``transition`` brought, as cut JSON (see :data:`PAYLOADS_VAR`)."""
    old, new = transition.old, transition.new
    if new is None:
        return {}
    out = {}
    if old is None:
        out["arguments"] = _json(new.arguments)
    given = {k: v for k, v in new.input_responses.items()
             if old is None or k not in old.input_responses}  # fmt: skip
    if given:
        out["input"] = _json(given)
    if new.status is Status.COMPLETED:
        out["result"] = _json(new.result)
    elif new.status is Status.FAILED:
        out["error"] = _json(new.error)
    return out


class TransitionLog:
    """Logs every transition a store committed (see the module doc); with ``payloads``,
    what users typed too (:data:`PAYLOADS_VAR`)."""

    def __init__(self, *, payloads: bool = False) -> None:
        self.payloads = payloads

    def committed(self, commit: Committed) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        if commit.what == "claim":
            for task in commit.result:
                self._emit(task, "working", "working", task.lease_owner or "-", "claim")
            return
        for transition in commit.transitions:
            task = transition.task
            if task is None:
                continue
            event = transition.event
            before = "-" if event.from_status is None else event.from_status.value
            payloads = _payloads(transition) if self.payloads else None
            self._emit(task, before, event.to_status.value, _worker(transition, commit.what),
                       commit.what, payloads=payloads)  # fmt: skip

    def _emit(
        self, task: Task, before: str, after: str, worker: str, what: str, *,
        payloads: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        fields: dict[str, Any] = {
            "task_id": task.task_id,
            "tool": task.name or "",
            "from_status": before,
            "to_status": after,
            "attempt": task.attempt,
            "worker": worker,
            "principal": principal_hash(task.owner),
            "op": what,
            **(payloads or {}),
        }
        log.info("task %s %s: %s -> %s", task.task_id, what, before, after, extra=fields)


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, and a transition's fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            if name in record.__dict__:
                out[name] = record.__dict__[name]
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = [f"{n}={record.__dict__[n]}" for n in FIELDS if n in record.__dict__]
        return f"{line} {' '.join(extra)}" if extra else line


def configure(log_format: str = "text", *, verbose: bool = False) -> None:
    """The process's logging: to stderr, INFO with ``verbose`` (task transitions
    included), else WARNING; ``log_format`` ``text`` or ``json``."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        formatter: logging.Formatter = JsonFormatter()
        formatter.converter = time.gmtime
    else:
        formatter = _TextFormatter("%(asctime)s %(name)s %(levelname)s %(message)s")
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.INFO if verbose else logging.WARNING)
