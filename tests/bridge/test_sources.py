"""The data sources: OTLP/JSON in both layouts, malformed files refused with the file and
line and the index left as it was, incidents and deploys (JSON and CSV)."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from keel.bridge.core import prepare
from keel.bridge.errors import MalformedSource, UnknownIncident
from keel.bridge.index import TraceIndex, build_index
from keel.bridge.otlp import read_spans
from keel.bridge.settings import BridgeSettings
from keel.bridge.sources import FileDeploys, JsonIncidents

from .conftest import tree_bytes, truth_of

TRACE = "5b8efff798038103d269b633813fc60c"


def request(service: str, *spans: dict[str, Any]) -> dict[str, Any]:
    return {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": service}}]
                },
                "scopeSpans": [{"scope": {"name": "test"}, "spans": list(spans)}],
            }
        ]
    }


def span(
    span_id: str, parent: str | None = None, *, error: bool = False, **extra: Any
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "traceId": TRACE,
        "spanId": span_id,
        "name": f"op-{span_id[:4]}",
        "startTimeUnixNano": "1773481200000000000",
        "endTimeUnixNano": "1773481200250000000",
        "status": {"code": 2} if error else {},
        **extra,
    }
    if parent:
        out["parentSpanId"] = parent
    return out


def rows(path: Path, **kw: Any) -> list[tuple[Any, ...]]:
    return [row for batch in read_spans(path, **kw) for row in batch]


def test_json_lines_and_one_pretty_object_read_the_same(tmp_path: Path) -> None:
    """A collector file (one request per line) and one pretty-printed request give the
    same spans; a request too big to decode whole is walked span by span, same result;
    base64 ids (protobuf's generic JSON mapping) are read as hex."""
    first = request(
        "checkout", span("eee19b7ec3c1b174"), span("eee19b7ec3c1b175", "eee19b7ec3c1b174")
    )
    b64 = base64.b64encode(bytes.fromhex("eee19b7ec3c1b176")).decode()
    second = request("payments", span(b64, "eee19b7ec3c1b175", error=True))
    lines = tmp_path / "export.jsonl"
    lines.write_text(json.dumps(first) + "\n" + json.dumps(second) + "\n")
    merged = request("checkout", *first["resourceSpans"][0]["scopeSpans"][0]["spans"])
    merged["resourceSpans"] += second["resourceSpans"]
    pretty = tmp_path / "export.json"
    pretty.write_text(json.dumps(merged, indent=2))

    expected = rows(lines)
    assert [r[:4] + r[7:] for r in expected] == [
        (TRACE, "eee19b7ec3c1b174", None, "checkout", 0, 0, None, None),
        (TRACE, "eee19b7ec3c1b175", "eee19b7ec3c1b174", "checkout", 0, 0, None, None),
        (TRACE, "eee19b7ec3c1b176", "eee19b7ec3c1b175", "payments", 1, 0, None, None),
    ]
    assert rows(pretty) == expected
    assert rows(pretty, whole_limit=64) == expected  # walked, never decoded whole


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        (
            '{"resourceSpans": [\n  {"resource": {}, "scopeSpans": [\n  oops ]}]}',
            3,
            "not valid JSON",
        ),
        (json.dumps(request("a", span("eee19b7ec3c1b174"))) + "\n[1, 2]\n", 2, "expected an OTLP"),
        (
            json.dumps(request("a", span("eee19b7ec3c1b174")))
            + "\n"
            + json.dumps(request("a", span("xyz")))
            + "\n",
            2,
            "spanId 'xyz' is not a 8-byte id",
        ),
        (json.dumps(request("a", span("eee19b7ec3c1b174", endTimeUnixNano="1"))), 1, "ends before"),
    ],
)
@pytest.mark.parametrize("whole_limit", [1 << 24, 16], ids=["decoded", "walked"])
def test_malformed_trace_file_names_file_and_line(
    tmp_path: Path, text: str, line: int, reason: str, whole_limit: int
) -> None:
    """Bad JSON, a non-request, a bad id, a span ending before it starts: each refused
    naming the file, the line and what is wrong, whether decoded whole or walked."""
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(MalformedSource) as info:
        rows(path, whole_limit=whole_limit)
    assert info.value.path == path
    assert info.value.line == line
    assert reason in str(info.value)
    assert f"{path}:{line}" in str(info.value)


