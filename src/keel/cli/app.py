"""Placeholder replaced by the CLI implementation."""

from __future__ import annotations


def main() -> None:
    """Run the ``keel`` command line."""
    raise SystemExit("keel: command line not built yet")
