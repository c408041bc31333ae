"""How the CLI shows tasks: stable JSON for machines, tables and reports for people.

The JSON field names are a contract (scripts parse ``keel tasks list --json``): add
fields, never rename or remove them. Times are seconds since the epoch, as stored.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import click

from keel.model import Event, JsonObject, JsonValue, Reclaimed, Status, Task

__all__ = [
    "Column",
    "dump_json",
    "event_to_json",
    "format_time",
    "reclaimed_table",
    "reclaimed_to_json",
    "show_lines",
    "status_text",
    "table",
    "task_table",
    "task_to_json",
    "terminal_width",
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
        "claimed_at": task.claimed_at,
        "ready_at": task.ready_at,
        "ttl": task.ttl,
        "expires_at": task.expires_at,
        "created_at": task.created_at,
        "updated_at": task.updated_at,
        "trace_context": None if task.trace_context is None else dict(task.trace_context),
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
    """A stored time for people: UTC, to the second (``2026-11-30 20:32:09Z``).

    A time no calendar holds (``1e308``, NaN: imported before import checked the range)
    is shown as the number stored, so one bad row cannot stop a whole listing.
    """
    if seconds is None:
        return "-"
    try:
        return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return f"{seconds!r}s (out of range)"


def status_text(status: Status) -> str:
    """The status, coloured when the output is a terminal (click strips it otherwise)."""
    return click.style(status.value, fg=_STATUS_COLOURS[status], bold=status.terminal)


_MESSAGE_CHARS = 48  # the table clips status messages; show and --json have them whole
_UNLIMITED = 1_000_000  # characters: a pipe's lines are never cut


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def terminal_width() -> int | None:
    """The terminal's width when stdout is one; None for a pipe or a file."""
    if not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size().columns


@dataclass(frozen=True, slots=True)
class Column:
    """A column of :func:`table`: its header, and whether it may shrink to fit a terminal
    (ids, statuses and times never do: they are what people copy and grep)."""

    header: str
    shrinks: bool = False


Cell = str | tuple[str, str]
"""A cell's text, or its text and a rich style (a colour)."""


def table(columns: Sequence[Column], rows: Iterable[Sequence[Cell]], width: int | None) -> str:
    """Rows as aligned columns under a bold header, like ``kubectl get``: no box drawing,
    two spaces between columns, one line per row, no trailing spaces.

    ``width`` is the terminal's (:func:`terminal_width`): there the columns that may shrink
    are cut with ``…`` so that a line fits (see :func:`_widths`). With None (a pipe or a
    file) nothing is cut, so the layout is the same for every reader (``grep``, ``awk``).
    Colours are ANSI codes that :func:`click.echo` drops when stdout is not a terminal;
    cell text is never read as rich markup.
    """
    # rich is imported here, by the commands that draw a table: not by every command.
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    cells = [[Text.assemble(cell) for cell in row] for row in rows]
    natural = [
        max([len(column.header), *(row[index].cell_len for row in cells)])
        for index, column in enumerate(columns)
    ]
    grid = Table(box=None, pad_edge=False, show_edge=False, header_style="none")
    for column, chosen in zip(columns, _widths(columns, natural, width), strict=True):
        header = Text.assemble((column.header, "bold"))
        grid.add_column(header, width=chosen, no_wrap=True, overflow="ellipsis")
    for row in cells:
        grid.add_row(*row)
    console = Console(
        width=_UNLIMITED,  # the columns' widths are chosen above: rich must not squeeze them
        force_terminal=True,  # always the codes; click.echo strips them where they do not belong
        color_system="standard",
        highlight=False,
    )
    with console.capture() as captured:
        console.print(grid)
    return "\n".join(line.rstrip() for line in captured.get().splitlines())


_NARROWEST = 8  # characters a shrinking column keeps on a narrow terminal


def _widths(columns: Sequence[Column], natural: Sequence[int], width: int | None) -> list[int]:
    """Each column's width: its widest cell; but on a terminal ``width`` wide, the columns
    that may shrink give up, widest first, what a line lacks, down to ``_NARROWEST`` each.
    The others never shrink: on a terminal too narrow even for them, lines wrap as the
    terminal wraps any long line, and no id is ever cut."""
    widths = list(natural)
    if width is None:
        return widths
    excess = sum(widths) + 2 * (len(widths) - 1) - width
    while excess > 0:
        can = [i for i, column in enumerate(columns) if column.shrinks and widths[i] > _NARROWEST]
        if not can:
            break
        widths[max(can, key=lambda i: widths[i])] -= 1
        excess -= 1
    return widths


_TASK_COLUMNS = (
    Column("ID"),
    Column("STATUS"),
    Column("NAME", shrinks=True),
    Column("STATUS MESSAGE", shrinks=True),
    Column("ATTEMPT"),
    Column("UPDATED"),
)


def task_table(tasks: Sequence[Task], width: int | None = None) -> str:
    """``keel tasks list``: one line per task, the status coloured (see :func:`table`)."""
    return table(
        _TASK_COLUMNS,
        (
            (
                task.task_id,
                (task.status.value, _STATUS_COLOURS[task.status]),
                task.name or "-",
                _clip(task.status_message or "", _MESSAGE_CHARS),
                f"{task.attempt}/{task.max_attempts}",
                format_time(task.updated_at),
            )
            for task in tasks
        ),
        width,
    )


_RECLAIMED_COLUMNS = (
    Column("ID"),
    Column("PREVIOUS STATUS"),
    Column("IDLE"),
    Column("REASON", shrinks=True),
)


def reclaimed_table(reclaimed: Sequence[Reclaimed], width: int | None = None) -> str:
    """``keel tasks reclaim``: each task failed, its previous status, idle time and why."""
    return table(
        _RECLAIMED_COLUMNS,
        (
            (
                item.task_id,
                (item.previous_status.value, _STATUS_COLOURS[item.previous_status]),
                f"{item.idle_seconds:.1f}s",
                item.reason,
            )
            for item in reclaimed
        ),
        width,
    )


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
    if task.claimed_at is not None:
        lines.append(f"last claimed    {format_time(task.claimed_at)}")
    traceparent = (task.trace_context or {}).get("traceparent")
    lines.append(f"trace           {traceparent or '-'}")
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