@pytest.mark.slow
def test_a_malformed_file_leaves_the_index_as_it_was(dataset: Any, tmp_path: Path) -> None:
    """Ingesting a folder with one malformed file fails naming it, and the existing
    index (and the data folder) are byte for byte what they were: nothing half-written."""
    source = dataset(7).data_dir
    data = tmp_path / "data"
    traces = data / "traces"
    traces.mkdir(parents=True)
    for name in ("incidents.json", "deploys.json"):
        (data / name).write_bytes((source / name).read_bytes())
    for path in sorted((source / "traces").iterdir())[:2]:
        (traces / path.name).write_bytes(path.read_bytes())
    settings = BridgeSettings(data_dir=data, pace="fast")
    first = prepare(settings, log=lambda _l: None)
    assert first.ingested is not None
    assert first.spans > 0
    before = tree_bytes(data)

    bad = traces / "traces-99.jsonl"
    bad.write_text(json.dumps(request("a", span("eee19b7ec3c1b174"))) + "\n{not json\n")
    with pytest.raises(MalformedSource, match=r"traces-99\.jsonl:2: not valid JSON"):
        prepare(settings, log=lambda _l: None)
    bad.unlink()
    assert tree_bytes(data) == before  # no temp file left, the index untouched
    assert TraceIndex(data / "index.db").meta()["spans"] == str(first.spans)

    again = prepare(settings, log=lambda _l: None)
    assert again.ingested is None  # up to date: nothing rebuilt


def test_index_ingest_is_a_no_op_when_up_to_date_and_rebuilds_on_change(tmp_path: Path) -> None:
    """The index records the files it was built from; a changed file rebuilds it."""
    traces = tmp_path / "t.jsonl"
    traces.write_text(json.dumps(request("a", span("eee19b7ec3c1b174"))) + "\n")
    report = build_index([traces], tmp_path / "index.db")
    assert report.spans == 1
    index = TraceIndex(tmp_path / "index.db")
    assert index.services() == ["a"]
    [found], total = index.search(trace_id=TRACE)
    assert total == 1
    assert found.span_id == "eee19b7ec3c1b174"


def test_incidents_and_deploys_from_json_and_csv(tmp_path: Path) -> None:
    """Incidents from JSON (service optional); deploys from CSV with a header; an
    unknown incident names the known ones; a bad record names file and what is wrong."""
    incidents = tmp_path / "incidents.json"
    incidents.write_text(
        json.dumps(
            [
                {
                    "id": "INC-1",
                    "title": "t",
                    "severity": "SEV2",
                    "opened_at": "2026-03-14T09:44:00Z",
                    "symptoms": ["slow"],
                    "service": "checkout",
                },
                {"id": "INC-2", "title": "u", "opened_at": "2026-03-14T10:00:00+01:00"},
            ]
        )
    )
    source = JsonIncidents(incidents)
    assert source.get("INC-1").service == "checkout"
    assert source.get("INC-2").service is None
    assert [i.id for i in source.all()] == ["INC-2", "INC-1"]  # 09:00Z before 09:44Z
    with pytest.raises(
        UnknownIncident, match="unknown incident: 'INC-3'; known incidents: INC-2, INC-1"
    ):
        source.get("INC-3")

    csv = tmp_path / "deploys.csv"
    csv.write_text(
        "id,service,version,commit,author,deployed_at,summary,kind\n"
        "d-1,payments,2.0.1,abc123,ana,2026-03-14T09:41:00Z,lower timeout,config\n"
        "d-2,checkout,1.1.0,def456,bo,2026-03-14T09:30:00Z,release,\n"
    )
    deploys = FileDeploys(csv).all()
    assert [(d.id, d.kind) for d in deploys] == [("d-2", "code"), ("d-1", "config")]

    csv.write_text("id,service,deployed_at,summary\nd-1,payments,next tuesday,x\n")
    with pytest.raises(MalformedSource, match=r"deploys\.csv:2: deployed_at is not an ISO 8601"):
        FileDeploys(csv).all()
    incidents.write_text(json.dumps([{"id": "INC-1", "title": "t"}]))
    with pytest.raises(MalformedSource, match=r"incident #1 \(INC-1\): opened_at must be"):
        JsonIncidents(incidents).all()


