"""Incident Bridge: an MCP server for incident response whose long-running task
diagnoses the root cause of an incident, with citations.

The interface ``keel serve`` (and any embedding server) uses:

``BridgeSettings(data_dir, incidents=None, traces=None, deploys=None, pace="demo")``
    Frozen settings; ``data_dir`` defaults to ``keel-data/bridge``. ``incidents``: a JSON
    file; ``traces``: OTLP/JSON files or folders of them; ``deploys``: JSON or CSV.
    Unset sources default to files in ``data_dir``.
    ``pace``: ``"fast"`` (no artificial latency), ``"demo"`` (default, ~8 s a diagnosis),
    ``"realistic"`` (~20 minutes), or a number of seconds per phase.
    ``ingest_processes``: how many processes read the trace files at an ingest (default:
    the CPUs this process may use; 1: no worker processes).
    ``BridgeSettings.from_env()`` reads ``$KEEL_BRIDGE_DATA``, ``$KEEL_BRIDGE_PACE`` and
    ``$KEEL_BRIDGE_INGEST_PROCESSES``.

``prepare(settings, *, log=print) -> BridgePaths``
    Generates the sample dataset (seed 7) in ``data_dir`` when no source is configured
    and there is none yet; (re)builds the trace index when the trace files changed (a
    few ``stat`` calls when it is up to date). ``BridgePaths`` says where everything is
    and what was done; ``.describe()`` is a ready startup message.

``build_app(settings=None, store=None) -> Keel``
    A Keel app registering ``diagnose_root_cause(incident_id: str, service: str | None)``
    (``task_mode="optional"``, see ``keel.bridge.task``).

``add_tools(server, settings)``
    Registers the plain tools ``get_incident``, ``search_traces`` and ``list_deploys`` on
    an ``mcp.server.MCPServer``.

``build_server(settings, **options)``, ``serve_options``, ``config_problem``
    How ``keel serve`` serves the Bridge (``keel.bridge.serving``, the seam described in
    ``keel.mcp.serving``): its ``--pace``, ``--incidents``, ``--traces`` and
    ``--deploys`` options and the server over its prepared data.

``keel.bridge.app``
    A module attribute (built on first access from the environment) so that
    ``keel worker --app keel.bridge:app`` works.

The sample data always holds the seed's incident ``INC-2026-0142`` ("Checkout failing
for card payments"): it names **no** service, so the diagnosis asks for one; the answer
of the story is ``payments``, and the conclusion is configuration change ``d-8812``.
"""

from __future__ import annotations

import typing as _typing

if _typing.TYPE_CHECKING:
    from keel.bridge.core import Bridge, BridgePaths, open_bridge, prepare
    from keel.bridge.diagnosis import run_diagnosis
    from keel.bridge.errors import (
        BadQuery,
        BridgeError,
        MalformedSource,
        UnknownIncident,
        UnknownService,
    )
    from keel.bridge.generate import SEED_DEPLOY, SEED_INCIDENT, SEED_SERVICE
    from keel.bridge.serving import build_server, config_problem, serve_options
    from keel.bridge.settings import BridgeSettings
    from keel.bridge.task import TASK_NAME, build_app
    from keel.bridge.tools import BridgeTools, add_tools
    from keel.runtime import Keel

__all__ = [
    "SEED_DEPLOY",
    "SEED_INCIDENT",
    "SEED_SERVICE",
    "TASK_NAME",
    "BadQuery",
    "Bridge",
    "BridgeError",
    "BridgePaths",
    "BridgeSettings",
    "BridgeTools",
    "MalformedSource",
    "UnknownIncident",
    "UnknownService",
    "add_tools",
    "app",
    "build_app",
    "build_server",
    "config_problem",
    "open_bridge",
    "prepare",
    "run_diagnosis",
    "serve_options",
]

_HOMES = {
    "Bridge": "keel.bridge.core",
    "BridgePaths": "keel.bridge.core",
    "open_bridge": "keel.bridge.core",
    "prepare": "keel.bridge.core",
    "run_diagnosis": "keel.bridge.diagnosis",
    "BadQuery": "keel.bridge.errors",
    "BridgeError": "keel.bridge.errors",
    "MalformedSource": "keel.bridge.errors",
    "UnknownIncident": "keel.bridge.errors",
    "UnknownService": "keel.bridge.errors",
    "SEED_DEPLOY": "keel.bridge.generate",
    "SEED_INCIDENT": "keel.bridge.generate",
    "SEED_SERVICE": "keel.bridge.generate",
    "build_server": "keel.bridge.serving",
    "config_problem": "keel.bridge.serving",
    "serve_options": "keel.bridge.serving",
    "BridgeSettings": "keel.bridge.settings",
    "TASK_NAME": "keel.bridge.task",
    "build_app": "keel.bridge.task",
    "BridgeTools": "keel.bridge.tools",
    "add_tools": "keel.bridge.tools",
}
_APP: list[Keel] = []


def __getattr__(name: str) -> _typing.Any:
    """Names load on first use (PEP 562); ``app`` is built once, from the environment."""
    import importlib

    if name == "app":
        if not _APP:
            from keel.bridge.settings import BridgeSettings as _Settings
            from keel.bridge.task import build_app as _build

            _APP.append(_build(_Settings.from_env()))
        return _APP[0]
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'keel.bridge' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
