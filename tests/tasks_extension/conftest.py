"""Fixtures of the tasks-extension tests: a Keel app on a real SQLite store, with the
tasks of :func:`tasks_extension.support.build_app`, and an MCPServer over it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp.server import MCPServer

from keel.runtime import Keel
from keel.store import SqliteStore
from tasks_extension.support import build_app, build_server


@pytest.fixture
def keel_app(tmp_path: Path) -> Keel:
    """The test tasks on a fresh SQLite store under ``tmp_path``."""
    return build_app(Keel(SqliteStore(tmp_path / "keel.db")))


@pytest.fixture
def mcp_server(keel_app: Keel) -> MCPServer[Any]:
    """An unauthenticated MCPServer over ``keel_app``, workers in its lifespan."""
    return build_server(keel_app)
