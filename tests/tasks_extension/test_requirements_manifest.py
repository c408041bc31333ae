"""The requirements manifest is complete in both directions.

Every requirement without a written deviation is named by at least one test's
``@pytest.mark.requirement(...)``, and every id a test names is in the manifest.

The markers are read from a ``pytest --collect-only`` run in a subprocess over every test
file that mentions the marker, so the answer is the same whether this test runs alone,
with ``-k``, or in the full suite (where deselection would hide tests from this session).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tasks_extension.requirements import ALL, LEVELS, REQUIREMENTS, needing_tests

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
ID = re.compile(r"^(A(1[01]|[1-9])\.[1-9][0-9]*|B[1-9]\.[1-9][0-9]*|K[1-9][0-9]*)$")
COLLECT = """
import json, sys
import pytest

class Markers:
    def __init__(self):
        self.found = {}

    def pytest_collection_finish(self, session):
        for item in session.items:
            ids = [i for mark in item.iter_markers("requirement") for i in mark.args]
            if ids:
                xfail = item.get_closest_marker("xfail") is not None
                self.found[item.nodeid] = {"ids": ids, "xfail": xfail}

markers = Markers()
code = pytest.main(
    ["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[2:]], plugins=[markers]
)
with open(sys.argv[1], "w") as out:
    json.dump({"exit": int(code), "found": markers.found}, out)
"""


def files_with_markers() -> list[Path]:
    """Test files under tests/ that use the requirement marker."""
    return sorted(
        path
        for path in TESTS.rglob("test_*.py")
        if "mark.requirement" in path.read_text(encoding="utf-8")
    )


@pytest.fixture(scope="module")
def named(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Test node id -> ``{"ids": requirement ids it names, "xfail": bool}``, as pytest
    itself collects them."""
    files = files_with_markers()
    assert files, "no test names a requirement"
    out = tmp_path_factory.mktemp("markers") / "markers.json"
    run = subprocess.run(
        [sys.executable, "-c", COLLECT, str(out), *map(str, files)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert out.exists(), f"collection did not run:\n{run.stdout}\n{run.stderr}"
    report = json.loads(out.read_text())
    assert report["exit"] == 0, f"collection failed:\n{run.stdout}\n{run.stderr}"
    found: dict[str, dict[str, Any]] = report["found"]
    return found


def test_the_manifest_is_well_formed() -> None:
    """Ids are unique and well formed, levels are the spec's words, paraphrases and
    deviation reasons are written out, and every section B1-B9 and A1-A11 has requirements."""
    assert len(REQUIREMENTS) == len(ALL), "duplicate ids"
    for requirement in ALL:
        assert ID.match(requirement.id), requirement.id
        assert requirement.level in LEVELS, requirement
        assert len(requirement.text) > 20, requirement
        assert requirement.source, requirement
        if requirement.deviation is not None:
            assert len(requirement.deviation) > 40, f"{requirement.id}: say why"
            assert requirement.failing is None, f"{requirement.id}: untested cannot fail"
    sections = {r.id.split(".")[0] for r in ALL if r.id.startswith("B")}
    assert sections == {f"B{n}" for n in range(1, 10)}
    sections = {r.id.split(".")[0] for r in ALL if r.id.startswith("A")}
    assert sections == {f"A{n}" for n in range(1, 12)}


@pytest.mark.slow
def test_every_tested_requirement_is_named_by_a_test(named: dict[str, dict[str, Any]]) -> None:
    """No requirement claims 'tested' without a test that names it."""
    covered = {i for test in named.values() for i in test["ids"]}
    missing = sorted(needing_tests() - covered)
    assert not missing, f"requirements no test names (test them or write a deviation): {missing}"


@pytest.mark.slow
def test_every_marker_names_a_known_requirement(named: dict[str, dict[str, Any]]) -> None:
    """A typo in a marker (or a retired id) fails here, naming the test."""
    unknown = {
        node: [i for i in test["ids"] if i not in REQUIREMENTS]
        for node, test in named.items()
        if any(i not in REQUIREMENTS for i in test["ids"])
    }
    assert not unknown, f"tests naming unknown requirements: {unknown}"


@pytest.mark.slow
def test_known_failures_are_declared_and_only_those(named: dict[str, dict[str, Any]]) -> None:
    """The requirements whose tests are all strict xfails are exactly those the manifest
    marks ``failing``: a fixed bug (its xfail removed) must drop the mark, and a new
    xfail must be declared."""
    passing = {i for test in named.values() if not test["xfail"] for i in test["ids"]}
    only_xfail = {
        i for test in named.values() if test["xfail"] for i in test["ids"] if i not in passing
    }
    declared = {r.id for r in ALL if r.failing is not None}
    assert only_xfail == declared
