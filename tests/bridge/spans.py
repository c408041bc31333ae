"""Hand-built span rows for the evidence tests: ``Spans().span(...)`` returns the new row
(as the index stores it: trace, span id, parent id, service, kind, peer, start and end
in ns, error)."""

from __future__ import annotations

from keel.bridge.evidence import ScopedSpan

MS = 1_000_000  # ns


class Spans:
    def __init__(self) -> None:
        self.rows: list[ScopedSpan] = []

    def span(
        self,
        trace: str,
        parent: ScopedSpan | None,
        service: str,
        start: int,
        ms: float,
        *,
        kind: int = 2,
        peer: str | None = None,
        error: bool = False,
    ) -> ScopedSpan:
        row: ScopedSpan = (
            trace,
            f"{len(self.rows) + 1:016x}",
            None if parent is None else parent[1],
            service,
            kind,
            peer,
            start,
            start + int(ms * MS),
            int(error),
        )
        self.rows.append(row)
        return row
