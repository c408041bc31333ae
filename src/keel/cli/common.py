"""What every ``keel`` command shares: the ``--store`` option, opening and closing the
store, warnings, and turning :class:`~keel.errors.KeelError` into exit code 1.

Output rule: results go to stdout, warnings and errors to stderr, so that
``keel tasks list --json | jq`` never sees a warning.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

import anyio
import click

from keel.cli.config import configured_store
from keel.errors import ConfigurationError
from keel.store import ENV_VAR, Location, Store, open_store, parse_location, resolve_location
from keel.store.locations import file_name_problem

__all__ = [
    "STORE_HELP",
    "YOUNG_COLLECTION",
    "CliState",
    "FilePath",
    "KeelCliError",
    "chosen_location",
    "data_dir_option",
    "log_format_option",
    "remember_store",
    "run_with_store",
    "settle_heap",
    "store_option",
    "store_option_helped",
    "store_timeout_option",
    "warn",
]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

STORE_HELP = (
    f"Store location: a file path, sqlite:///relative.db, sqlite:////absolute.db or "
    f"memory://. Default: ${ENV_VAR}, then keel-data/keel.db under the current directory."
)


class KeelCliError(click.ClickException):
    """An operational error: one line on stderr, ``keel: error: …``, exit code 1."""

    exit_code = 1

    def show(self, file: IO[Any] | None = None) -> None:
        # One line, whatever the message: a multi-line message would read as several errors.
        message = " ".join(self.format_message().split())
        click.echo(f"keel: error: {message}", file=file, err=file is None)


class FilePath(click.Path):
    """:class:`click.Path` that refuses, in one ``keel: error:`` line, what no system call
    takes as a file name (:func:`~keel.store.locations.file_name_problem`), rather than
    failing in the first ``open`` or ``stat``."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        problem = file_name_problem(value) if isinstance(value, str) else None
        if problem:
            raise ConfigurationError(f"{_hint(param, ctx)}: the file name {problem}")
        return super().convert(value, param, ctx)


def _hint(param: click.Parameter | None, ctx: click.Context | None) -> str:
    return (
        "the file name" if param is None else param.get_error_hint(ctx) if ctx else str(param.name)
    )


@dataclass
class CliState:
    """Options given before the subcommand (``keel --store URL tasks list``)."""

    store: str | None = None


def warn(message: str) -> None:
    """A one-line warning on stderr."""
    click.echo(f"keel: warning: {message}", err=True)


def remember_store(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    """A ``--store`` callback: keep the value where :func:`chosen_location` looks."""
    if value is not None:
        ctx.ensure_object(CliState).store = value


def store_option(fn: F) -> F:
    """``--store URL`` on a command or group; the innermost one given wins.

    ``$KEEL_STORE`` is read by :func:`keel.store.resolve_location`, not by click, so that a
    ``--store`` given on the root group is not overridden by the environment.
    """
    return store_option_helped(STORE_HELP)(fn)


def store_option_helped(help_text: str) -> Callable[[F], F]:
    """:func:`store_option` with a command's own help text (where its default differs)."""
    return click.option(
        "--store",
        metavar="URL",
        default=None,
        expose_value=False,
        is_eager=True,
        callback=remember_store,
        help=help_text,
    )


def data_dir_option(help_text: str) -> Callable[[F], F]:
    """``--data-dir`` (``$KEEL_DATA_DIR``, default ``keel-data``), as a Path."""
    return click.option(
        "--data-dir",
        default="keel-data",
        show_default=True,
        envvar="KEEL_DATA_DIR",
        type=FilePath(file_okay=False, path_type=Path),
        help=help_text,
    )


def log_format_option(fn: F) -> F:
    """``--log-format text|json`` (``$KEEL_LOG_FORMAT``): how the process logs (one line per
    task transition with ``-v``; see docs/observability.md)."""
    return click.option(
        "--log-format",
        type=click.Choice(["text", "json"]),
        default="text",
        show_default=True,
        envvar="KEEL_LOG_FORMAT",
        help="Log lines as text or as one JSON object each.",
    )(fn)


def store_timeout_option(fn: F) -> F:
    """``--store-timeout SECONDS`` (``$KEEL_STORE_TIMEOUT``, default 10): how long a call
    waits for the store before it is answered "store unavailable" (``open_store``)."""
    return click.option(
        "--store-timeout",
        default=10.0,
        show_default=True,
        envvar="KEEL_STORE_TIMEOUT",
        type=click.FloatRange(min=0.1, max=3600),
        metavar="SECONDS",
        help="Seconds a call waits for the store (PostgreSQL down, SQLite locked) before "
        "it is answered 'store unavailable'.",
    )(fn)


def chosen_location(ctx: click.Context) -> Location:
    """The store location for this invocation, parsed.

    Raises:
        ConfigurationError: a bad location.
    """
    state = ctx.find_object(CliState)
    explicit = None if state is None else state.store
    if explicit is None and not os.environ.get(ENV_VAR):
        explicit = configured_store()  # keel serve's store, from keel.toml
    return parse_location(resolve_location(explicit))


def run_with_store(
    ctx: click.Context,
    operation: Callable[[Store], Awaitable[T]],
    *,
    creates: bool = False,
) -> T:
    """Open the store, run ``operation`` on it in an event loop, close the store.

    Args:
        creates: whether the command may create a missing SQLite file. Commands that only
            read or change existing tasks must not leave a ``keel-data/`` folder behind in
            whatever directory they happen to run in: for them a missing file is an empty
            store (an in-memory one, so every answer is exactly what an empty store says).

    Raises:
        KeelError: whatever the store or the operation raised (the caller's ``main`` turns
            it into one line and exit code 1).
    """
    location = chosen_location(ctx)
    if location.kind == "memory":
        warn("memory:// lives only as long as this command: nothing will persist")
    target = location.url or str(location.path)
    if not creates and location.kind == "sqlite" and location.path and not location.path.exists():
        warn(f"no store at {location.path} yet (use --store or ${ENV_VAR} to choose one)")
        target = "memory://"

    async def run() -> T:
        store = open_store(target)
        try:
            return await operation(store)
        finally:
            await store.close()

    return anyio.run(run)


YOUNG_COLLECTION = 10_000
"""Allocations between two collections of the youngest generation once a long-running
command has started (Python's default: 700)."""


def settle_heap() -> None:
    """Once a long-running command (``keel worker``, ``keel serve``) has started: what it
    built so far (modules, the app, the store, the SDK's models) lives as long as the
    process, so move it out of the garbage collector's sight (``gc.freeze``), after one
    collection so that no garbage is kept with it; and collect the youngest generation
    every :data:`YOUNG_COLLECTION` allocations rather than 700 (a task's objects die by
    reference counting; the collections only find the few cycles, such as a caught
    exception's traceback, a little later). On a worker draining 20,000 PostgreSQL no-op
    tasks: 11 full collections took 0.345 s of 5.3 s of CPU, 0.036 s once frozen; with
    the store's answered calls no longer kept, all collections took 0.14-0.16 s, 0.02 s
    with the young threshold raised (docs/benchmarks.md)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION, middle, old)
