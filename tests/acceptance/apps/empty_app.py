"""A Keel app that registers no task: ``keel worker`` has nothing to run with it."""

from keel.runtime import Keel

app = Keel()
