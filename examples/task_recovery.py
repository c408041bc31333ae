"""The seed's example 07: a task waiting for input survives a restart.

Two ``TaskStore`` instances on one file stand for two processes: the second knows nothing
the first held in memory, yet finds the task, still ``input_required``, with its schema.

    $ uv run python examples/task_recovery.py
    restored: <id> input_required
    input: working
    completed: completed
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from keel import TaskStore


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tasks.db"
        with TaskStore(path) as first:
            task = first.create(
                {"type": "object", "required": ["service"]}, idempotency_key="incident-1"
            )
            with TaskStore(path) as second:  # a new process that "forgot" the first
                restored = second.get(task.task_id)
                print(f"restored: {restored.task_id} {restored.status}")
                answered = second.provide_input(task.task_id, {"service": "payments"})
                print(f"input: {answered.status}")
                completed = second.complete(task.task_id, {"summary": "no active incident"})
                print(f"completed: {completed.status}")


if __name__ == "__main__":
    main()
