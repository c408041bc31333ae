"""The MCP server of a Keel app, and the seam through which ``keel serve`` serves an app.

:func:`app_server` builds the server of a Keel app; the Bridge, the conformance app and
``keel serve --app MODULE:ATTR`` all go through it, so that every one of them says who it
is the same way.

An app module, served by ``keel serve --app NAME`` (the built-in ``bridge`` and
``conformance``: ``keel.bridge``, ``keel.conformance``) or ``keel serve --app MODULE``
(one of your own), is a module with:

``build_server(settings: ServeSettings, **options) -> Served``
    Required. Builds the app on ``settings.store`` and its server (with
    :meth:`ServeSettings.server_for`), preparing whatever data it needs; ``options`` are
    the values of its ``serve_options``, by parameter name.

``serve_options: Sequence[click.Option]``
    Optional. The app's own ``keel serve`` options (each with its environment variable);
    ``keel serve`` shows them in its help, reads them from the ``[serve]`` table of its
    TOML file too, and refuses them on the command line of another app. A module of your
    own is imported while keel serve parses its arguments, when ``--app`` or
    ``$KEEL_APP`` names it, so that its options are known.

``config_problem(key: str, value: object) -> str | None``
    Optional. What is wrong with the type of a TOML value for one of its options (None:
    nothing), for a clear refusal before click converts it.

A built-in app whose options are read from a lighter module than the app itself (so
that parsing ``keel serve``'s arguments does not import every app) names that module in
``keel.cli.serve.OPTIONS_OF``: the Bridge's live in ``keel.bridge.serving``.

A plain Keel app (``--app MODULE:ATTR``) needs none of these: :func:`serve_keel_app`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp.server import MCPServer

from keel.mcp.server import TasksExtension, keel_lifespan
from keel.mcp.state_key import request_state_security
from keel.mcp.version import keel_version
from keel.runtime import Keel

__all__ = ["ServeSettings", "Served", "app_server", "serve_keel_app"]


def app_server(
    app: Keel,
    name: str,
    *,
    rate_limit_polls: bool = False,
    concurrency: int = 4,
    run_workers: bool = True,
    state_dir: Path | None = None,
) -> MCPServer[Any]:
    """An ``MCPServer`` named ``name`` serving ``app``'s tasks through the tasks extension
    (and the 2025-11-25 tasks protocol, :mod:`keel.mcp.v2025`), with ``concurrency``
    workers in its lifespan (none unless ``run_workers``); its ``serverInfo.version`` is
    Keel's version. Plain tools may be added to it.

    ``state_dir`` keeps the key that seals ``requestState`` (see ``keel.mcp.state_key``),
    so a client asked for input before a restart can still answer after it; without one
    the key lives in this process only.

    Raises:
        ConfigurationError: the request-state key cannot be read or is too short.
    """
    tasks = TasksExtension(app, rate_limit_polls=rate_limit_polls)
    return MCPServer(
        name,
        version=keel_version(),
        request_state_security=request_state_security(state_dir),
        extensions=[tasks],
        middleware=[tasks.middleware()],  # the 2025-11-25 tasks protocol on the same tasks
        lifespan=keel_lifespan(app, concurrency=concurrency, run_workers=run_workers),
    )


@dataclass(frozen=True, slots=True)
class ServeSettings:
    """What ``keel serve`` settles for every app it serves, whichever it is."""

    store: str
    """The task store's location, as :func:`keel.store.open_store` takes it."""
    data_dir: Path
    """``keel serve --data-dir``: the request-state key lives here; an app may keep its
    own data below it."""
    run_workers: bool = True
    concurrency: int = 4  # tasks run at once by this process's workers
    rate_limit_polls: bool = False

    def server_for(self, app: Keel, name: str) -> MCPServer[Any]:
        """:func:`app_server` of ``app`` with these settings.

        Raises:
            ConfigurationError: the request-state key cannot be read or is too short.
        """
        return app_server(
            app,
            name,
            rate_limit_polls=self.rate_limit_polls,
            concurrency=self.concurrency,
            run_workers=self.run_workers,
            state_dir=self.data_dir,
        )


@dataclass(frozen=True, slots=True)
class Served:
    """An app ready to serve: what ``build_server`` gives ``keel serve``."""

    app: Keel
    server: MCPServer[Any]
    title: str
    """How ``keel serve``'s startup message names it (``Incident Bridge``)."""
    lines: tuple[str, ...] = ()
    """More lines for that message: where its data is, what was prepared."""


def serve_keel_app(app: Keel, name: str, settings: ServeSettings) -> Served:
    """A plain Keel app (``keel serve --app MODULE:ATTR``) on ``settings.store``.

    Raises:
        KeelError: the store or the request-state key cannot be used.
    """
    app.use_store(settings.store)
    return Served(app, settings.server_for(app, name), f"app {name}")
