"""Accuracy of the diagnosis on generated datasets it was never tuned on.

The thresholds and weights of ``keel.bridge.diagnosis`` were tuned on generator seeds 3
and 7 to 13 only. The seeds below were fixed before this test first ran and were never
used while tuning: 3 datasets x 13 incidents = 39 incidents (bad deploys, saturations,
configuration changes; many with a red-herring deploy shortly before the onset).

Every citation of every result is resolved through the Bridge's own plain tools on a
real ``MCPServer`` (in-process), and the ground truth is out of the Bridge's reach while
it diagnoses (moved out of the data folder, and an audit hook watches every open()).
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

import pytest
from mcp.server import MCPServer

from keel.bridge.core import open_bridge
from keel.bridge.diagnosis import run_diagnosis
from keel.bridge.generate import GROUND_TRUTH, KINDS
from keel.bridge.tools import add_tools

from .conftest import DatasetFactory, truth_of

# slow: diagnoses a set of generated datasets (minutes on two cores)
pytestmark = [pytest.mark.anyio, pytest.mark.slow]

TEST_SEEDS = (2718, 31415, 16180)  # never used while tuning (tuned on 3, 7..13)
# The targets of the held-out evaluation (docs/bridge.md): the top hypothesis is the
# injected cause (kind, service and deploy: stricter than naming the cause) in at least
# 85 % overall and 70 % of each kind; an abstention ("no clear cause") counts as a miss.
TARGET = 0.85
TARGET_PER_KIND = 0.7

_OPENED: list[str] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and args and isinstance(args[0], str | bytes):
        name = args[0] if isinstance(args[0], str) else args[0].decode(errors="replace")
        if name.endswith(GROUND_TRUTH):
            _OPENED.append(name)


sys.addaudithook(_audit)


async def resolves(server: MCPServer[Any], citation: dict[str, Any]) -> bool:
    """Whether the citation's own tool call finds what it names."""
    result = await server.call_tool(citation["tool"], citation["arguments"])
    assert not getattr(result, "is_error", False), (citation, result)
    found = result.structured_content or {}
    kind, ref = citation["kind"], citation["ref"]
    if kind == "incident":
        return bool(found["incident"]["id"] == ref)
    if kind == "deploy":
        return any(d["id"] == ref for d in found["deploys"])
    if kind == "span":
        trace_id, span_id = ref.split("/")
        return any(s["trace_id"] == trace_id and s["span_id"] == span_id for s in found["spans"])
    assert kind == "query", citation
    return bool(found["total"] > 0)


async def test_top_hypothesis_is_the_injected_cause_and_every_citation_resolves(
    dataset: DatasetFactory,
) -> None:
    """On 39 incidents of unseen seeds: the top hypothesis is the injected cause (kind,
    service and deploy) in >= 85 %, and >= 70 % of each kind; a red-herring deploy is
    never on top;
    every citation resolves through get_incident / search_traces / list_deploys; the
    ground-truth file is never opened while diagnosing."""
    total: Counter[str] = Counter()
    right: Counter[str] = Counter()
    misses: list[str] = []
    herrings = herring_on_top = citations = 0
    for seed in TEST_SEEDS:
        settings = dataset(seed)
        truth = truth_of(settings)  # read by the test, before diagnosing
        bridge = open_bridge(settings)
        server: MCPServer[Any] = MCPServer("bridge-test")
        add_tools(server, settings)
        for case in truth:
            _OPENED.clear()
            result = run_diagnosis(bridge, case["incident_id"], case["symptom_service"])
            assert _OPENED == [], "the diagnosis opened the ground truth"
            top = result["root_cause"]
            got = None if top is None else (top["kind"], top["service"], top["deploy_id"])
            want = (case["kind"], case["root_service"], case.get("deploy_id"))
            total[case["kind"]] += 1
            if got == want:
                right[case["kind"]] += 1
            else:
                misses.append(f"seed {seed} {case['incident_id']}: want {want}, got {got}")
            herrings += len(case["herring_ids"])
            herring_on_top += top is not None and top["deploy_id"] in case["herring_ids"]
            assert 0 <= result["confidence"] <= 1
            cited = {c for h in result["hypotheses"] for cl in h["claims"] for c in cl["citations"]}
            assert cited <= {c["id"] for c in result["citations"]}
            for citation in result["citations"]:
                assert await resolves(server, citation), citation
                citations += 1

    report = ", ".join(f"{k}: {right[k]}/{total[k]}" for k in KINDS)
    print(
        f"\naccuracy per kind on seeds {TEST_SEEDS}: {report}; red herrings: {herrings}, "
        f"on top: {herring_on_top}; citations resolved: {citations}"
    )
    assert sum(total.values()) >= 20
    assert set(total) == set(KINDS)
    assert sum(right.values()) / sum(total.values()) >= TARGET, (report, misses)
    for kind in KINDS:
        assert right[kind] / total[kind] >= TARGET_PER_KIND, (report, misses)
    assert herrings > 0
    assert herring_on_top == 0
