"""Unit: the shape of ``src/keel`` — layers, no import cycle, module and function sizes.

The house reads ``cli -> apps -> mcp -> runtime -> telemetry -> store -> model / errors``
(telemetry sits right above the store, so that every layer above may use it): a module may
import from its own layer or a lower one, never a higher one, and the import graph has no
cycle. Every import counts, including those inside functions and under ``TYPE_CHECKING``.
No module is over 700 lines and no function over 80 (from its ``def`` to its end, nested
functions counted in their parent). CONTRIBUTING.md explains the layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "keel"
MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 80

LAYERS: dict[str, int] = {
    "keel.errors": 0,
    "keel.model": 0,
    "keel.store": 1,
    "keel.telemetry": 2,
    "keel.runtime": 3,
    "keel.mcp": 4,
    "keel.bridge": 5,
    "keel.conformance": 5,
    "keel.ops": 5,
    "keel.cli": 6,
}
"""Each package's floor. The root ``keel`` (lazy public exports) and ``keel.__main__``
(the ``python -m keel`` entry) stand above every floor."""

ROOTS = {"keel", "keel.__main__"}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str:
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imports(name: str, path: Path) -> set[str]:
    """Every keel module that ``name`` imports, wherever the import statement is."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "keel")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "keel":
                continue
            found.add(target)
            found.update(
                f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES
            )
    return {_resolve(m) for m in found} - {name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _floor(name: str) -> int | None:
    for package, floor in LAYERS.items():
        if name == package or name.startswith(package + "."):
            return floor
    return None


def test_every_module_has_a_floor() -> None:
    """A new top-level module must be placed on a floor (or be one of the roots)."""
    assert [m for m in MODULES if m not in ROOTS and _floor(m) is None] == []


def test_no_import_goes_up_a_floor() -> None:
    """No module imports from a higher floor; apps never import the CLI."""
    upward = [
        f"{name} -> {target}"
        for name, targets in GRAPH.items()
        if name not in ROOTS
        for target in sorted(targets)
        if target not in ROOTS and (_floor(target) or 0) > (_floor(name) or 0)
    ]
    upward += [f"{name} -> keel" for name in GRAPH if name not in ROOTS and "keel" in GRAPH[name]]
    assert upward == []


def test_no_import_cycle() -> None:
    """The import graph of src/keel is acyclic (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in GRAPH[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                component.append(top)
            if component:
                cycles.append(sorted([node, *component]))

    for node in GRAPH:
        if node not in index:
            visit(node)
    assert cycles == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_and_function_sizes(name: str) -> None:
    """At most 700 lines per module and 80 per function (nested ones counted in it)."""
    text = MODULES[name].read_text(encoding="utf-8")
    lines = len(text.splitlines())
    assert lines <= MAX_MODULE_LINES, f"{name} has {lines} lines"
    too_long: list[str] = []

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (child.end_lineno or child.lineno) - child.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{child.name}: {length} lines")
            else:
                walk(child)

    walk(ast.parse(text))
    assert too_long == []
