"""The pure core: the task value, its statuses and transitions, and Keel's errors.

Nothing here does I/O, so every rule can be tested without a database.
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
    UnknownInputKey,
)
from keel.model.machine import ALLOWED, DECLINED, INTERNAL_ERROR, Change, can_move
from keel.model.task import (
    DEFAULT_INPUT_KEY,
    TERMINAL,
    Event,
    InputRequest,
    JsonObject,
    JsonValue,
    Reclaimed,
    Status,
    Task,
)
from keel.model.validation import Limits

__all__ = [
    "ALLOWED",
    "DECLINED",
    "DEFAULT_INPUT_KEY",
    "INTERNAL_ERROR",
    "TERMINAL",
    "Change",
    "ConfigurationError",
    "Event",
    "IdempotencyConflict",
    "ImportFailed",
    "InputRejected",
    "InputRequest",
    "InvalidPayload",
    "InvalidTransition",
    "JsonObject",
    "JsonValue",
    "KeelError",
    "LeaseLost",
    "Limits",
    "PayloadTooLarge",
    "Reclaimed",
    "Status",
    "StoreError",
    "Task",
    "TaskAlreadyTerminal",
    "TaskNotFound",
    "UnknownInputKey",
    "can_move",
]
