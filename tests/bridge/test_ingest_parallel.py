"""The parallel ingest (``keel.bridge.parallel``): worker processes read the files, in byte
ranges of the large ones, and the index is the one a single process builds, duplicates
and odd request shapes included; a worker that dies or fails stops the ingest with one
typed error, and the index is left as it was."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from keel.bridge.errors import IngestWorkerFailed, MalformedSource
from keel.bridge.index import build_index
from keel.bridge.parallel import plan
from keel.bridge.settings import BridgeSettings
from keel.errors import ConfigurationError

from .test_ingest_paths import export, table_digest

T = TypeVar("T")
RANGE = 1 << 16  # bytes: small ranges, so that every file here is read in several


def write_lines(path: Path, requests: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in requests))
    return path


def an_export(folder: Path) -> list[Path]:
    """JSON lines (fast and general path requests, blank lines, CRLF), a file exported
    twice (duplicates across files and ranges), a pretty-printed file (not JSON lines:
    read whole after its ranges are refused), JSON lines ending with a pretty-printed
    request (its first ranges stored, then taken back), and an empty file."""
    requests = export(random.Random(19), requests=60)
    lines = write_lines(folder / "a.jsonl", requests[:30])
    again = folder / "b.jsonl"
    again.write_bytes(lines.read_bytes())
    crlf = folder / "c.jsonl"
    crlf.write_text(
        "\n".join(json.dumps(r) for r in requests[30:40]).replace("\n", "\r\n\r\n"), newline=""
    )
    pretty = folder / "d.json"
    pretty.write_text("\n".join(json.dumps(r, indent=1) for r in requests[40:50]))
    mixed = write_lines(folder / "e.jsonl", requests[:30])
    with mixed.open("a") as file:
        file.write(json.dumps(requests[50], indent=1))
    empty = folder / "f.jsonl"
    empty.write_text("")
    return [lines, again, crlf, pretty, mixed, empty]


def test_parallel_ingest_builds_the_single_process_index(tmp_path: Path) -> None:
    """Every file split in ranges, read by 2 and 3 worker processes: the same rows, the
    same aggregates, the same duplicates dropped as with one process."""
    files = an_export(tmp_path)
    tasks = plan(files, tmp_path, RANGE)
    assert len(tasks) > 3 * len(files)  # ranges of every non-empty file
    single = build_index(files, tmp_path / "single.db", processes=1)
    assert single.duplicates == 2 * 30 * 2 * 30  # b and e repeat a
    for processes in (2, 3):
        dest = tmp_path / f"parallel-{processes}.db"
        report = build_index(files, dest, processes=processes, range_bytes=RANGE)
        assert (report.spans, report.duplicates) == (single.spans, single.duplicates)
        assert table_digest(dest) == table_digest(tmp_path / "single.db")
        assert _rest(dest) == _rest(tmp_path / "single.db")
    assert not list(tmp_path.glob("*.building-*"))  # no part file or folder left


def _rest(db: Path) -> list[object]:
    """Every other table: peer names, sources (spans per file), meta."""
    conn = sqlite3.connect(db)
    try:
        return [
            conn.execute("SELECT * FROM peer_names ORDER BY aka, peer").fetchall(),
            conn.execute("SELECT path, spans FROM sources ORDER BY path").fetchall(),
            conn.execute("SELECT * FROM meta WHERE key <> 'fingerprint' ORDER BY key").fetchall(),
        ]
    finally:
        conn.close()


def test_a_malformed_file_is_the_same_error_and_the_index_stays(tmp_path: Path) -> None:
    """A bad line in the middle of a large JSON-lines file: the error a single process
    raises (file and line), and the previous index untouched."""
    requests = export(random.Random(7), requests=40)
    bad = tmp_path / "bad.jsonl"
    text = [json.dumps(r) for r in requests]
    text[25] = text[25][:-40]  # a line cut short
    bad.write_text("\n".join(text) + "\n")
    good = write_lines(tmp_path / "good.jsonl", requests)
    dest = tmp_path / "index.db"
    build_index([good], dest, processes=1)
    before = dest.read_bytes()
    with pytest.raises(MalformedSource) as single:
        build_index([good, bad], tmp_path / "other.db", processes=1)
    with pytest.raises(MalformedSource) as parallel:
        build_index([good, bad], dest, processes=2, range_bytes=RANGE)
    assert str(parallel.value) == str(single.value)
    assert parallel.value.line is not None
    assert dest.read_bytes() == before
    assert not list(tmp_path.glob("*.building-*"))


def test_a_worker_that_dies_stops_the_ingest_with_one_typed_error(tmp_path: Path) -> None:
    """A worker process killed with SIGKILL mid-ingest (a real one, found among this
    process's children): IngestWorkerFailed naming it (the ingest does not wait on);
    no index, no files left, no worker left running."""
    files = [write_lines(tmp_path / f"{n}.jsonl", export(random.Random(n), 40)) for n in range(6)]
    dest = tmp_path / "index.db"
    killed: list[int] = []

    def kill_a_worker(line: str) -> None:  # called by the ingest after the first file
        if not killed:
            worker = _descendants(os.getpid())[0]
            os.kill(worker, signal.SIGKILL)
            killed.append(worker)

    with pytest.raises(IngestWorkerFailed, match=r"worker process \d+ was killed by SIGKILL"):
        build_index(files, dest, processes=2, range_bytes=RANGE, log=kill_a_worker)
    assert killed
    assert not dest.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f.name for f in files)
    assert _descendants(os.getpid()) == []  # every worker reaped


def test_a_worker_that_fails_stops_the_ingest_with_one_typed_error(tmp_path: Path) -> None:
    """A worker that cannot write its part file (a folder is in its place) fails: the
    ingest stops with IngestWorkerFailed carrying what the worker raised, and leaves
    nothing behind."""
    files = [write_lines(tmp_path / f"{n}.jsonl", export(random.Random(n), 20)) for n in range(3)]
    dest = tmp_path / "index.db"
    (tmp_path / f"index.db.building-{os.getpid()}.parts" / "0-0.db").mkdir(parents=True)
    failed = r"failed reading .*0\.jsonl: .*unable to open"
    with pytest.raises(IngestWorkerFailed, match=failed) as e:
        build_index(files, dest, processes=2, range_bytes=RANGE)
    assert "\n" not in str(e.value)  # one line (the CLI prints it as is)
    assert "Traceback" in (e.value.detail or "")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f.name for f in files)
    assert _descendants(os.getpid()) == []


UNGUARDED = """
import sys
from pathlib import Path
from keel.bridge.index import build_index

# No `if __name__ == "__main__":` guard: a worker that imported this module again would
# run the ingest again (or fail).
folder = Path(sys.argv[1])
files = sorted(folder.glob("*.jsonl"))
report = build_index(files, folder / "index.db", processes=2, range_bytes=1 << 16)
print("spans", report.spans)
"""


def test_works_from_an_unguarded_main(tmp_path: Path) -> None:
    """A script with no ``__main__`` guard that ingests with worker processes runs once
    and builds the index."""
    for n in range(3):
        write_lines(tmp_path / f"{n}.jsonl", export(random.Random(n), 20))
    script = tmp_path / "ingest_script.py"
    script.write_text(textwrap.dedent(UNGUARDED))
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["spans 3600"]


def test_the_number_of_processes_is_a_setting() -> None:
    """``$KEEL_BRIDGE_INGEST_PROCESSES`` and ``ingest_processes``; 0 or a word is refused."""
    assert BridgeSettings.from_env({}).ingest_processes is None
    assert BridgeSettings.from_env({"KEEL_BRIDGE_INGEST_PROCESSES": "3"}).ingest_processes == 3
    for bad in ("0", "two"):
        with pytest.raises(ConfigurationError, match="processes"):
            BridgeSettings.from_env({"KEEL_BRIDGE_INGEST_PROCESSES": bad})
    with pytest.raises(ConfigurationError):
        BridgeSettings(ingest_processes=0)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_signal_stops_keel_bridge_ingest_and_its_workers(tmp_path: Path, signum: int) -> None:
    """``keel bridge ingest`` (a real process) stopped by SIGTERM or Ctrl-C's SIGINT while
    its workers read: it exits promptly, its workers are gone, and it leaves no index and
    no half-built file. Killed outright (SIGKILL), it leaves its half-built file, but its
    workers exit on their own (their task pipe closes), no index appears, and the next
    ingest removes what it left."""
    traces = tmp_path / "traces"
    traces.mkdir()
    block = "".join(json.dumps(r) + "\n" for r in export(random.Random(3), 40)).encode()
    for n in range(4):  # ~100 MB: seconds of work for two processes
        (traces / f"{n}.jsonl").write_bytes(block * 18)
    for name in ("incidents.json", "deploys.json"):
        (tmp_path / name).write_text("[]")
    data = tmp_path / "data"
    command = [sys.executable, "-m", "keel", "bridge", "ingest", "--data-dir", str(data)]
    command += ["--incidents", str(tmp_path / "incidents.json"), "--traces", str(traces)]
    command += ["--deploys", str(tmp_path / "deploys.json"), "--processes", "2"]
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as cli:
        try:
            workers = _poll(lambda: _descendants(cli.pid), timeout=60)
            cli.send_signal(signum)
            _, err = cli.communicate(timeout=30)
        finally:
            cli.kill()
    assert cli.returncode != 0
    assert b"Traceback" not in err
    _poll(lambda: not any(_running(pid) for pid in workers), timeout=30)
    assert not (data / "index.db").exists()
    if signum != signal.SIGKILL:
        assert sorted(p.name for p in data.iterdir()) == [".lock"]
        return
    assert any(p.name.startswith("index.db.building-") for p in data.iterdir())
    build_index([], data / "index.db")  # the next ingest removes what the killed one left
    assert sorted(p.name for p in data.iterdir()) == [".lock", "index.db"]


def _running(pid: int) -> bool:
    """Whether a process is there and not a zombie (an orphan's reaper may be slow)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _descendants(pid: int) -> list[int]:
    try:
        found = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(child) for child in f.read().split()]
        return found
    except OSError:
        return []


def _poll(condition: Callable[[], T], *, timeout: float) -> T:
    """``condition()`` once it is true (polled; fails after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
    return value


def test_ranges_are_cut_after_line_ends_and_cover_the_file(tmp_path: Path) -> None:
    """Each range starts just after a newline; together they cover the file; a line
    longer than a request read on its own line may be (16 M characters) ends the cutting:
    the rest is one range, not scanned to its end."""
    path = tmp_path / "x.jsonl"
    short = b'{"resourceSpans": []}\n' * 20_000
    path.write_bytes(short + b"{" + b" " * (17 << 20) + b"}\n" + short)
    data = path.read_bytes()
    tasks = plan([path], tmp_path, 1 << 16)
    assert tasks[0].start == 0
    assert all(data[t.start - 1 : t.start] == b"\n" for t in tasks[1:])
    assert [t.end for t in tasks[:-1]] == [t.start for t in tasks[1:]]
    assert tasks[-1].end == len(data)
    assert tasks[-1].start < len(short) < tasks[-1].end  # the long line ended the cutting
    assert all(t.lines for t in tasks)
