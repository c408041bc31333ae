"""How ``keel serve`` serves the Bridge (its default app): the Bridge's own options and
``build_server``, the seam :mod:`keel.mcp.serving` describes.

The options read the same environment as ``keel worker --app keel.bridge:app``
(``$KEEL_BRIDGE_DATA``, ``$KEEL_BRIDGE_PACE``, …), so that front ends and workers agree;
the flags and the config file go on top.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from keel.bridge.settings import DATA_ENV, PACE_ENV, BridgeSettings

if TYPE_CHECKING:  # keel serve reads the options above at parse time (and for --help):
    # the MCP SDK, which takes a second or more to import, is imported when serving
    from keel.mcp.serving import Served, ServeSettings

__all__ = ["build_server", "config_problem", "serve_options"]

serve_options = [
    click.Option(
        ["--pace"],
        default=None,
        envvar=PACE_ENV,
        help="Bridge: how long each diagnosis phase takes (a preset name or seconds).",
    ),
    click.Option(
        ["--incidents"],
        type=click.Path(dir_okay=False, path_type=Path),
        envvar="KEEL_BRIDGE_INCIDENTS",
        help="Bridge: incidents JSON file (default: the sample dataset).",
    ),
    click.Option(
        ["--traces"],
        multiple=True,
        type=click.Path(path_type=Path),
        envvar="KEEL_BRIDGE_TRACES",
        help="Bridge: OTLP/JSON trace export file or folder (repeatable).",
    ),
    click.Option(
        ["--deploys"],
        type=click.Path(dir_okay=False, path_type=Path),
        envvar="KEEL_BRIDGE_DEPLOYS",
        help="Bridge: deploy records, JSON or CSV.",
    ),
]
"""The Bridge's ``keel serve`` options (also keys of the ``[serve]`` TOML table)."""


def config_problem(key: str, value: object) -> str | None:
    """What is wrong with a TOML value's type for one of the Bridge's keys (None: nothing)."""
    if key in {"incidents", "deploys"} and not isinstance(value, str):
        return f"must be a string, not {value!r}"
    if key == "pace" and (isinstance(value, bool) or not isinstance(value, str | int | float)):
        return f"must be a preset name or seconds, not {value!r}"
    if key == "traces" and not (
        isinstance(value, str)
        or (isinstance(value, list) and all(isinstance(v, str) for v in value))
    ):
        return f"must be a path or a list of paths, not {value!r}"
    return None


def build_server(
    settings: ServeSettings,
    *,
    pace: str | None = None,
    incidents: Path | None = None,
    traces: tuple[Path, ...] = (),
    deploys: Path | None = None,
) -> Served:
    """The Bridge's app and server, its data prepared (sample data generated, the trace
    index brought up to date), over ``settings.store``.

    Its data lives in ``$KEEL_BRIDGE_DATA`` if set, else ``bridge/`` below
    ``settings.data_dir``.

    Raises:
        KeelError: bad settings or sources, or a store that cannot be used.
    """
    # Imported here: `keel serve` reads every built-in app's options, and serving another
    # app should not pay for importing the diagnosis, the trace index and the generator.
    from keel.bridge.core import prepare
    from keel.bridge.task import build_app
    from keel.bridge.tools import add_tools
    from keel.mcp.serving import Served

    options: dict[str, Any] = {}
    if not os.environ.get(DATA_ENV):
        options["data_dir"] = settings.data_dir.absolute() / "bridge"
    if pace is not None:
        options["pace"] = pace
    if incidents is not None:
        options["incidents"] = incidents
    if traces:
        options["traces"] = list(traces)
    if deploys is not None:
        options["deploys"] = deploys
    bridge_settings = dataclasses.replace(BridgeSettings.from_env(), **options)
    messages: list[str] = []
    paths = prepare(bridge_settings, log=messages.append)
    app = build_app(bridge_settings, store=settings.store)
    server = settings.server_for(app, "incident-bridge")
    add_tools(server, bridge_settings)
    lines = [f"  {line}" for line in paths.describe().splitlines()]
    lines += [f"  {message}" for message in messages]
    return Served(app, server, "Incident Bridge", tuple(lines))
