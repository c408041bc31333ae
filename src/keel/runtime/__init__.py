"""The worker runtime: register handlers on a :class:`Keel`, run them with a :class:`Worker`.

Handlers are ``async def handler(ctx: TaskContext, **arguments)``; the context gives them
checkpointed steps, input that parks the task without holding a worker, status messages,
and cancellation at their next await.
"""

from keel.runtime.app import Keel, TaskDefinition, TaskOptions, load_app
from keel.runtime.context import TaskContext
from keel.runtime.outcomes import InputDeclined, ResultShape, TaskFailed, ToolError, ToolResult
from keel.runtime.worker import Worker

__all__ = [
    "InputDeclined",
    "Keel",
    "ResultShape",
    "TaskContext",
    "TaskDefinition",
    "TaskFailed",
    "TaskOptions",
    "ToolError",
    "ToolResult",
    "Worker",
    "load_app",
]
