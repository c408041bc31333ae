"""Loading SQL from the ``.sql`` files shipped beside each SQL adapter."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

__all__ = ["Migration", "load_migrations", "load_queries"]

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_(\w+)\.sql$")


def load_queries(package: str, filename: str = "queries.sql") -> dict[str, str]:
    """The named statements of a queries file (``-- name: x`` starts each one)."""
    text = resources.files(package).joinpath(filename).read_text(encoding="utf-8")
    parts = _NAME.split(text)
    # parts: [preamble, name1, body1, name2, body2, …]
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts), 2)}


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def load_migrations(package: str) -> list[Migration]:
    """The ``NNNN_name.sql`` files of ``package``, in version order."""
    found = []
    for entry in resources.files(package).iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):  # pragma: no cover - a packaging mistake
        raise RuntimeError(f"migrations of {package} are not numbered 1..n: {versions}")
    return found
