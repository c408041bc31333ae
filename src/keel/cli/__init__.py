"""The ``keel`` command line."""

from __future__ import annotations


def main() -> None:
    """Entry point of the ``keel`` console script."""
    from keel.cli.app import main as run

    run()
