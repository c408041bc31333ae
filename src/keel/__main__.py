"""``python -m keel``: the ``keel`` command line."""

from keel.cli import main

main()
