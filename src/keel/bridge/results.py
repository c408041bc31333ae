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

__all__ = ["Citation", "Claim", "Diagnosis", "Hypothesis", "RootCause", "Suspect", "Symptom"]

Kind = Literal["config_change", "bad_deploy", "saturation", "degradation", "dependency"]


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
    """The top hypothesis, in short: ``service`` names the cause, a service or (with
    ``type`` "dependency") a database, queue, cache or external API."""

    kind: Kind
    service: str
    type: Literal["service", "dependency"]
    deploy_id: str | None
    summary: str


class Hypothesis(RootCause):
    """One ranked explanation, with the claims that support it."""

    score: float
    claims: list[Claim]
    rank: int
    path: list[str]


class Windows(TypedDict):
    """The compared time windows, ``[start, end]`` in ISO 8601."""

    baseline: list[str]
    during: list[str]


class Symptom(TypedDict, total=False):
    """How the symptomatic service's requests changed (before, during)."""

    changed: bool
    why: str
    error_rate: list[float]
    ms_per_request: list[float]
    error_z: float
    latency_z: float
    errors_rose: bool
    slower: bool


class Suspect(TypedDict):
    """A service or dependency whose own change accounts for part of the symptom's."""

    kind: Literal["service", "dependency"]
    share: float
    error_share: float
    time_share: float
    blamed_rate: list[float]
    blame_z: float
    ms_per_request: list[float]
    time_z: float
    signals: list[str]


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
    symptom: Symptom
    suspects: dict[str, Suspect]
    sampled: float
    citations: list[Citation]
