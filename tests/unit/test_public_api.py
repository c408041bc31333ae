"""Unit: the public API (``__all__``) of keel, keel.model and keel.store is sorted and whole."""

from __future__ import annotations

import importlib
import re
from types import ModuleType

import pytest

PACKAGES = ["keel", "keel.model", "keel.store"]
_CONSTANT = re.compile(r"^[A-Z][A-Z0-9_]*$")


def isort_key(name: str) -> tuple[int, str]:
    """The order ruff's RUF022 keeps: CONSTANTS, then Classes, then functions."""
    if _CONSTANT.match(name):
        return (0, name)
    if name[:1].isupper():
        return (1, name)
    return (2, name)


@pytest.mark.parametrize("package", PACKAGES)
def test_all_is_sorted_and_unique(package):
    """__all__ is sorted (constants, classes, functions) and has no duplicates."""
    names = importlib.import_module(package).__all__
    assert list(names) == sorted(names, key=isort_key)
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_name_in_all_is_importable(package):
    """Every name in __all__ can be imported from the package."""
    module = importlib.import_module(package)
    for name in module.__all__:
        exec(f"from {package} import {name}", {})  # the import statement users write
        assert getattr(module, name) is not None


@pytest.mark.parametrize("package", PACKAGES)
def test_all_is_complete(package):
    """Every public, non-module name the package defines is listed in __all__."""
    module = importlib.import_module(package)
    # dir() rather than vars(): keel loads its names lazily and lists them in __dir__.
    public = {
        name
        for name in dir(module)
        if not name.startswith("_")
        and not isinstance(getattr(module, name), ModuleType)
        and name != "annotations"  # from __future__ import annotations
    }
    assert public == set(module.__all__)


def test_errors_are_one_tree():
    """Every error keel exports derives from KeelError, as errors.py draws it."""
    import keel

    errors = [getattr(keel, n) for n in keel.__all__ if n.endswith(("Error", "Exception"))]
    errors += [keel.TaskNotFound, keel.InvalidTransition, keel.LeaseLost, keel.ImportFailed]
    for error in errors:
        assert issubclass(error, keel.KeelError), error
    assert issubclass(keel.TaskAlreadyTerminal, keel.InvalidTransition)
    assert issubclass(keel.InputRejected, keel.InvalidPayload)
    assert issubclass(keel.PayloadTooLarge, keel.InvalidPayload)


def test_version_is_set():
    """keel.__version__ matches the distribution's version."""
    from importlib.metadata import version

    import keel

    assert keel.__version__ == version("keel-tasks")
