"""How the CLI shows tasks: stable JSON for machines, tables and reports for people.

The JSON field names are a contract (scripts parse ``keel tasks list --json``): add
fields, never rename or remove them. Times are seconds since the epoch, as stored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

import click

from keel.model import Event, JsonObject, JsonValue, Reclaimed, Status, Task

__all__ = [
    "dump_json",
    "event_to_json",
    "format_time",
    "reclaimed_to_json",
    "show_lines",
    "status_text",
    "task_table",
    "task_to_json",
]

_STATUS_COLOURS = {
    Status.WORKING: "cyan",
    Status.INPUT_REQUIRED: "yellow",
    Status.COMPLETED: "green",
    Status.FAILED: "red",
    Status.CANCELLED: "magenta",
}


def task_to_json(
    task: Task,
    history: Sequence[Event] | None = None,
    steps: Mapping[str, JsonValue] | None = None,
) -> JsonObject:
    """Every field of the task, with stable names; ``history`` and ``steps`` when given."""
    data: JsonObject = {
        "task_id": task.task_id,
        "status": task.status.value,
        "name": task.name,
        "owner": task.owner,
        "arguments": task.arguments,
        "status_message": task.status_message,
        "input_requests": {k: r.to_json() for k, r in task.input_requests.items()},
        "input_responses": dict(task.input_responses),
        "pending_input": list(task.pending_input),
        "result": task.result,
        "error": task.error,
        "idempotency_key": task.idempotency_key,
        "attempt": task.attempt,
        "max_attempts": task.max_attempts,
        "lease": (
            None
            if task.lease_owner is None
            else {"owner": task.lease_owner, "expires_at": task.lease_expires_at}
        ),
        "fence": task.fence,
        "closed_fence": task.closed_fence,
        "ready_at": task.ready_at,
        "ttl": task.ttl,
        "expires_at": task.expires_at,
        "created_at": task.created_at,
        "updated_at": task.updated_at,
    }
    if history is not None:
        data["history"] = [event_to_json(e) for e in history]
    if steps is not None:
        data["steps"] = dict(steps)
    return data


def event_to_json(event: Event) -> JsonObject:
    """One history entry; ``from`` is null for the event that created the task."""
    return {
        "at": event.at,
        "from": None if event.from_status is None else event.from_status.value,
        "to": event.to_status.value,
        "reason": event.reason,
        "actor": event.actor,
    }


def reclaimed_to_json(item: Reclaimed) -> JsonObject:
    """One task that ``reclaim`` failed."""
    return {
        "task_id": item.task_id,
        "previous_status": item.previous_status.value,
        "idle_seconds": item.idle_seconds,
        "reason": item.reason,
    }


def dump_json(value: JsonValue) -> str:
    """Indented, key order kept, non-ASCII text kept readable."""
    return json.dumps(value, indent=2, ensure_ascii=False)


def _compact(value: JsonValue) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


_INLINE_CHARS = 120  # longer JSON values are shown indented, on lines of their own


def _value_lines(label: str, value: JsonValue, indent: str = "") -> list[str]:
    """``label value`` on one line if short, else the label and the value indented below."""
    text = _compact(value)
    if len(text) <= _INLINE_CHARS:
        return [f"{indent}{label}{text}"]
    body = json.dumps(value, ensure_ascii=False, indent=2).splitlines()
    pad = indent + "    "
    return [f"{indent}{label.rstrip()}", *(pad + line for line in body)]


def format_time(seconds: float | None) -> str:
    """A stored time for people: UTC, to the second (``2026-11-30 20:32:09Z``)."""
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def status_text(status: Status) -> str:
    """The status, coloured when the output is a terminal (click strips it otherwise)."""
    return click.style(status.value, fg=_STATUS_COLOURS[status], bold=status.terminal)


_COLUMNS = ("ID", "STATUS", "NAME", "STATUS MESSAGE", "ATTEMPT", "UPDATED")


_MESSAGE_CHARS = 48  # the table clips status messages; show and --json have them whole


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _row(task: Task) -> tuple[str, ...]:
    return (
        task.task_id,
        task.status.value,
        task.name or "-",
        _clip(task.status_message or "", _MESSAGE_CHARS),
        f"{task.attempt}/{task.max_attempts}",
        format_time(task.updated_at),
    )


def task_table(tasks: Sequence[Task]) -> str:
    """The task list as aligned columns, like ``kubectl get``: one line per task.

    The same layout on a terminal and in a pipe (``grep``, ``awk``): no box drawing, no
    wrapping (a line longer than the terminal wraps as the terminal wraps it). The status
    is coloured; :func:`click.echo` drops the colour when stdout is not a terminal.
    """
    rows = [_COLUMNS, *(_row(t) for t in tasks)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    lines = []
    for index, row in enumerate(rows):
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
        cells[-1] = row[-1]  # no trailing padding
        if index == 0:
            cells = [click.style(c, bold=True) for c in cells]
        else:
            cells[1] = click.style(cells[1], fg=_STATUS_COLOURS[tasks[index - 1].status])
        lines.append("  ".join(cells))
    return "\n".join(lines)


def show_lines(
    task: Task, history: Sequence[Event], steps: Mapping[str, JsonValue] | None = None
) -> list[str]:
    """``keel tasks show``: every field of the task, its checkpointed steps, then its
    history, for people."""
    lines = [
        f"task            {task.task_id}",
        f"status          {status_text(task.status)}",
        f"status message  {task.status_message or '-'}",
        f"name            {task.name or '- (facade task: the caller records the outcome)'}",
        f"owner           {task.owner or '-'}",
        f"idempotency key {task.idempotency_key or '-'}",
        f"created         {format_time(task.created_at)}",
        f"updated         {format_time(task.updated_at)}",
        f"attempt         {task.attempt} of {task.max_attempts}",
    ]
    if task.lease_owner is None:
        lines.append(f"lease           none (fence {task.fence})")
    else:
        lines.append(
            f"lease           {task.lease_owner} until {format_time(task.lease_expires_at)} "
            f"(fence {task.fence})"
        )
    if task.ttl is None:
        lines.append("ttl             none (kept until deleted)")
    else:
        lines.append(
            f"ttl             {task.ttl:g}s (purgeable after {format_time(task.expires_at)}"
            " once finished)"
        )
    lines += _value_lines("arguments       ", task.arguments)
    if task.input_requests:
        lines.append("input requests")
        for key, request in task.input_requests.items():
            answered = key in task.input_responses
            state = "answered" if answered else click.style("pending", fg="yellow")
            lines.append(f"  {key} [{state}]: {request.message}")
            lines += _value_lines("schema   ", request.schema, "    ")
            if answered:
                lines += _value_lines("response ", task.input_responses[key], "    ")
    else:
        lines.append("input requests  none")
    if task.result is not None or task.status is Status.COMPLETED:
        lines += _value_lines("result          ", task.result)
    if task.error is not None:
        lines += _value_lines("error           ", task.error)
    return lines + _steps_and_history(steps or {}, history)


def _steps_and_history(steps: Mapping[str, JsonValue], history: Sequence[Event]) -> list[str]:
    lines = []
    if steps:
        lines.append("steps (checkpointed results; not run again)")
        for name, value in steps.items():
            lines += _value_lines(f"  {name}: ", value, "    ")
    lines.append("history")
    for event in history:
        source = "(new)" if event.from_status is None else event.from_status.value
        lines.append(
            f"  {format_time(event.at)}  {source} -> {event.to_status.value}  "
            f"{event.reason}  [{event.actor}]"
        )
    return lines
