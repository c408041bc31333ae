"""Keel's version, as the installed distribution (``keel-tasks``) says: one place for
``keel --version``, MCP's ``serverInfo.version`` and ``keel.__version__``.

It lives in the MCP layer, the lowest that shows it, so that the servers and the CLI
read it without importing the ``keel`` package's public surface.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import version

__all__ = ["DISTRIBUTION", "keel_version"]

DISTRIBUTION = "keel-tasks"


@cache
def keel_version() -> str:
    """The installed distribution's version (read once, on first use)."""
    return version(DISTRIBUTION)
