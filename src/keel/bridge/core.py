"""``prepare`` (sample data, index) and ``Bridge``, the data the tools and the diagnosis read.

Data directory layout (``BridgeSettings.data_dir``, default ``keel-data/bridge``)::

    incidents.json        incidents        (unless --incidents points elsewhere)
    deploys.json          deploy records   (unless --deploys points elsewhere; or .csv)
    traces/*.jsonl        OTLP/JSON        (unless --traces points elsewhere)
    ground-truth.json     what the sample data injected (never read by the Bridge)
    index.db              the trace index, rebuilt when the trace files change
    .lock                 serializes prepare() between processes
"""

from __future__ import annotations

import fcntl
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from keel.bridge.errors import BridgeError
from keel.bridge.generate import generate
from keel.bridge.index import (
    INDEX_FORMAT,
    IngestReport,
    Progress,
    TraceIndex,
    build_index,
    fingerprint,
)
from keel.bridge.settings import BridgeSettings
from keel.bridge.sources import FileDeploys, JsonIncidents, OtlpJsonTraces
from keel.errors import ConfigurationError

__all__ = ["INDEX_FILE", "Bridge", "BridgePaths", "open_bridge", "prepare"]

INDEX_FILE = "index.db"
SAMPLE_SEED = 7
Log = Callable[[str], object]


@dataclass(frozen=True, slots=True)
class BridgePaths:
    """Where everything is, and what ``prepare`` did (for the startup message)."""

    data_dir: Path
    incidents: Path
    deploys: Path
    traces: list[Path]
    index: Path
    generated: bool  # sample data was written by this call
    ingested: IngestReport | None  # the index was (re)built by this call
    spans: int  # spans in the index
    trace_files: int

    def describe(self) -> str:
        """One line per thing, for a startup message."""
        sample = " (sample data generated now)" if self.generated else ""
        built = (
            f"; indexed now: {self.ingested.spans:,} spans in {self.ingested.seconds:.1f}s"
            if self.ingested
            else ""
        )
        return "\n".join(
            [
                f"bridge data:  {self.data_dir}{sample}",
                f"  incidents:  {self.incidents}",
                f"  deploys:    {self.deploys}",
                f"  traces:     {', '.join(map(str, self.traces))} ({self.trace_files} files)",
                f"  index:      {self.index} ({self.spans:,} spans{built})",
            ]
        )


def _sources(settings: BridgeSettings) -> tuple[Path, Path, list[Path]]:
    data = settings.data_dir
    incidents = settings.incidents or data / "incidents.json"
    if settings.deploys is not None:
        deploys = settings.deploys
    else:
        csv = data / "deploys.csv"
        deploys = (
            csv if csv.exists() and not (data / "deploys.json").exists() else data / "deploys.json"
        )
    traces = settings.traces if settings.traces is not None else [data / "traces"]
    return incidents, deploys, traces


@contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    """One ``prepare`` at a time per data directory, across processes."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        handle = (data_dir / ".lock").open("a")
    except OSError as exc:  # a file where a directory should be, no permission …
        raise ConfigurationError(
            f"Bridge data directory {data_dir} cannot be used: {exc.strerror or exc}"
        ) from exc
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def prepare(
    settings: BridgeSettings, *, log: Log = print, progress: Progress | None = None
) -> BridgePaths:
    """Make the Bridge's data ready: sample data if there is none, an up-to-date index.

    With no source configured and no dataset in ``data_dir``, the sample dataset (seed 7)
    is generated there. The trace index is rebuilt when the trace files differ (by path,
    size and mtime) from those it was built from; otherwise this is a few ``stat`` calls.

    Raises:
        ConfigurationError: a configured source that does not exist.
        MalformedSource: an incidents, deploys or trace file that cannot be read (names the
            file and line; the old index is kept).
    """
    incidents, deploys, traces = _sources(settings)
    index_path = settings.data_dir / INDEX_FILE
    with _locked(settings.data_dir):
        generated = False
        if not settings.has_sources and not incidents.exists():
            generate(settings.data_dir, seed=SAMPLE_SEED, log=log)
            generated = True
        for what, path in (("incidents", incidents), ("deploys", deploys)):
            if not path.exists():
                raise ConfigurationError(f"Bridge {what} file {path} does not exist")
        # Read both now: a file the diagnosis could not read is refused here, by `keel
        # bridge ingest` and `keel serve --check`, not at the first diagnosis.
        JsonIncidents(incidents).all()
        FileDeploys(deploys).all()
        source = OtlpJsonTraces(traces)
        files = source.files()
        index = TraceIndex(index_path)
        current = _index_fingerprint(index)
        report: IngestReport | None = None
        if current != fingerprint(files):
            log(f"indexing {len(files)} trace files into {index_path} …")
            # OtlpJsonTraces reads with read_spans, build_index's default: the reader its
            # worker processes run (settings.ingest_processes of them).
            report = build_index(
                files, index_path, progress=progress, processes=settings.ingest_processes
            )
            dropped = f"; {report.duplicates:,} duplicate spans dropped" * bool(report.duplicates)
            log(
                f"indexed {report.spans:,} spans in {report.seconds:.1f}s "
                f"({report.spans_per_second:,.0f} spans/s, {report.mib_per_second:.1f} MiB/s)"
                f"{dropped}"
            )
        spans = int(index.meta().get("spans", "0"))
    return BridgePaths(
        settings.data_dir,
        incidents,
        deploys,
        traces,
        index_path,
        generated,
        report,
        spans,
        len(files),
    )


def _index_fingerprint(index: TraceIndex) -> object:
    if not index.path.exists():
        return None
    try:
        meta = index.meta()
    except Exception:  # an unreadable index is rebuilt, whatever is wrong with it
        return None
    if meta.get("format") != INDEX_FORMAT:
        return None
    return json.loads(meta.get("fingerprint", "null"))


class Bridge:
    """The Bridge's data: incidents, deploys and the trace index, behind their protocols."""

    def __init__(self, paths: BridgePaths) -> None:
        self.paths = paths
        self.incidents = JsonIncidents(paths.incidents)
        self.deploys = FileDeploys(paths.deploys)
        self.index = TraceIndex(paths.index)
        self._services: tuple[float, list[str]] | None = None

    def services(self) -> list[str]:
        """The services that have spans in the index (cached for a few seconds)."""
        now = time.monotonic()
        if self._services is None or now - self._services[0] > 5.0:
            self._services = (now, self.index.services())
        return self._services[1]


_OPEN: dict[BridgeSettings, Bridge] = {}


def open_bridge(settings: BridgeSettings, *, log: Log | None = None) -> Bridge:
    """The :class:`Bridge` for ``settings``, prepared once per process (see :func:`prepare`)."""
    bridge = _OPEN.get(settings)
    if bridge is None:
        paths = prepare(settings, log=log or (lambda _line: None))
        bridge = _OPEN.setdefault(settings, Bridge(paths))
    if not bridge.paths.index.exists():
        raise BridgeError(f"the trace index {bridge.paths.index} is missing")
    return bridge
