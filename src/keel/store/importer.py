"""Import the seed's teaching store: one JSON file, all of it or nothing.

The teaching ``TaskStore`` rewrote one file after every operation::

    {"<task_id>": {"task_id": "…", "status": "input_required",
                   "input_schema": {…} | null, "input_value": … | null,
                   "result": … | null, "idempotency_key": "…" | null,
                   "updated_at": 1764534729.5 | "2026-11-30T20:32:09" (optional)}}

The whole file is read and checked first; only if every task in it is sound are they
handed to :meth:`keel.store.Store.import_tasks`, which inserts them in one transaction
(and refuses if an id or idempotency key is already taken). Any problem raises
:class:`~keel.errors.ImportFailed` naming the file and every problem found, and the store
is left as it was. That matters most for the file the teaching store's non-atomic rewrite
left truncated by a crash: it must be refused loudly, never half imported.

How teaching fields map onto a Keel task:

* ``input_schema`` -> the input request under :data:`~keel.model.DEFAULT_INPUT_KEY`, with
  the schema's ``description`` (or the required fields) as its message, as the facade does;
* ``input_value`` -> the answer to that request, verbatim (the teaching store did not
  validate it, and rewriting history would be a loss);
* ``result``, ``idempotency_key``, ``status`` -> the same fields, verbatim;
* a ``failed`` teaching task recorded no error, but Keel stores failures as JSON-RPC
  errors: it gets :data:`FAILED_BEFORE_IMPORT`, and its status message says so;
* times: ``updated_at`` (epoch seconds, or ISO 8601 where a naive time is local time, as
  ``datetime.now().isoformat()`` wrote it) and ``created_at`` if the file has them,
  between 1970 and the end of year 9999 (:data:`LATEST_TIME`).
  The teaching store recorded no creation time: ``created_at`` is then ``updated_at``, or
  for a task with neither the import time, spaced a microsecond apart in file order, so
  that listings keep the order in which the teaching store created the tasks.

Values no store keeps are refused, naming the task and the field (and where in it): a
lone surrogate or a NUL in any text (the model's check, as for every write), JSON nested
deeper than :data:`~keel.model.validation.MAX_DEPTH` (the bound of every stored value).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from keel.errors import ImportFailed, InvalidPayload
from keel.model import (
    DEFAULT_INPUT_KEY,
    INTERNAL_ERROR,
    InputRequest,
    JsonObject,
    JsonValue,
    Limits,
    Status,
    Task,
)
from keel.model.validation import (
    check_depth,
    check_key,
    check_schema,
    describe_schema,
    loads_bounded,
    normalize,
)
from keel.store import Store

__all__ = [
    "FAILED_BEFORE_IMPORT",
    "LATEST_TIME",
    "TEACHING_FIELDS",
    "ImportReport",
    "import_file",
    "parse_teaching_store",
    "read_teaching_file",
]

TEACHING_FIELDS = (
    "task_id",
    "status",
    "input_schema",
    "input_value",
    "result",
    "idempotency_key",
)
"""The fields of the seed's ``TaskSnapshot``; ``updated_at``/``created_at`` may follow."""

_TIME_FIELDS = ("updated_at", "created_at")

FAILED_BEFORE_IMPORT: JsonObject = {
    "code": INTERNAL_ERROR,
    "message": "failed before import into Keel; the teaching store recorded no error",
}
"""The error a ``failed`` teaching task is stored with: it had none of its own."""

_FAILED_NOTE = "failed before import (the teaching store recorded no error; one was synthesized)"

_STATUS_VALUES = frozenset(s.value for s in Status)
_STATUSES = ", ".join(repr(s.value) for s in Status)

_SPACING = 1e-6  # seconds between import times of tasks without timestamps, in file order

LATEST_TIME = 253_402_300_800.0  # seconds since the epoch: 10000-01-01T00:00:00Z
"""Times from this on are refused: no calendar the CLI prints (nor PostgreSQL) reaches it."""


@dataclass(frozen=True, slots=True)
class ImportReport:
    """What an import did (or, from :func:`read_teaching_file`, would do)."""

    source: str
    tasks: Sequence[Task]
    notes: Sequence[str] = field(default_factory=tuple)
    """Things a reader should know, one line each (synthesized errors, assumed times)."""

    def counts(self) -> dict[Status, int]:
        """How many tasks per status, in status order, statuses with none left out."""
        found = {s: sum(1 for t in self.tasks if t.status is s) for s in Status}
        return {s: n for s, n in found.items() if n}


def read_teaching_file(
    path: str | os.PathLike[str],
    *,
    now: float | None = None,
    limits: Limits | None = None,
) -> ImportReport:
    """Read and check a whole teaching-store file; store nothing.

    Raises:
        ImportFailed: the file cannot be read, is not complete JSON, or any task in it is
            not sound; the message names the file and the problems.
    """
    source = os.fspath(path)
    try:
        raw = Path(source).read_bytes()
    except OSError as exc:
        raise ImportFailed(source, [f"cannot read the file: {exc.strerror or exc}"]) from exc
    except ValueError as exc:  # a NUL, or a surrogate that names no byte
        raise ImportFailed(source, [f"not a file name: {exc}"]) from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ImportFailed(
            source, [f"not UTF-8 text: byte {exc.start} cannot be decoded ({exc.reason})"]
        ) from exc
    return parse_teaching_store(text, source, now=now, limits=limits)