def test_a_byte_order_mark_and_crlf_are_read_everywhere(tmp_path: Path) -> None:
    """What a spreadsheet exports as "CSV UTF-8" (a BOM, CRLF line ends) reads as plain
    CSV; incidents JSON and OTLP files with a BOM read as without one."""
    csv = tmp_path / "deploys.csv"
    csv.write_bytes(
        b"\xef\xbb\xbfid,service,deployed_at,summary\r\n"
        b"d-1,payments,2026-03-14T09:41:00Z,lower timeout\r\n"
    )
    [deploy] = FileDeploys(csv).all()
    assert (deploy.id, deploy.service, deploy.summary) == ("d-1", "payments", "lower timeout")
    incidents = tmp_path / "incidents.json"
    record = {"id": "INC-1", "title": "t", "opened_at": "2026-03-14T09:44:00Z"}
    incidents.write_bytes(b"\xef\xbb\xbf" + json.dumps([record]).encode() + b"\r\n")
    assert [i.id for i in JsonIncidents(incidents).all()] == ["INC-1"]
    traces = tmp_path / "t.jsonl"
    line = json.dumps(request("a", span("eee19b7ec3c1b174"))).encode()
    traces.write_bytes(b"\xef\xbb\xbf" + line + b"\r\n" + line.replace(b"eee1", b"fff1") + b"\r\n")
    assert [r[1] for r in rows(traces)] == ["eee19b7ec3c1b174", "fff19b7ec3c1b174"]


@pytest.mark.slow
def test_ingest_refuses_deploys_and_incidents_the_diagnosis_could_not_read(
    dataset: Any, tmp_path: Path
) -> None:
    """prepare (keel bridge ingest, keel serve --check) reads the incidents and deploys
    too: a broken file is refused there, naming it, not at the first diagnosis."""
    data = tmp_path / "copy"
    shutil.copytree(dataset(7).data_dir, data)
    settings = BridgeSettings(data_dir=data)
    (data / "deploys.json").write_text('[{"id": "d-1", "service": "a"}]')
    with pytest.raises(MalformedSource, match=r"deploys\.json: deploy #1: .* is missing"):
        prepare(settings, log=lambda _line: None)
    (data / "deploys.json").write_text("[]")
    (data / "incidents.json").write_text("{not json")
    with pytest.raises(MalformedSource, match=r"incidents\.json"):
        prepare(settings, log=lambda _line: None)


class Recorder:
    """A Progress that keeps what it was told."""

    def __init__(self) -> None:
        self.total = -1
        self.seen: list[tuple[int, int]] = []

    def start(self, total_bytes: int) -> None:
        self.total = total_bytes

    def advance(self, bytes_done: int, spans_read: int) -> None:
        self.seen.append((bytes_done, spans_read))


