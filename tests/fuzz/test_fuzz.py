"""Hostile requests against a real ``keel serve``, on SQLite and PostgreSQL, through both
protocols (issue 15, item 6): no HTTP 5xx, no JSON-RPC -32603, every answer JSON-RPC (or
a transport 4xx), and the store unchanged after every refusal.

The strategies (:mod:`fuzz.strategies`) draw with a fixed seed (``derandomize``), so a
run is the same run every time; the 10,000-request run is ``bench/fuzz_bench.py``.
Checked per probe by :meth:`fuzz.harness.Harness.check`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fuzz.harness import Harness, Outcome, Served, drive, fuzz_server
from fuzz.strategies import KINDS, V2026, Probe
from keel.mcp.v2025 import V2025

# slow: each module-scoped server is a real keel serve process (seconds to start), and
# every test sends a hundred requests to it.
pytestmark = pytest.mark.slow

EXAMPLES = {"envelope": 40, "arguments": 40, "task-id": 25, "answer": 25}
"""Probes per test (4 kinds x 2 protocols x 2 apps x 2 stores: about 1,000 in all, about
a minute on two cores); bench/fuzz_bench.py sends ten times as many."""


@pytest.fixture(
    scope="module",
    params=[
        ("conformance", "sqlite"),
        ("conformance", "postgres"),
        ("bridge", "sqlite"),
        ("bridge", "postgres"),
    ],
    ids="-".join,
)
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """A keel serve of one app on one store, for the module's tests."""
    app, store = request.param
    with fuzz_server(app, store, tmp_path_factory.mktemp(f"fuzz-{app}-{store}")) as running:
        yield running


@pytest.mark.parametrize("protocol", [V2026, V2025])
@pytest.mark.parametrize("kind", KINDS)
def test_no_internal_error_and_no_change_on_refusal(
    served: Served, protocol: str, kind: str
) -> None:
    """Every probe of ``kind`` through ``protocol`` is answered as the module says."""
    with Harness(served, protocol) as harness:
        if kind == "answer" and protocol == V2026 and not harness.target.waiting:
            pytest.skip(f"{served.app} has no task that waits for input")

        def answered_well(probe: Probe, outcome: Outcome) -> None:
            assert not outcome.problems, f"{probe.describe()}\n" + "\n".join(outcome.problems)

        drive(harness, kind, EXAMPLES[kind], answered_well)
