"""Keel: durable long-running tasks for MCP servers.

The store never loses a task: tasks, what they wait for, and their outcomes are committed
to SQLite (by default) or PostgreSQL before anyone is told about them.
"""

from keel.errors import (
    ConfigurationError,
    IdempotencyConflict,
    ImportFailed,
    InputRejected,
    InvalidPayload,
    InvalidTransition,
    KeelError,
    LeaseLost,
    PayloadTooLarge,
    StoreError,
    TaskAlreadyTerminal,
    TaskNotFound,
)
from keel.facade import TaskSnapshot, TaskStore
from keel.model import Event, InputRequest, Reclaimed, Status, Task
from keel.store import Store, open_store

__version__ = "0.1.0"

__all__ = [
    "ConfigurationError",
    "Event",
    "IdempotencyConflict",
    "ImportFailed",
    "InputRejected",
    "InputRequest",
    "InvalidPayload",
    "InvalidTransition",
    "KeelError",
    "LeaseLost",
    "PayloadTooLarge",
    "Reclaimed",
    "Status",
    "Store",
    "StoreError",
    "Task",
    "TaskAlreadyTerminal",
    "TaskNotFound",
    "TaskSnapshot",
    "TaskStore",
    "open_store",
]
