"""Every error Keel raises, in one tree.

Callers catch these, never driver exceptions: adapters translate ``sqlite3`` (and later
``psycopg``) errors at their boundary, ``raise … from exc``.

::

    KeelError
    ├── TaskNotFound            unknown id (or another owner's task): never None, never empty
    ├── InvalidTransition       the write is not allowed from the task's current status
    │   └── TaskAlreadyTerminal the task is completed / failed / cancelled; carries the snapshot
    ├── LeaseLost               a fenced write from an attempt that no longer owns the task
    ├── IdempotencyConflict     same idempotency key, different request
    ├── InvalidPayload          not JSON, wrong shape, or an invalid JSON Schema
    │   ├── InputRejected       input that violates the schema it was requested with
    │   │   └── ArgumentsRejected  a new task's arguments, refused by its schema or handler
    │   ├── UnknownInputKey     answers keyed by no open input request (names those expected)
    │   ├── UnstorableText      a lone surrogate or NUL, which no store keeps (names the field)
    │   └── PayloadTooLarge     arguments, input, result or step value over the size limit
    ├── ImportFailed            a teaching-store JSON file that cannot be imported whole
    ├── ConfigurationError      a bad store location or option
    ├── StoreError              the storage itself failed (I/O, corruption, busy too long)
    │   ├── StoreUnavailable    unreachable, locked, out of disk or read-only for now:
    │   │                       names the store and the cause; retry after ``retry_after``
    │   ├── NotAStore           an existing file that is empty or not a SQLite database
    │   └── StoreDamaged        a store whose integrity check (or quick check) fails
    │       └── StoreCorrupt    a damaged page met while serving (SQLite's SQLITE_CORRUPT)
    │
    │   handlers and the runtime (``keel.runtime`` re-exports these three):
    ├── ToolError               raised by a handler: its task completes with ``isError: true``
    ├── TaskFailed              raised by a handler: its task fails at once, no retry
    └── InputDeclined           the user declined an input request (a handler may catch it)

Every error leaves the store exactly as it was before the call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from keel.model.task import Task

__all__ = [
    "ArgumentsRejected",
    "ConfigurationError",
    "IdempotencyConflict",
    "ImportFailed",
    "InputDeclined",
    "InputRejected",
    "InvalidPayload",
    "InvalidTransition",
    "KeelError",
    "LeaseLost",
    "NotAStore",
    "PayloadTooLarge",
    "StoreCorrupt",
    "StoreDamaged",
    "StoreError",
    "StoreUnavailable",
    "TaskAlreadyTerminal",
    "TaskFailed",
    "TaskNotFound",
    "ToolError",
    "UnknownInputKey",
    "UnstorableText",
    "WalLost",
]

INTERNAL_ERROR = -32603
"""JSON-RPC "internal error": crashes, dead letters, deadlines and reclaims are stored with it."""


class KeelError(Exception):
    """Base class of every error Keel raises on purpose."""


class TaskNotFound(KeelError, LookupError):
    """No task has this id (or it belongs to another owner, which must look the same)."""

    def __init__(self, task_id: str) -> None:
        # An id that is not printable text (NUL, a lone surrogate) is shown escaped, so
        # that the message itself can be printed and sent.
        shown = task_id if task_id.isprintable() else ascii(task_id)
        super().__init__(f"unknown task: {shown}")
        self.task_id = task_id


class InvalidTransition(KeelError):
    """The requested write is not allowed from the task's current status.

    Attributes:
        task: the task as it is now (unchanged by the refused write).
    """

    def __init__(self, message: str, task: Task) -> None:
        super().__init__(message)
        self.task = task

    @property
    def status(self) -> str:
        """The task's current status, as its wire value."""
        return self.task.status.value


class TaskAlreadyTerminal(InvalidTransition):
    """The task already ended; terminal states are absorbing.

    Every write to a terminal task (complete, fail, cancel, input, heartbeat …) gets this
    same answer, except an exact repeat of the write that ended it, which returns the
    stored snapshot. ``task`` is that snapshot: read the real outcome from it.
    """

    def __init__(self, task: Task, attempted: str) -> None:
        super().__init__(
            f"task {task.task_id} is already {task.status.value}; cannot {attempted}", task
        )
        self.attempted = attempted


class LeaseLost(KeelError):
    """A fenced write came from an attempt that no longer owns the task.

    Another claim bumped the fencing token, or the lease was released or recovered. The
    write was discarded; the attempt must stop.
    """

    def __init__(self, task_id: str, fence: int, current_fence: int, why: str) -> None:
        super().__init__(
            f"lease lost on task {task_id}: write with fence {fence} refused ({why}; "
            f"current fence {current_fence})"
        )
        self.task_id = task_id
        self.fence = fence
        self.current_fence = current_fence


