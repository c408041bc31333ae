"""What ``diagnose_root_cause`` returns: its structured content, declared as types so
that its tool advertises an ``outputSchema`` (see :class:`keel.runtime.ResultShape`).

Every key :func:`keel.bridge.diagnosis.rank_hypotheses` writes is declared here: the
structured content is the result as this type, so an undeclared key would be left out
(``tests/bridge`` checks that a real diagnosis passes through unchanged).
"""

from __future__ import annotations

from typing import Literal, NotRequired

# pydantic reads TypedDicts from typing_extensions only, below Python 3.12.
from typing_extensions import TypedDict

__all__ = [
    "Citation",
    "Claim",
    "Diagnosis",
    "Hypothesis",
    "RootCause",
    "Suspect",
    "Symptom",
    "WeakSignal",
]

Kind = Literal[
    "config_change",
    "bad_deploy",
    "saturation",
    "degradation",
    "dependency",
    "weak_signal",
    "recent_change",
]


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
    suspect: str  # the anomalous service or dependency the hypothesis explains


class Windows(TypedDict):
    """The compared time windows, ``[start, end]`` in ISO 8601."""

    baseline: list[str]
    during: list[str]


class Symptom(TypedDict):
    """How the symptomatic service's requests look, before and during."""

    changed: bool
    impact: float
    requests: list[int]
    error_rate: list[float]
    median_ms: list[float]


class Suspect(TypedDict):
    """A service or dependency the symptom's requests reach whose own calls changed."""

    kind: Literal["service", "dependency"]
    share: float  # of all the evidence (0..1)
    weight: float
    impact: float  # added time and failures, relative to the symptom's usual
    added_ms: float  # time it adds to a request of the symptom
    failing_requests: float  # share of the symptom's requests it now fails
    slower: bool
    failing: bool
    time_z: float
    failure_z: float
    ratio: float  # median own time per call, during / baseline
    median_ms: list[float]
    failure_rate: list[float]
    reach: float  # share of the symptom's requests that reach it
    signals: list[str]
    # [minute its own change began, relative to the onset; how well a step fits (0..1)]
    own_onset: NotRequired[list[float]]
    elsewhere: NotRequired[bool]  # an abrupt change that began at another incident's time


class WeakSignal(TypedDict):
    """A change short of sure (z from 2 to 3), listed only when there is no clear cause."""

    kind: Literal["service", "dependency"]
    z: float
    reach: float
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
    weak: dict[str, WeakSignal]
    sampled: float
    citations: list[Citation]
