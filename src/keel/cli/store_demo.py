"""``keel demo --store-only``: the seed's incident, played at the store level, one moment
per line (no server, no MCP: the task store alone).

A root-cause diagnosis asks which service is affected and waits (``input_required``); a
routine deploy restarts the process; the task is found again with what it asked for; the
answer is validated; the task completes with a cited conclusion. Then the failure
injections 8A-8E of the seed, each answered the production way.

It runs in the store every other command uses (default ``keel-data/keel.db``), so that
``keel tasks show <id>`` afterwards shows the task and its history. Each run uses a fresh
idempotency key, so it can run again and again; its task has a TTL of a day, after which
``keel tasks purge`` removes it.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable

from keel.errors import (
    ConfigurationError,
    InvalidTransition,
    KeelError,
    StoreError,
    TaskNotFound,
)
from keel.model import JsonObject
from keel.store import DEFAULT_LOCATION, Location
from keel.store.facade import TaskSnapshot, TaskStore

__all__ = ["CONCLUSION", "DEMO_TTL", "INCIDENT", "SERVICE_SCHEMA", "run_demo"]

INCIDENT = "INC-2026-0142"
DEMO_TTL = 24 * 3600.0  # seconds the demo's task is kept before `keel tasks purge` may delete it
QUESTION = "Which service is affected?"
SERVICE_SCHEMA: JsonObject = {
    "type": "object",
    "properties": {"service": {"type": "string", "minLength": 1}},
    "required": ["service"],
}
CONCLUSION: JsonObject = {
    "summary": (
        "payments: error rate rose from 0.2% to 14% within two minutes of deploy d-8812, "
        "which lowered the card-gateway client timeout from 2s to 200ms"
    ),
    "citations": [
        {"source": "deploys", "ref": "d-8812 payments 09:41 UTC"},
        {"source": "traces", "ref": "payments -> card-gateway p99 1.9s, timeouts after 09:41"},
        {"source": "incidents", "ref": f"{INCIDENT} opened 09:44 UTC"},
    ],
}

Echo = Callable[[str], object]


class _Demo:
    """The moments of the demo, in order; ``say`` prints one labelled moment."""

    def __init__(self, location: Location, echo: Echo) -> None:
        self.location = location
        self.target = location.url or str(location.path)
        self.echo = echo
        self.key = f"demo-{INCIDENT}-{secrets.token_hex(4)}"
        self.task_id = ""

    def say(self, label: str, *lines: str) -> None:
        self.echo(f"{label:<9} {lines[0]}")
        for line in lines[1:]:
            self.echo(f"{'':<9} {line}")

    def create(self, store: TaskStore) -> TaskSnapshot:
        return store.create(
            SERVICE_SCHEMA,
            idempotency_key=self.key,
            message=QUESTION,
            arguments={"tool": "diagnose_root_cause", "incident_id": INCIDENT},
            ttl=DEMO_TTL,
        )

    def ask(self) -> None:
        with TaskStore(self.target) as first:
            task = self.create(first)
        self.task_id = task.task_id
        self.say(
            "create",
            f"diagnose_root_cause for {INCIDENT} (idempotency key {self.key})",
            f"-> task {task.task_id} {task.status.value}, asking {QUESTION!r} "
            f"(schema requires: {', '.join(SERVICE_SCHEMA['required'])})",
        )
        self.say(
            "restart",
            "routine deploy: process restarted, in-memory state gone",
            f"(the store was closed; a new TaskStore opens {self.target})",
        )

    def recover(self, store: TaskStore) -> None:
        try:
            restored = store.get(self.task_id)
        except TaskNotFound as exc:
            self.say("recover", f"{exc} -- the incident itself: the task died with the process")
            raise ConfigurationError(
                "keel demo needs a store that survives a restart; memory:// does not "
                "(use a file, the default)"
            ) from exc
        asked = next(iter(restored.task.pending_input.values())).message
        self.say(
            "recover",
            f"found task {self.task_id} again: {restored.status.value}, still asking {asked!r}",
            f"schema kept with it: {json.dumps(restored.input_schema)}",
        )
        again = self.create(store)
        self.say(
            "8A retry",
            "the client resends its create with the same idempotency key",
            f"-> same task: {again.task_id == self.task_id} ({again.task_id}), "
            f"{again.status.value}; no second task",
        )

    def answer(self, store: TaskStore) -> None:
        refusal = _refusal(lambda: store.provide_input(self.task_id, {"svc": "payments"}))
        self.say(
            "answer",
            'user sends {"svc": "payments"}',
            f"-> refused: {refusal}",
            f"-> task still {store.get(self.task_id).status.value}; nothing changed",
        )
        answered = store.provide_input(self.task_id, {"service": "payments"})
        self.say(
            "answer",
            'user sends {"service": "payments"}',
            f"-> validated against the schema, accepted: {answered.status.value}",
        )
        refusal = _refusal(lambda: store.provide_input(self.task_id, {"service": "orders"}))
        self.say("8B", "a late second answer", f"-> refused: {refusal}")

    def complete(self, store: TaskStore) -> None:
        done = store.complete(self.task_id, CONCLUSION)
        self.say(
            "complete",
            f"diagnosis finished -> {done.status.value}: {CONCLUSION['summary']}",
            *(f"cites {c['source']}: {c['ref']}" for c in CONCLUSION["citations"]),
        )

    def injections(self, store: TaskStore) -> None:
        refusal = _refusal(lambda: store.complete(self.task_id, {"summary": "rewritten!"}))
        kept = store.get(self.task_id).result == CONCLUSION
        self.say(
            "8C",
            "a second complete with another conclusion",
            f"-> refused: {type(refusal).__name__}: {refusal}",
            f"-> real status: {_status_of(refusal)}; first conclusion kept: {kept}",
        )
        refusal = _refusal(lambda: store.cancel(self.task_id, reason="user gave up"))
        self.say(
            "8D",
            "cancel after completion: the same uniform answer",
            f"-> refused: {type(refusal).__name__}: {refusal}",
            f"-> real status: {_status_of(refusal)}",
        )
        refusal = _refusal(lambda: store.get("no-such-task"))
        self.say("8E", "an unknown handle", f"-> {type(refusal).__name__}: {refusal}")


def _refusal(write: Callable[[], object]) -> KeelError:
    """The error ``write`` is refused with; the demo shows refusals, so success is a bug."""
    try:
        write()
    except KeelError as exc:
        return exc
    raise StoreError("keel demo: the store accepted a write it must refuse; this is a bug")


def _status_of(error: KeelError) -> str:
    return error.status if isinstance(error, InvalidTransition) else "?"


def run_demo(location: Location, echo: Echo) -> str:
    """Play the incident against the store at ``location``; return the demo task's id.

    Raises:
        ConfigurationError: ``memory://``, which cannot survive the restart (that was the
            incident); reported after showing the task vanish.
        KeelError: anything else the store refuses unexpectedly.
    """
    started = time.perf_counter()
    demo = _Demo(location, echo)
    echo(f"keel demo: the seed's incident, in {location.describe()}")
    if location.kind == "memory":
        echo("(memory:// keeps nothing across a restart: expect the incident itself)")
    echo("")
    demo.ask()
    with TaskStore(demo.target) as second:
        demo.recover(second)
        demo.answer(second)
        demo.complete(second)
        demo.injections(second)
    store_arg = "" if demo.target == DEFAULT_LOCATION else f" --store '{demo.target}'"
    echo("")
    echo(
        f"done in {time.perf_counter() - started:.2f}s; see the task and its history with: "
        f"keel tasks show {demo.task_id}{store_arg}"
    )
    return demo.task_id