def parse_teaching_store(
    text: str,
    source: str = "<text>",
    *,
    now: float | None = None,
    limits: Limits | None = None,
) -> ImportReport:
    """Check a teaching store's JSON text and turn it into Keel tasks.

    Args:
        source: how to name the input in error messages.
        now: the import time (seconds since the epoch) for tasks without timestamps.

    Raises:
        ImportFailed: see :func:`read_teaching_file`.
    """
    limits = limits or Limits()
    now = time.time() if now is None else now
    if not text.strip():
        raise ImportFailed(
            source, ["the file is empty (a crash during a whole-file rewrite leaves this)"]
        )
    duplicates: list[str] = []
    try:
        data = loads_bounded(
            text,
            "the file",
            object_pairs_hook=lambda pairs: _no_duplicates(pairs, duplicates),
            parse_constant=_refuse_constant,
        )
    except json.JSONDecodeError as exc:
        raise ImportFailed(
            source, [f"line {exc.lineno} column {exc.colno}: {exc.msg} (truncated or not JSON)"]
        ) from exc
    except ValueError as exc:  # NaN, Infinity (Python takes them, JSON does not), depth
        raise ImportFailed(source, [str(exc)]) from exc
    if duplicates:
        raise ImportFailed(source, duplicates)
    if not isinstance(data, dict):
        raise ImportFailed(
            source,
            [f"the file must hold one JSON object {{task_id: task}}, not {_kind(data)}"],
        )

    problems: list[str] = []
    notes: list[str] = []
    tasks: list[Task] = []
    keys: dict[str, str] = {}
    count = len(data)
    for index, (task_id, value) in enumerate(data.items()):
        if not isinstance(value, dict):
            problems.append(f"task {task_id!r}: must be a JSON object, not {_kind(value)}")
            continue
        reader = _TeachingTask(task_id, value, limits)
        task = reader.convert(fallback_time=now - (count - 1 - index) * _SPACING)
        problems.extend(reader.problems)
        notes.extend(reader.notes)
        if task is None:
            continue
        key = task.idempotency_key
        if key is not None:
            if key in keys:
                problems.append(
                    f"idempotency key {key!r} is used by both task {keys[key]!r} and task "
                    f"{task_id!r}; a key names one task"
                )
            else:
                keys[key] = task_id
        tasks.append(task)
    if problems:
        raise ImportFailed(source, problems)
    return ImportReport(source, tuple(tasks), tuple(notes))


async def import_file(
    store: Store,
    path: str | os.PathLike[str],
    *,
    now: float | None = None,
    actor: str = "import",
    limits: Limits | None = None,
) -> ImportReport:
    """Import a teaching-store file into ``store``: every task in it, or none.

    Args:
        limits: the size limits to check against; give the store's if it has others.

    Raises:
        ImportFailed: the file is not sound (see :func:`read_teaching_file`), or one of its
            task ids or idempotency keys is already in the store. Nothing was stored.
    """
    report = read_teaching_file(path, now=now, limits=limits)
    try:
        reasons = {
            t.task_id: f"imported; {_FAILED_NOTE}"
            for t in report.tasks
            if t.status is Status.FAILED and t.error == FAILED_BEFORE_IMPORT
        }
        await store.import_tasks(report.tasks, actor=actor, reasons=reasons)
    except ImportFailed as exc:
        # The store names itself as the source; the user needs to know which file it was.
        raise ImportFailed(report.source, exc.problems) from exc
    except InvalidPayload as exc:
        raise ImportFailed(report.source, [str(exc)]) from exc
    return report


# --- one task ----------------------------------------------------------------------------


