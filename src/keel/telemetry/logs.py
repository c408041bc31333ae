"""Logs of a Keel process: one line per committed task transition, text or JSON.

:class:`TransitionLog` is a :class:`~keel.store.observed.CommitObserver`: each history
entry a write of this process committed is logged once, on the ``keel.tasks`` logger at
INFO, with the task id, tool, attempt, worker and a hash of the principal (the task's
owner): never an argument, an input, a result or an error message, which may hold what
users typed. :func:`configure` sets up the process's logging in the chosen format
(``--log-format text|json`` of ``keel serve`` and ``keel worker``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import time
from typing import Any

from keel.model import Task
from keel.store.observed import Committed, Transition

__all__ = ["FORMATS", "JsonFormatter", "TransitionLog", "configure", "principal_hash"]

FORMATS = ("text", "json")
FIELDS = ("task_id", "tool", "from_status", "to_status", "attempt", "worker", "principal", "op")
"""The fields of a transition's log record (``extra``), in the order text shows them."""

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


class TransitionLog:
    """Logs every transition a store committed (see the module doc)."""

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
            self._emit(task, before, event.to_status.value, _worker(transition, commit.what),
                       commit.what)  # fmt: skip

    def _emit(self, task: Task, before: str, after: str, worker: str, what: str) -> None:
        fields = {
            "task_id": task.task_id,
            "tool": task.name or "",
            "from_status": before,
            "to_status": after,
            "attempt": task.attempt,
            "worker": worker,
            "principal": principal_hash(task.owner),
            "op": what,
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
