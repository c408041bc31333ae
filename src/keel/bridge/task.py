"""``diagnose_root_cause``: the diagnosis as a durable Keel task.

Each phase of :mod:`keel.bridge.diagnosis` is a checkpointed step (``ctx.step``): after a
crash or a restart the handler runs again, and every phase already recorded returns its
stored result without being computed again. The pace (``BridgeSettings.pace``) is spent
*after* a phase that was actually computed in this attempt, outside the step, as an
``anyio.sleep``: a replay skips it, a cancel interrupts it, and the worker's lease keeps
being renewed meanwhile.

``task_mode="optional"``: a client that declares the MCP tasks extension gets a durable
handle; one that does not still gets the answer inline when it names the service (or the
incident does). If the diagnosis must ask which service is affected, only a client with
the extension can answer, and the other gets a clear error instead of a hang. Refusing
every such client (``required``) would lock out the common case for no gain.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.to_thread

from keel.bridge.core import Bridge, open_bridge
from keel.bridge.diagnosis import PHASES, PIPELINE, check_service, load_incident, render
from keel.bridge.errors import BridgeError
from keel.bridge.results import Diagnosis
from keel.bridge.settings import BridgeSettings
from keel.runtime import Keel, TaskContext, ToolError, ToolResult
from keel.store import Store

__all__ = ["TASK_NAME", "build_app", "service_schema"]

TASK_NAME = "diagnose_root_cause"
SERVICE_KEY = "service"  # the input key of the question "which service?"


def service_schema(services: Sequence[str]) -> dict[str, Any]:
    """What the diagnosis asks for: one of the known services (an enum, so a wrong
    answer is refused by name and the question stays open)."""
    return {
        "type": "object",
        "properties": {
            SERVICE_KEY: {
                "type": "string",
                "title": "Affected service",
                "description": "The service where the symptoms show",
                "enum": list(services),
            }
        },
        "required": [SERVICE_KEY],
    }


def _timed(fn: Callable[..., Any], args: tuple[Any, ...], worker: str) -> dict[str, Any]:
    """Run a phase; record who computed it and how long it took beside its value."""
    began = time.perf_counter()
    value = fn(*args)
    return {"value": value, "worker": worker, "ms": round((time.perf_counter() - began) * 1e3, 3)}


def build_app(settings: BridgeSettings | None = None, store: str | Store | None = None) -> Keel:
    """A Keel app with the ``diagnose_root_cause`` task over the data of ``settings``.

    Args:
        settings: where the data is and the pace (default: from the environment).
        store: the task store (a location or a store; default ``$KEEL_STORE``, then
            ``keel-data/keel.db``).
    """
    settings = settings or BridgeSettings.from_env()
    pace = settings.pace_seconds
    app = Keel(store)
    total = len(PHASES)
    labels = dict(PHASES)
    numbers = {name: n for n, (name, _) in enumerate(PHASES, 1)}

    async def phase(ctx: TaskContext, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        await ctx.progress(numbers[name], total, labels[name])
        recorded = await ctx.step(name, _timed, fn, args, ctx.worker)
        if name in ctx.step_calls and pace > 0:
            await anyio.sleep(pace)  # the slow sources this pace stands for
        return recorded["value"]

    @app.task(
        TASK_NAME,
        task_mode="optional",
        max_attempts=5,
        lease_seconds=settings.lease_seconds,
        poll_interval=0.5 if pace < 10 else 5.0,
        description=(
            "Diagnose the root cause of an incident from the incident database, the traces "
            "and the deploy records; the conclusion cites incident, trace/span and deploy ids. "
            "Asks which service is affected when neither the incident nor the call names one."
        ),
    )
    async def diagnose_root_cause(
        ctx: TaskContext, incident_id: str, service: str | None = None
    ) -> ToolResult[Diagnosis]:
        try:
            bridge: Bridge = await anyio.to_thread.run_sync(open_bridge, settings)
            loaded = await phase(ctx, "load-incident", load_incident, bridge, incident_id)
        except BridgeError as exc:
            raise ToolError(str(exc), structured={"error": str(exc)}) from exc
        incident, services = loaded["incident"], loaded["services"]
        chosen = service or incident.get("service")
        if chosen:
            try:
                check_service(chosen, services)
            except BridgeError as exc:
                raise ToolError(str(exc), structured={"error": str(exc)}) from exc
        else:
            answer = await ctx.elicit(
                f"Incident {incident['id']} ({incident['title']}) names no affected service. "
                "Which service shows the symptoms?",
                service_schema(services),
                key=SERVICE_KEY,
            )
            chosen = str(answer[SERVICE_KEY])
        values: dict[str, Any] = {
            "bridge": bridge,
            "incident": incident,
            "service": chosen,
            "services": services,
        }
        try:
            for step in PIPELINE:
                args = [values[n] for n in step.needs]
                values[step.name] = await phase(ctx, step.name, step.fn, *args)
        except BridgeError as exc:
            raise ToolError(str(exc), structured={"error": str(exc)}) from exc
        result = values[PIPELINE[-1].name]
        await ctx.status(f"done: {result['conclusion']}")
        return ToolResult(render(result), structured=result)

    del diagnose_root_cause  # registered on the app
    return app