def test_duplicate_spans_are_stored_once_and_progress_is_reported(tmp_path: Path) -> None:
    """The same export ingested twice (same trace and span ids) counts once: spans,
    errors and per-minute aggregates as from one copy. Progress starts with the total
    size and ends at it, with every span read."""
    one = tmp_path / "one.jsonl"
    spans = [span("eee19b7ec3c1b174"), span("aaa19b7ec3c1b174", "eee19b7ec3c1b174", error=True)]
    one.write_text(json.dumps(request("a", *spans)) + "\n")
    single = build_index([one], tmp_path / "single.db")
    twice = tmp_path / "again.jsonl"
    shutil.copy(one, twice)
    recorder = Recorder()
    double = build_index([one, twice], tmp_path / "double.db", progress=recorder)
    assert (single.spans, single.duplicates) == (2, 0)
    assert (double.spans, double.duplicates) == (2, 2)
    first, second = TraceIndex(tmp_path / "single.db"), TraceIndex(tmp_path / "double.db")
    assert second.search(trace_id=TRACE)[1] == 2
    assert second.minutes("a", 0, 2**62) == first.minutes("a", 0, 2**62)
    assert second.meta()["spans"] == "2"
    size = one.stat().st_size * 2
    assert recorder.total == size
    assert recorder.seen[-1] == (size, 4)
    assert recorder.seen == sorted(recorder.seen)


def test_progress_moves_within_a_large_file(tmp_path: Path) -> None:
    """One export of several MiB (a chunk is 1 MiB): the bytes reported grow while the
    file is read, not only when it is finished, and never pass its size."""
    big = tmp_path / "big.jsonl"
    with big.open("w") as out:
        for i in range(9000):
            out.write(json.dumps(request("a", span(f"{i + 1:016x}", name="x" * 200))) + "\n")
    size = big.stat().st_size
    assert size > 2 << 20
    recorder = Recorder()
    report = build_index([big], tmp_path / "index.db", progress=recorder, batch_size=500)
    assert report.spans == 9000
    within = [done for done, _ in recorder.seen if 0 < done < size]
    assert within, recorder.seen  # moved before the file was finished
    assert recorder.seen == sorted(recorder.seen)
    assert recorder.seen[-1] == (size, 9000)


def attribute(key: str, value: str) -> dict[str, Any]:
    return {"key": key, "value": {"stringValue": value}}


def test_span_kinds_and_the_callee_of_client_spans_are_read(tmp_path: Path) -> None:
    """kind as a number or OTLP's enum name; a client or producer span's callee from the
    most specific attribute it has (peer.service, then the database, the destination, the
    host); other spans have none."""
    traces = tmp_path / "t.jsonl"
    spans = [
        span("aaa19b7ec3c1b174", kind=2, attributes=[attribute("peer.service", "x")]),
        span(
            "bbb19b7ec3c1b174",
            kind="SPAN_KIND_CLIENT",
            attributes=[
                attribute("server.address", "db-1.internal"),
                attribute("db.name", "orders"),
            ],
        ),
        span("ccc19b7ec3c1b174", kind=4, attributes=[attribute("messaging.destination.name", "q")]),
        span("ddd19b7ec3c1b174", kind=3, attributes=[attribute("server.address", "api.example")]),
        span("eee19b7ec3c1b174", kind=3),
    ]
    traces.write_text(json.dumps(request("a", *spans)) + "\n")
    assert [(r[8], r[9]) for r in rows(traces)] == [
        (2, None),
        (3, "orders"),
        (4, "q"),
        (3, "api.example"),
        (3, None),
    ]
    build_index([traces], tmp_path / "index.db")
    found, _ = TraceIndex(tmp_path / "index.db").search(service="a")
    assert [(s.to_json()["kind"], s.to_json().get("peer")) for s in found][:2] == [
        ("server", None),
        ("client", "orders"),
    ]
    # A service's own minutes count its server (and unspecified) spans only.
    assert [m[1] for m in TraceIndex(tmp_path / "index.db").minutes("a", 0, 2**62)] == [1]