class IdempotencyConflict(KeelError):
    """The idempotency key is already bound to a task created with a different request."""

    def __init__(self, key: str, task_id: str, difference: str) -> None:
        super().__init__(
            f"idempotency key {key!r} is already bound to task {task_id} created with "
            f"different {difference}"
        )
        self.key = key
        self.task_id = task_id


class InvalidPayload(KeelError, ValueError):
    """A value is not storable: not JSON, the wrong shape, or an invalid JSON Schema."""


class InputRejected(InvalidPayload):
    """Input that does not satisfy the JSON Schema it was requested with.

    Attributes:
        key: the input request the value was for.
        path: where in the value the first violation is (``"service"``, ``"a/0"``), or ``""``.
    """

    def __init__(self, task_id: str, key: str, path: str, reason: str) -> None:
        where = f" at {path!r}" if path else ""
        super().__init__(f"input {key!r} for task {task_id} rejected{where}: {reason}")
        self.task_id = task_id
        self.key = key
        self.path = path
        self.reason = reason


class UnknownInputKey(InvalidPayload):
    """Answers to a waiting task keyed by none of its open input requests: a mistyped or
    already answered key, or the answer itself given instead of ``{key: answer}``. Nothing
    is accepted (an answer that would be silently ignored is refused instead).

    Attributes:
        keys: the keys the answers were given under.
        expected: the keys of the requests still open.
    """

    def __init__(
        self,
        task_id: str,
        keys: Sequence[str],
        expected: Sequence[str],
        answered: Sequence[str] = (),
    ) -> None:
        given = ", ".join(map(repr, keys))
        if not keys:
            what = f"no answer given for task {task_id}"
        elif set(keys) <= set(answered):
            what = f"input {given} of task {task_id} was already answered"
        else:
            what = f"task {task_id} has no input request {given}"
        pending = ", ".join(map(repr, expected))
        super().__init__(f"{what}; pending: {pending} (answers are keyed by input request)")
        self.task_id = task_id
        self.keys = list(keys)
        self.expected = list(expected)


class ArgumentsRejected(InputRejected):
    """Tool arguments refused before any task exists: they violate the task's input schema,
    name an argument its handler does not take, or leave out one it needs. (The input
    ``"arguments"`` of a task not yet created: an InputRejected, as it always was.)

    Attributes:
        field: where, from ``arguments`` (``"arguments.incident_id"``, ``"arguments.a[0]"``).
        path: the same inside the arguments, as InputRejected has it (``"a/0"``).
    """

    def __init__(self, field: str, path: str, reason: str) -> None:
        InvalidPayload.__init__(self, f"{field}: {reason}")
        self.task_id = "(new task)"
        self.key = "arguments"
        self.field = field
        self.path = path
        self.reason = reason


class UnstorableText(InvalidPayload):
    """Text that no store keeps: a lone surrogate (not Unicode text, it has no UTF-8
    form) or NUL (PostgreSQL's text cannot hold it; refused on every store alike).

    Attributes:
        field: where (``"arguments.note"``, ``"input.service.name"``, ``"idempotency key"``).
        reason: which character, and where in the string.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class PayloadTooLarge(InvalidPayload):
    """A payload exceeds its configured size limit (sizes are of its JSON encoding)."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(f"{what} is {size} bytes as JSON; the limit is {limit} bytes")
        self.what = what
        self.size = size
        self.limit = limit


class ImportFailed(KeelError):
    """A file could not be imported; nothing from it was stored."""

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        shown = "; ".join(problems[:3])
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        super().__init__(f"cannot import {source}: {shown}{more}")
        self.source = source
        self.problems = list(problems)


class ConfigurationError(KeelError, ValueError):
    """A store location or option that Keel cannot use."""


class StoreError(KeelError):
    """The storage failed underneath Keel: I/O error, corruption, lock held too long."""


class StoreUnavailable(StoreError):
    """The store cannot serve the call now, for a reason outside the call: the server is
    down or unreachable, another process held the lock past the store timeout, the disk
    is full, the file or server is read-only. Nothing was written by the call (except
    where the message says it may have been). Another try later may succeed.

    Attributes:
        store: where the store is, for people (never a password).
        cause: what is wrong, in a few words (``connection refused``, ``the disk is full``).
        retry_after: seconds a client should wait before it tries again (a hint).
    """

    def __init__(self, store: str, cause: str, *, retry_after: float = 1.0) -> None:
        super().__init__(f"store {store} is unavailable: {cause}")
        self.store = store
        self.cause = cause
        self.retry_after = retry_after


