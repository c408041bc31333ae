"""Crash helper: a writer that runs real task lifecycles until it is killed.

Usage: ``python _crash_writer.py DB ACK_FILE RUN SEED``

Says ``loaded`` once its imports are done and waits for ``go`` on stdin (so the parent can
start it while it still checks the store), then opens the store on DB through the
seed-compatible facade (``synchronous=FULL``) and loops: create a task with an input
schema and the idempotency key ``r<RUN>-<n>`` (sometimes twice: a retry must return the
same task), then provide its input and complete it, or cancel or fail it on the way. The
choices come from ``random.Random(SEED)``, so a run's sequence of calls is reproducible.
It says ``ready`` on stdout once its first write is acknowledged: from then on it runs at
its steady pace (the first call also pays for lazy imports, such as the schema validator).

Around every store call it appends one JSON line to ACK_FILE:

* ``{"phase": "begin", ...}`` before the call (flushed: what was in flight when killed);
* ``{"phase": "ack", ...}`` only after the call returned, with the task id and resulting
  status, flushed *and fsynced*. An acked write was acknowledged by the store, so it must
  survive the kill.

It never stops on its own before ``MAX_SECONDS``: the parent kills it with SIGKILL.
Only keel and the standard library are imported.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any, TextIO

from keel import TaskStore

SCHEMA = {
    "type": "object",
    "required": ["service"],
    "properties": {"service": {"type": "string"}},
}
MAX_SECONDS = 30.0  # a writer the parent failed to kill gives up on its own


class Journal:
    """The ack file: intents flushed, acknowledgements flushed and fsynced."""

    def __init__(self, stream: TextIO) -> None:
        self._f = stream
        self._acked = False

    def begin(self, op: str, **fields: Any) -> None:
        self._write({"phase": "begin", "op": op, **fields}, durable=False)

    def ack(self, op: str, **fields: Any) -> None:
        self._write({"phase": "ack", "op": op, **fields}, durable=True)
        if not self._acked:
            self._acked = True
            print("ready", flush=True)

    def _write(self, record: dict[str, Any], *, durable: bool) -> None:
        self._f.write(json.dumps(record, sort_keys=True) + "\n")
        self._f.flush()
        if durable:
            os.fsync(self._f.fileno())


def lifecycle(store: TaskStore, log: Journal, rng: random.Random, key: str, n: int) -> None:
    log.begin("create", key=key)
    task = store.create(SCHEMA, idempotency_key=key)
    tid = task.task_id
    log.ack("create", key=key, task_id=tid, status=task.status.value)
    if rng.random() < 0.1:  # a client retrying its create: the same task comes back
        log.begin("create", key=key)
        again = store.create(SCHEMA, idempotency_key=key)
        log.ack("create", key=key, task_id=again.task_id, status=again.status.value)

    for stage in ("input_required", "working"):
        roll = rng.random()
        if roll < 0.12:
            log.begin("cancel", key=key, task_id=tid)
            task = store.cancel(tid, reason=f"run {key} gave up while {stage}")
            log.ack("cancel", key=key, task_id=tid, status=task.status.value)
            return
        if roll < 0.18:
            message = f"{key} broke while {stage}"
            log.begin("fail", key=key, task_id=tid, message=message)
            task = store.fail(tid, message)
            log.ack("fail", key=key, task_id=tid, status=task.status.value, message=message)
            return
        if stage == "input_required":
            value = {"service": f"svc-{n}"}
            log.begin("provide_input", key=key, task_id=tid, value=value)
            task = store.provide_input(tid, value)
            log.ack("provide_input", key=key, task_id=tid, status=task.status.value, value=value)

    result = {"summary": f"root cause of {key}", "n": n}
    log.begin("complete", key=key, task_id=tid, result=result)
    task = store.complete(tid, result)
    log.ack("complete", key=key, task_id=tid, status=task.status.value, result=result)


def main(db: str, ack_path: str, run: int, seed: int) -> None:
    print("loaded", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("expected 'go' on stdin")
    rng = random.Random(seed)
    deadline = time.monotonic() + MAX_SECONDS
    with open(ack_path, "a", encoding="utf-8") as stream, TaskStore(db) as store:
        log = Journal(stream)
        n = 0
        while time.monotonic() < deadline:
            lifecycle(store, log, rng, f"r{run}-{n}", n)
            n += 1
    raise SystemExit(f"writer run {run} was not killed within {MAX_SECONDS}s")


if __name__ == "__main__":
    db, ack_path, run, seed = sys.argv[1:]
    main(db, ack_path, int(run), int(seed))
