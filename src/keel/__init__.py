"""Keel: durable long-running tasks for MCP servers.

The store never loses a task: tasks, what they wait for, and their outcomes are committed
to SQLite (by default) or PostgreSQL before anyone is told about them.
"""

import typing as _typing

from keel import errors as _errors  # pure and light: imported at once

if _typing.TYPE_CHECKING:
    from keel.errors import (
        ArgumentsRejected,
        ConfigurationError,
        IdempotencyConflict,
        ImportFailed,
        InputDeclined,
        InputRejected,
        InvalidPayload,
        InvalidTransition,
        KeelError,
        LeaseLost,
        NotAStore,
        PayloadTooLarge,
        StoreCorrupt,
        StoreDamaged,
        StoreError,
        StoreUnavailable,
        TaskAlreadyTerminal,
        TaskFailed,
        TaskNotFound,
        ToolError,
        UnknownInputKey,
        UnstorableText,
        WalLost,
    )
    from keel.model import Event, InputRequest, Reclaimed, Status, Task
    from keel.store import Store, open_store
    from keel.store.facade import TaskSnapshot, TaskStore

    __version__: str
    """The installed distribution's version (``keel-tasks``), read on first use."""


__all__ = [
    "ArgumentsRejected",
    "ConfigurationError",
    "Event",
    "IdempotencyConflict",
    "ImportFailed",
    "InputDeclined",
    "InputRejected",
    "InputRequest",
    "InvalidPayload",
    "InvalidTransition",
    "KeelError",
    "LeaseLost",
    "NotAStore",
    "PayloadTooLarge",
    "Reclaimed",
    "Status",
    "Store",
    "StoreCorrupt",
    "StoreDamaged",
    "StoreError",
    "StoreUnavailable",
    "Task",
    "TaskAlreadyTerminal",
    "TaskFailed",
    "TaskNotFound",
    "TaskSnapshot",
    "TaskStore",
    "ToolError",
    "UnknownInputKey",
    "UnstorableText",
    "WalLost",
    "open_store",
]


# Names load on first use (PEP 562), so that `keel --help` and every short CLI command do
# not pay for importing the whole library.
_HOMES = {
    **dict.fromkeys(_errors.__all__, "keel.errors"),
    "TaskSnapshot": "keel.store.facade",
    "TaskStore": "keel.store.facade",
    **dict.fromkeys(["Event", "InputRequest", "Reclaimed", "Status", "Task"], "keel.model"),
    "Store": "keel.store",
    "open_store": "keel.store",
}


def __getattr__(name: str) -> _typing.Any:
    if name == "__version__":
        from keel.mcp.version import keel_version  # one place: also --version, serverInfo

        globals()[name] = keel_version()
        return globals()[name]
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'keel' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