@pytest.mark.slow
def test_a_deploy_csv_with_a_bom_lists_and_diagnoses_as_its_json(
    dataset: Any, tmp_path: Path
) -> None:
    """The deploys as a spreadsheet exports them ("CSV UTF-8": a byte-order mark, CRLF
    line ends) pass ingest, are listed by ``list_deploys`` and give every diagnosis the
    same answer as the same deploys as JSON."""
    from keel.bridge.core import open_bridge
    from keel.bridge.diagnosis import run_diagnosis
    from keel.bridge.tools import BridgeTools

    settings = dataset(7)
    data = tmp_path / "copy"
    shutil.copytree(settings.data_dir, data)
    records = json.loads((data / "deploys.json").read_text())
    fields = ["id", "service", "version", "commit", "author", "deployed_at", "summary", "kind"]
    lines = [",".join(fields)] + [
        ",".join(str(record.get(f) or "") for f in fields) for record in records
    ]
    assert not any('"' in line or line.count(",") != len(fields) - 1 for line in lines)
    (data / "deploys.csv").write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode() + b"\r\n")
    (data / "deploys.json").unlink()
    with_csv = BridgeSettings(data_dir=data, deploys=data / "deploys.csv", pace="fast")
    prepare(with_csv, log=lambda _line: None)
    listed = BridgeTools(open_bridge(with_csv)).list_deploys(limit=1000)["deploys"]
    assert sorted(d["id"] for d in listed) == sorted(r["id"] for r in records)
    for truth in truth_of(settings):
        incident, service = truth["incident_id"], truth["symptom_service"]
        by_json = run_diagnosis(open_bridge(settings), incident, service)
        by_csv = run_diagnosis(open_bridge(with_csv), incident, service)
        assert by_csv["root_cause"] == by_json["root_cause"], incident
        assert by_csv["confidence"] == by_json["confidence"], incident
        assert by_csv["root_cause"] is not None, incident


def _ingest_cli(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``keel bridge ingest`` (a real process) of a folder of 20 exports, 500 spans each."""
    folder = tmp_path / "traces"
    folder.mkdir(exist_ok=True)
    for f in range(20):
        spans = [span(f"{f * 1000 + i + 1:016x}") for i in range(500)]
        (folder / f"part-{f:02d}.jsonl").write_text(json.dumps(request("a", *spans)) + "\n")
    record = {"id": "INC-1", "title": "t", "opened_at": "2026-03-14T09:44:00Z"}
    (tmp_path / "incidents.json").write_text(json.dumps([record]))
    (tmp_path / "deploys.json").write_text("[]")
    sources = ["--incidents", str(tmp_path / "incidents.json"), "--traces", str(folder)]
    sources += ["--deploys", str(tmp_path / "deploys.json")]
    index = tmp_path / f"index-{'FORCE_COLOR' in env}"
    return subprocess.run(
        [sys.executable, "-m", "keel", "bridge", "ingest", "--data-dir", str(index), *sources],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )


@pytest.mark.slow
def test_ingest_shows_a_progress_bar_on_a_terminal_and_plain_lines_else(
    tmp_path: Path,
) -> None:
    """On a terminal (rich told so by FORCE_COLOR) ``keel bridge ingest`` draws a bar
    that counts bytes and spans up to every span; piped, it prints plain lines only (no
    escape codes). Both end with the same summary."""
    env = {k: v for k, v in os.environ.items() if k not in {"FORCE_COLOR", "TTY_COMPATIBLE"}}
    piped = _ingest_cli(tmp_path, env)
    terminal = _ingest_cli(
        tmp_path, {**env, "FORCE_COLOR": "1", "TTY_COMPATIBLE": "1", "COLUMNS": "120"}
    )
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal.stderr).replace("\r", "\n")
    assert "indexing traces" in drawn
    assert "10,000 spans" in drawn
    assert "\x1b[" not in piped.stdout + piped.stderr
    assert "indexing 20 trace files" in piped.stdout
    for done in (piped, terminal):
        assert "10,000 spans" in done.stdout.splitlines()[-1]