class _TeachingTask:
    """Reads one teaching task, collecting every problem instead of stopping at the first."""

    def __init__(self, task_id: str, value: dict[str, Any], limits: Limits) -> None:
        self.task_id = task_id
        self.value = value
        self.limits = limits
        self.problems: list[str] = []
        self.notes: list[str] = []

    def problem(self, text: str) -> None:
        self.problems.append(f"task {self.task_id!r}: {text}")

    def convert(self, fallback_time: float) -> Task | None:
        """The Keel task, or None when :attr:`problems` says why it cannot be one."""
        self._check_fields()
        status = self._status()
        schema = self._schema()
        answer = self._json("input_value", self.limits.max_input_bytes)
        result = self._json("result", self.limits.max_result_bytes)
        key = self._idempotency_key()
        self._check_consistency(status, answer)
        created, updated = self._times(fallback_time)
        if self.problems or status is None:
            return None

        requests: dict[str, InputRequest] = {}
        responses: dict[str, JsonValue] = {}
        if schema is not None:
            requests[DEFAULT_INPUT_KEY] = InputRequest(describe_schema(schema), schema)
            if answer is not None:
                responses[DEFAULT_INPUT_KEY] = answer
        message: str | None = None
        error: JsonObject | None = None
        if status is Status.INPUT_REQUIRED:
            message = requests[DEFAULT_INPUT_KEY].message
        elif status is Status.FAILED:
            error = dict(FAILED_BEFORE_IMPORT)
            message = _FAILED_NOTE
            self.notes.append(f"task {self.task_id!r}: {_FAILED_NOTE}")
        return Task(
            task_id=self.task_id,
            status=status,
            owner="",
            name=None,
            arguments={},
            created_at=created,
            updated_at=updated,
            status_message=message,
            input_requests=requests,
            input_responses=responses,
            result=result,
            error=error,
            idempotency_key=key,
            ready_at=created,
        )

    def _check_fields(self) -> None:
        unknown = [k for k in self.value if k not in TEACHING_FIELDS and k not in _TIME_FIELDS]
        if unknown:
            self.problem(
                f"unknown field(s) {', '.join(map(repr, unknown))} (importing would lose them; "
                f"known: {', '.join(TEACHING_FIELDS + _TIME_FIELDS)})"
            )
        try:
            check_key(self.task_id, "the task id", self.limits)
        except InvalidPayload as exc:
            self.problem(str(exc))
        if "task_id" not in self.value:
            self.problem("has no task_id field")
        elif self.value["task_id"] != self.task_id:
            self.problem(
                f"its task_id field is {self.value['task_id']!r}; the file's key and it must match"
            )

    def _status(self) -> Status | None:
        raw = self.value.get("status")
        if raw is None:
            self.problem("has no status")
        elif not isinstance(raw, str) or raw not in _STATUS_VALUES:
            self.problem(f"status {raw!r} is not one of {_STATUSES}")
        else:
            return Status(raw)
        return None

    def _json(self, name: str, limit: int) -> JsonValue:
        """The field's value if Keel can store it (size), else None with a problem."""
        value = self.value.get(name)
        if value is None:
            return None
        try:
            check_depth(value, name)
            return normalize(value, name, limit)[1]
        except InvalidPayload as exc:
            self.problem(str(exc))
            return None

    def _schema(self) -> JsonObject | None:
        schema = self._json("input_schema", self.limits.max_input_bytes)
        if schema is None:
            return None
        if not isinstance(schema, dict):
            self.problem(f"input_schema must be a JSON object or null, not {_kind(schema)}")
            return None
        try:
            return check_schema(schema, "input_schema")
        except InvalidPayload as exc:
            self.problem(str(exc))
            return None

    def _idempotency_key(self) -> str | None:
        key = self.value.get("idempotency_key")
        if key is None:
            return None
        try:
            return check_key(key, "idempotency_key", self.limits)
        except InvalidPayload as exc:
            self.problem(str(exc))
            return None

    def _check_consistency(self, status: Status | None, answer: JsonValue) -> None:
        has_schema = self.value.get("input_schema") is not None
        if answer is not None and not has_schema:
            self.problem("has an input_value but no input_schema: there is no request it answers")
        if status is Status.INPUT_REQUIRED:
            if not has_schema:
                self.problem("is input_required but has no input_schema: nothing says what to ask")
            elif answer is not None:
                self.problem("is input_required but its input_value is already set")

    def _times(self, fallback: float) -> tuple[float, float]:
        updated = self._time("updated_at")
        created = self._time("created_at")
        if updated is None:
            updated = fallback if created is None else created
        if created is None:
            created = updated
        if created > updated:
            self.problem("created_at is later than updated_at")
        return created, updated

    def _time(self, name: str) -> float | None:
        raw = self.value.get(name)
        if raw is None:
            return None
        if isinstance(raw, bool) or not isinstance(raw, int | float | str):
            self.problem(f"{name} must be epoch seconds or an ISO 8601 time, not {_kind(raw)}")
            return None
        if isinstance(raw, str):
            try:
                # A naive time is local time: that is what datetime.now().isoformat() wrote.
                seconds = datetime.fromisoformat(raw).timestamp()
            except (ValueError, OverflowError, OSError):  # OverflowError: year 1 or 9999
                self.problem(f"{name} {raw!r} is not an ISO 8601 time from 1970 to 9999")
                return None
        elif isinstance(raw, int) and abs(raw) > LATEST_TIME:
            seconds = math.inf  # float() of a 400-digit integer would overflow
        else:
            seconds = float(raw)
        if not (math.isfinite(seconds) and 0 <= seconds < LATEST_TIME):
            self.problem(f"{name} {_short(raw)} is not a time from 1970 to 9999")
            return None
        return seconds


def _no_duplicates(pairs: list[tuple[str, Any]], found: list[str]) -> dict[str, Any]:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            found.append(f"key {key!r} appears twice in one JSON object (one would be lost)")
        seen.add(key)
    return dict(pairs)


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _short(value: object, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def _kind(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return "a number"
    return names.get(type(value), type(value).__name__)
