"""How the Bridge is configured: where its data lives, which sources it reads, its pace."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from keel.errors import ConfigurationError

__all__ = [
    "DATA_ENV",
    "DEFAULT_DATA_DIR",
    "DEFAULT_LEASE",
    "DEFAULT_PACE",
    "INGEST_PROCESSES_ENV",
    "LEASE_ENV",
    "PACES",
    "PACE_ENV",
    "BridgeSettings",
    "pace_seconds",
]

DEFAULT_DATA_DIR = Path("keel-data") / "bridge"
DATA_ENV = "KEEL_BRIDGE_DATA"
PACE_ENV = "KEEL_BRIDGE_PACE"
LEASE_ENV = "KEEL_BRIDGE_LEASE"
INGEST_PROCESSES_ENV = "KEEL_BRIDGE_INGEST_PROCESSES"
DEFAULT_LEASE = 30.0  # seconds a worker holds a diagnosis between two renewals
DEFAULT_PACE = "demo"
PACES: Mapping[str, float] = {
    "fast": 0.0,  # no artificial latency: tests and benchmarks
    "demo": 0.9,  # seconds per phase: a whole diagnosis (8 phases) takes ~7-8 s
    "realistic": 150.0,  # seconds per phase: ~20 minutes, like the seed's slow sources
}
"""Named paces: seconds the diagnosis waits after each phase it actually computes."""


def pace_seconds(pace: str | float) -> float:
    """Seconds per phase for a pace name (``fast``, ``demo``, ``realistic``) or a number.

    Raises:
        ConfigurationError: an unknown name, or a negative or non-finite number.
    """
    if isinstance(pace, str):
        name = pace.strip().lower()
        if name in PACES:
            return PACES[name]
        try:
            value = float(name)
        except ValueError:
            raise ConfigurationError(
                f"unknown Bridge pace {pace!r}: use {', '.join(PACES)} or seconds per phase"
            ) from None
    else:
        value = float(pace)
    if not math.isfinite(value) or value < 0:
        raise ConfigurationError(f"Bridge pace must be >= 0 seconds per phase, not {pace!r}")
    return value


@dataclass(frozen=True)
class BridgeSettings:
    """Where the Bridge's data is and how fast the diagnosis goes.

    Attributes:
        data_dir: the sample dataset (when no sources are given) and the trace index
            (``index.db``) live here. Default ``keel-data/bridge``.
        incidents: a JSON file of incidents (default ``DATA_DIR/incidents.json``).
        traces: OTLP/JSON files or folders of them (default ``DATA_DIR/traces``).
        deploys: deploy records as JSON or CSV (default ``DATA_DIR/deploys.json``).
        pace: ``"fast"`` (no artificial latency), ``"demo"`` (default: ~8 s a diagnosis),
            ``"realistic"`` (~20 minutes), or seconds per phase as a number.
        lease_seconds: the diagnosis task's lease: how soon another worker takes over
            from one that died (tests shorten it).
        ingest_processes: how many processes read the trace files at an ingest (None,
            the default: the CPUs this process may use; 1: this process alone, no
            worker processes). The index is the same either way.
    """

    data_dir: Path = DEFAULT_DATA_DIR
    incidents: Path | None = None
    traces: list[Path] | None = field(default=None, hash=False)
    deploys: Path | None = None
    pace: str | float = DEFAULT_PACE
    lease_seconds: float = DEFAULT_LEASE
    ingest_processes: int | None = None

    def __post_init__(self) -> None:
        pace_seconds(self.pace)  # refuse a bad pace when the settings are made
        processes = self.ingest_processes
        if processes is not None and (
            isinstance(processes, bool) or not isinstance(processes, int) or processes < 1
        ):
            raise ConfigurationError(f"ingest processes must be an integer >= 1, not {processes!r}")
        if not (math.isfinite(self.lease_seconds) and self.lease_seconds > 0):
            raise ConfigurationError(f"lease_seconds must be > 0, not {self.lease_seconds!r}")
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        if self.incidents is not None:
            object.__setattr__(self, "incidents", Path(self.incidents))
        if self.deploys is not None:
            object.__setattr__(self, "deploys", Path(self.deploys))
        if self.traces is not None:
            object.__setattr__(self, "traces", [Path(p) for p in self.traces])

    @property
    def pace_seconds(self) -> float:
        """Seconds per phase this pace means."""
        return pace_seconds(self.pace)

    @property
    def has_sources(self) -> bool:
        """Whether any source was given explicitly (then no sample data is generated)."""
        return any(s is not None for s in (self.incidents, self.traces, self.deploys))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> BridgeSettings:
        """Settings from the environment ``keel serve`` reads too, so that one environment
        configures front ends and workers alike: ``$KEEL_BRIDGE_DATA`` (the data dir; else
        ``$KEEL_DATA_DIR/bridge``, as ``keel serve`` lays it out), ``$KEEL_BRIDGE_INCIDENTS``,
        ``$KEEL_BRIDGE_TRACES`` (paths separated by ``:``, as in ``$PATH`` and as
        ``keel serve`` reads it), ``$KEEL_BRIDGE_DEPLOYS``,
        ``$KEEL_BRIDGE_PACE``, ``$KEEL_BRIDGE_LEASE`` (seconds) and
        ``$KEEL_BRIDGE_INGEST_PROCESSES``.

        Raises:
            ConfigurationError: a bad pace, lease or number of processes.
        """
        env = os.environ if environ is None else environ
        data = env.get(DATA_ENV) or (
            str(Path(env["KEEL_DATA_DIR"]) / "bridge")
            if env.get("KEEL_DATA_DIR")
            else str(DEFAULT_DATA_DIR)
        )
        lease = env.get(LEASE_ENV) or str(DEFAULT_LEASE)
        try:
            lease_seconds = float(lease)
        except ValueError:
            raise ConfigurationError(f"${LEASE_ENV} must be seconds, not {lease!r}") from None
        processes = env.get(INGEST_PROCESSES_ENV) or None
        try:
            ingest_processes = int(processes) if processes is not None else None
        except ValueError:
            raise ConfigurationError(
                f"${INGEST_PROCESSES_ENV} must be a number of processes, not {processes!r}"
            ) from None
        incidents = env.get("KEEL_BRIDGE_INCIDENTS")
        deploys = env.get("KEEL_BRIDGE_DEPLOYS")
        traces = [t for t in env.get("KEEL_BRIDGE_TRACES", "").split(os.pathsep) if t]
        return cls(
            data_dir=Path(data),
            incidents=Path(incidents) if incidents else None,
            traces=[Path(t) for t in traces] or None,
            deploys=Path(deploys) if deploys else None,
            pace=env.get(PACE_ENV) or DEFAULT_PACE,
            lease_seconds=lease_seconds,
            ingest_processes=ingest_processes,
        )
