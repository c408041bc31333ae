"""``keel bridge …``: the Incident Bridge's data — sample data, ingest, an offline diagnosis."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import click

from keel.cli.common import FilePath, KeelCliError

__all__ = ["bridge"]

_DATA_HELP = "The Bridge's data directory (index, sample data). Default $KEEL_BRIDGE_DATA, "
_DATA_HELP += "then keel-data/bridge."


@click.group(short_help="Incident Bridge data: sample data, ingest, diagnose.")
def bridge() -> None:
    """The Incident Bridge's data: generate sample data, index trace exports, and run a
    diagnosis offline (no server, no task store)."""


@bridge.command("sample-data", short_help="Write a sample dataset with known root causes.")
@click.argument("directory", type=FilePath(file_okay=False, path_type=Path))
@click.option("--seed", default=7, show_default=True, type=int, help="Same seed, same data.")
@click.option(
    "--incidents",
    "count",
    default=12,
    show_default=True,
    type=click.IntRange(0, 60),  # keel.bridge.generate.MAX_INCIDENTS, not imported for it
    help="Injected incidents (besides the seed's INC-2026-0142).",
)
@click.option(
    "--rate",
    default=30.0,
    show_default=True,
    type=click.FloatRange(1, 100_000),
    help="Requests per minute (about 8.6 spans each).",
)
def sample_data(directory: Path, seed: int, count: int, rate: float) -> None:
    """Write incidents, deploys, OTLP/JSON traces and ground-truth.json into DIRECTORY."""
    from keel.bridge.generate import generate

    try:
        generate(directory, seed=seed, incidents=count, rate=rate, log=click.echo)
    except OSError as exc:  # the directory cannot be made or written: name it and why
        raise KeelCliError(f"cannot write sample data to {directory}: {exc.strerror}") from exc


def _settings(
    data_dir: Path | None,
    incidents: Path | None,
    traces: tuple[Path, ...],
    deploys: Path | None,
    pace: str = "fast",
    *,
    processes: int | None = None,
) -> object:
    from keel.bridge.settings import BridgeSettings

    base = BridgeSettings.from_env()
    return BridgeSettings(
        data_dir=data_dir or base.data_dir,
        incidents=incidents,
        traces=list(traces) or None,
        deploys=deploys,
        pace=pace,
        ingest_processes=processes or base.ingest_processes,
    )


_source_options = [
    click.option("--data-dir", type=FilePath(file_okay=False, path_type=Path), help=_DATA_HELP),
    click.option(
        "--incidents", type=FilePath(dir_okay=False, path_type=Path), help="Incidents JSON."
    ),
    click.option(
        "--traces",
        multiple=True,
        type=FilePath(path_type=Path),
        help="OTLP/JSON file or folder (repeatable).",
    ),
    click.option(
        "--deploys", type=FilePath(dir_okay=False, path_type=Path), help="Deploys JSON or CSV."
    ),
]


def _sources(fn: click.decorators.FC) -> click.decorators.FC:
    for option in reversed(_source_options):
        fn = option(fn)
    return fn


@bridge.command(short_help="Index the trace files (only if they changed).")
@_sources
@click.option(
    "--processes",
    type=click.IntRange(min=1),
    default=None,
    help="Processes reading the trace files [default: $KEEL_BRIDGE_INGEST_PROCESSES, "
    "else the CPUs this process may use; 1: no worker processes].",
)
def ingest(
    data_dir: Path | None,
    incidents: Path | None,
    traces: tuple[Path, ...],
    deploys: Path | None,
    processes: int | None,
) -> None:
    """Bring the trace index up to date with the sources (sample data if there are none).

    A malformed trace file is reported with its name and line, and the index stays as it
    was. The files are read by one process per CPU (``--processes``); Ctrl-C or SIGTERM
    stops them all and leaves the index as it was.
    """
    from keel.bridge.core import prepare
    from keel.bridge.settings import BridgeSettings

    settings = _settings(data_dir, incidents, traces, deploys, processes=processes)
    assert isinstance(settings, BridgeSettings)
    # SIGTERM ends the command as Ctrl-C does, through its cleanup: the worker processes
    # are stopped and the half-built index file is removed.
    signal.signal(signal.SIGTERM, _terminated)
    with _IngestBar() as bar:
        paths = prepare(settings, log=bar.log, progress=bar if bar.live else None)
    click.echo(paths.describe())


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


class _IngestBar:
    """A progress bar of an ingest on a terminal (bytes, spans, rate); plain lines else."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

        self.console = Console(stderr=True)
        self.live = self.console.is_terminal
        self.bar = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            "{task.fields[spans]:>12,} spans",
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
            disable=not self.live,
        )
        self.task = self.bar.add_task("indexing traces", total=None, spans=0, start=False)

    def __enter__(self) -> _IngestBar:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.__exit__(None, None, None)

    def log(self, line: str) -> None:
        if self.live:
            self.bar.console.print(line, highlight=False, markup=False)
        else:
            click.echo(line)

    def start(self, total_bytes: int) -> None:
        self.bar.update(self.task, total=total_bytes)
        self.bar.start_task(self.task)

    def advance(self, bytes_done: int, spans_read: int) -> None:
        self.bar.update(self.task, completed=bytes_done, spans=spans_read)


@bridge.command(short_help="Diagnose an incident offline and print the cited conclusion.")
@click.argument("incident_id")
@click.option("--service", default=None, help="The affected service, if the incident names none.")
@click.option("--json", "as_json", is_flag=True, help="Print the structured result.")
@_sources
def diagnose(  # noqa: PLR0917 - click passes every option as an argument
    incident_id: str,
    service: str | None,
    as_json: bool,
    data_dir: Path | None,
    incidents: Path | None,
    traces: tuple[Path, ...],
    deploys: Path | None,
) -> None:
    """Run the diagnosis phases directly (no task store, no pace): for trying data out."""
    from keel.bridge.core import open_bridge
    from keel.bridge.diagnosis import render, run_diagnosis
    from keel.bridge.errors import BridgeError
    from keel.bridge.settings import BridgeSettings

    settings = _settings(data_dir, incidents, traces, deploys)
    assert isinstance(settings, BridgeSettings)
    bridge_data = open_bridge(settings, log=click.echo)
    try:
        result = run_diagnosis(bridge_data, incident_id, service)
    except ValueError as exc:
        if isinstance(exc, BridgeError):
            raise
        raise click.UsageError(f"{exc} (--service)") from exc
    click.echo(json.dumps(result, indent=2) if as_json else render(result))