class WalLost(StoreError):
    """A SQLite store whose write-ahead log is gone after a crash: a process that had it
    open did not close it (killed, or the machine stopped), and ``keel.db-wal``, which
    held its latest commits, is no longer beside ``keel.db`` (deleted, or the file was
    copied alone). Opening it anyway would silently roll back acknowledged writes, so it
    is refused until the log is put back, or the loss is accepted (``?lost_wal=accept``).

    Or (``running``) the log is missing while a process that has the store open still
    runs: the log was deleted under it (it still holds the log, its open file, and
    writes to it; a clean stop of it folds the log into ``keel.db``, and another opener
    meanwhile would see a store without those writes and write a log of its own beside
    it), or ``keel.db`` was copied alone while it ran.

    Attributes:
        path: the database file.
        holders: who had it open and did not close it (``"pid 4711 on host-a since …"``).
        running: the holders still run (the log was deleted under them).
    """

    def __init__(self, path: str, holders: list[str], *, running: bool = False) -> None:
        who = "; ".join(holders)
        super().__init__(
            f"store {path}: its write-ahead log {path}-wal is missing while {who}, which "
            f"has the store open, still runs: opening it now would show {path} without the "
            f"writes in that log. If the log was deleted under that process (which still "
            f"writes to it), stop that process cleanly (SIGTERM: closing the store folds "
            f"the log into {path}), then retry; if {path} is a copy made without its log, "
            f"copy it with keel backup instead; or open it with the store URL option "
            f"?lost_wal=accept to go on with what {path} holds"
            if running
            else f"store {path} was not closed cleanly ({who} did not close it) "
            f"and its write-ahead log {path}-wal is missing: the writes it held are not in "
            f"{path}. Put {path}-wal back beside it (as it was, with {path}-shm if you have "
            f"it) and retry, restore a backup (keel backup), or open it with the store URL "
            f"option ?lost_wal=accept to go on with what {path} holds"
        )
        self.path = path
        self.holders = holders
        self.running = running


class NotAStore(StoreError):
    """An existing store file that Keel will not open: empty (zero bytes) or not a SQLite
    database. It is never taken for a new, empty store (that would hide the tasks it was
    meant to hold); a missing file is.

    Attributes:
        path: the file.
        reason: what is wrong with it (``"is empty (0 bytes)"``).
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(
            f"store {path} {reason}, not a Keel store: check --store (or $KEEL_STORE), "
            "restore the file from a backup (keel backup), or move it away to start a new store"
        )
        self.path = path
        self.reason = reason


class StoreDamaged(StoreError):
    """A store whose integrity check (``keel check``) or quick check (``keel serve``,
    ``keel worker``) fails: serving from it could lose or corrupt tasks.

    Attributes:
        path: the store.
        problems: what the check reported (SQLite's own words), first problems first.
    """

    def __init__(self, path: str, check: str, problems: Sequence[str]) -> None:
        shown = "; ".join(problems[:3])
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        full = "; keel check gives the full report" if check == "quick check" else ""
        super().__init__(
            f"store {path} failed its {check}: {shown}{more}; restore it from a backup "
            f"(one made by keel backup){full}"
        )
        self.path = path
        self.problems = list(problems)


class StoreCorrupt(StoreDamaged):
    """A damaged page (or file header) met while serving, after the store was opened: the
    call failed and nothing was written; the store must be restored before it can serve
    again. Over MCP it is ``-32051``, never a bare ``-32603``.

    Attributes:
        path: the store.
        problems: what the store's engine said (one entry).
    """

    def __init__(self, path: str, message: str, detail: str) -> None:
        StoreError.__init__(self, message)
        self.path = path
        self.problems = [detail]


class ToolError(KeelError):
    """Raise from a handler to end its task ``completed`` with ``isError: true``: a domain
    error the model should see, as MCP asks (not a failure of the task machinery).

    Attributes:
        message: the text the result carries.
        structured: its structured content, kept for a tool without an ``outputSchema``.
    """

    def __init__(self, message: str, *, structured: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.structured = structured


class TaskFailed(KeelError):
    """Raise from a handler to end its task ``failed`` with a JSON-RPC error, no retry.

    Attributes:
        error: ``{code, message, data?}``, as the task stores it.
    """

    def __init__(self, message: str, *, code: int = INTERNAL_ERROR, data: Any = None) -> None:
        super().__init__(message)
        self.error: dict[str, Any] = {"code": code, "message": message}
        if data is not None:
            self.error["data"] = data


class InputDeclined(KeelError):
    """The user declined (or cancelled) an input request; a handler may catch it.

    Uncaught, it ends the task ``completed`` with ``isError: true`` (asking again on a
    retry would get the same answer).
    """

    def __init__(self, key: str, action: str) -> None:
        done = {"decline": "declined", "cancel": "cancelled"}.get(action, action)
        super().__init__(f"input request {key!r} was {done} by the user")
        self.key = key
        self.action = action
