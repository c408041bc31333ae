"""What ``diagnose_root_cause`` returns: its structured content, declared as types so
that its tool advertises an ``outputSchema`` (see :class:`keel.runtime.ResultShape`).

Every key :func:`keel.bridge.diagnosis.rank_hypotheses` writes is declared here: the
structured content is the result as this type, so an undeclared key would be left out
(``tests/bridge`` checks that a real diagnosis passes through unchanged).
"""

from __future__ import annotations

from typing import Literal

# pydantic reads TypedDicts from typing_extensions only, below Python 3.12.
from typing_extensions import TypedDict

__all__ = ["Citation", "Claim", "Diagnosis", "Hypothesis", "RootCause", "ServiceScore"]

Kind = Literal["config_change", "bad_deploy", "saturation", "degradation"]


class Citation(TypedDict):
    """A numbered source, with the plain tool call that resolves it."""

    id: str
    kind: Literal["incident", "deploy", "span", "query"]
    ref: str
    tool: Literal["get_incident", "list_deploys", "search_traces"]
    arguments: dict[str, str]
    note: str


class Claim(TypedDict):
    """A statement and the ids of the citations that back it."""

    text: str
    citations: list[str]


class RootCause(TypedDict):
    """The top hypothesis, in short."""

    kind: Kind
    service: str
    deploy_id: str | None
    summary: str


class Hypothesis(RootCause):
    """One ranked explanation, with the claims that support it."""

    score: float
    claims: list[Claim]
    rank: int


class Windows(TypedDict):
    """The compared time windows, ``[start, end]`` in ISO 8601."""

    baseline: list[str]
    during: list[str]


class ServiceScore(TypedDict):
    """How far an anomalous service moved from its baseline."""

    score: float
    signals: list[str]
    error_rate_before: float
    error_rate_during: float
    error_z: float
    p50_before_ms: float
    p50_during_ms: float
    p50_ratio: float
    p95_ratio: float
    latency_z: float
    spans_during: int


class Diagnosis(TypedDict):
    """The cited conclusion of a root-cause diagnosis."""

    incident_id: str
    service: str
    onset: str
    windows: Windows
    conclusion: str
    confidence: float
    root_cause: RootCause | None
    path: list[str]
    incident_claim: Claim
    hypotheses: list[Hypothesis]
    anomalous_services: dict[str, ServiceScore]
    citations: list[Citation]
