"""``keel tasks …``: look at and operate on the tasks in a store.

Each command opens the store, does one or two calls of the async store API, closes it and
prints; the rules (what may change, what is refused and how) are the store's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from keel.cli.common import (
    FilePath,
    KeelCliError,
    chosen_location,
    run_with_store,
    store_option,
)
from keel.cli.listing import SinceParam, newest
from keel.cli.render import (
    dump_json,
    reclaimed_table,
    reclaimed_to_json,
    show_lines,
    status_text,
    task_table,
    task_to_json,
    terminal_width,
)
from keel.cli.watch import watch
from keel.errors import InvalidPayload
from keel.model import DEFAULT_INPUT_KEY, Event, JsonValue, Reclaimed, Status, Task
from keel.model.validation import check_answer_keys, check_depth, loads_bounded
from keel.store import Store
from keel.store.importer import ImportReport, import_file, read_teaching_file

__all__ = ["tasks"]

ACTOR = "cli"
"""Who the history says made a change from the command line."""

_STATUS_CHOICE = click.Choice([s.value for s in Status])


def _parse_json(ctx: click.Context, param: click.Parameter, value: str | None) -> JsonValue:
    """``--json``: a JSON document on the command line (``-`` reads it from stdin).

    A malformed document is a usage error (exit 2) that says where and what is wrong; a
    document nested deeper than :data:`~keel.model.validation.MAX_DEPTH` is refused with
    one ``keel: error:`` line (as the store refuses text it cannot keep, naming where).
    """
    if value is None:
        return None
    try:
        text = sys.stdin.read() if value == "-" else value
    except UnicodeDecodeError as exc:
        raise click.BadParameter(f"stdin is not UTF-8 text: {exc.reason}", ctx, param) from exc
    try:
        parsed = loads_bounded(text, "the answer", parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(
            f"not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}", ctx, param
        ) from exc
    except InvalidPayload:
        raise  # valid JSON, but nested too deep to store: one keel: error line
    except ValueError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", ctx, param) from exc
    check_depth(parsed, "the answer")
    return parsed


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


@click.group()
@store_option
def tasks() -> None:
    """Look at and operate on the tasks in a store.

    Every command takes --store URL (or $KEEL_STORE; default keel-data/keel.db under the
    current directory), the same store `keel serve` uses.
    """


tasks.add_command(watch)


@tasks.command("retry", short_help="Retry a failed task as a new one; prints the new id.")
@store_option
@click.argument("task_id", metavar="ID")
@click.pass_context
def retry(ctx: click.Context, task_id: str) -> None:
    """Retry the failed task ID as a new task (new id, same name, arguments, principal,
    attempts and TTL; its recorded steps copied, both histories linked). ID stays
    failed. Prints the new id."""

    async def op(store: Store) -> Task:
        return await store.rerun(task_id, actor=ACTOR)

    new = run_with_store(ctx, op)
    click.echo(new.task_id)
    click.echo(f"keel tasks retry: task {task_id} retried as {new.task_id}", err=True)


@tasks.command("list", short_help="List tasks, newest first: id, status, name, message, …")
@store_option
@click.option("--status", type=_STATUS_CHOICE, help="Only tasks with this status.")
@click.option("--name", help="Only tasks of this tool (task name).")
@click.option("--principal", help="Only tasks of this principal (owner).")
@click.option(
    "--since", type=SinceParam(), help="Only tasks created since: 15m, 2h, 7d, a date-time."
)
@click.option("--cursor", help="Continue a listing where the previous one stopped.")
@click.option("--json", "as_json", is_flag=True, help="A JSON array of full task snapshots.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="At most this many tasks, newest first.",
)
@click.pass_context
def list_tasks(  # noqa: PLR0917 - click passes every option as an argument
    ctx: click.Context,
    status: str | None,
    name: str | None,
    principal: str | None,
    since: float | None,
    cursor: str | None,
    as_json: bool,
    limit: int,
) -> None:
    """List tasks newest first (by creation): id, status, name, status message, attempt,
    updated. A listing cut short by --limit says on stderr how to continue (--cursor)."""
    wanted = None if status is None else Status(status)

    async def op(store: Store) -> tuple[list[Task], str | None]:
        return await newest(
            store,
            status=wanted,
            name=name,
            principal=principal,
            since=since,
            limit=limit,
            cursor=cursor,
        )

    found, rest = run_with_store(ctx, op)
    if as_json:
        click.echo(dump_json([task_to_json(t) for t in found]))
    elif not found:
        click.echo("no tasks" if wanted is None else f"no {wanted.value} tasks")
    else:
        click.echo(task_table(found, terminal_width()))
    if rest is not None:
        click.echo(
            f"keel: note: showing the newest {limit} tasks; the next ones: --cursor {rest}",
            err=True,
        )


@tasks.command("show", short_help="Show a task: every field, its input and its history.")
@store_option
@click.argument("task_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="The snapshot and history as JSON.")
@click.pass_context
def show(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """Show every field of task ID, its input requests and answers, and its history."""

    async def op(store: Store) -> tuple[Task, list[Event], dict[str, JsonValue]]:
        task = await store.get(task_id)
        return task, list(await store.history(task_id)), dict(await store.steps(task_id))

    task, history, steps = run_with_store(ctx, op)
    if as_json:
        click.echo(dump_json(task_to_json(task, history, steps)))
    else:
        click.echo("\n".join(show_lines(task, history, steps)))


@tasks.command("cancel", short_help="Cancel a waiting or running task.")
@store_option
@click.argument("task_id", metavar="ID")
@click.option("--reason", help="Why; recorded in the task's history.")
@click.pass_context
def cancel(ctx: click.Context, task_id: str, reason: str | None) -> None:
    """Cancel task ID, waiting or running.

    A task that already completed or failed is refused (exit 1) with its real status.
    """

    async def op(store: Store) -> tuple[Task, Task]:
        before = await store.get(task_id)
        return before, await store.cancel(task_id, reason=reason, actor=ACTOR)

    before, after = run_with_store(ctx, op)
    if before.status is Status.CANCELLED:
        click.echo(f"task {task_id} was already {status_text(after.status)}")
    else:
        click.echo(f"task {task_id}: {before.status.value} -> {status_text(after.status)}")


@tasks.command("answer", short_help="Answer a task's input request (validated by its schema).")
@store_option
@click.argument("task_id", metavar="ID")
@click.option(
    "--key",
    help=f"The input request to answer. Default: the only pending one, else {DEFAULT_INPUT_KEY!r}.",
)
@click.option(
    "--json",
    "value",
    callback=_parse_json,
    required=True,
    metavar="JSON",
    help="The answer, as JSON ('-' reads it from stdin). Validated against the request's schema.",
)
@click.pass_context
def answer(ctx: click.Context, task_id: str, key: str | None, value: JsonValue) -> None:
    """Answer an input request of task ID (the task resumes once all are answered)."""

    async def op(store: Store) -> tuple[Task, str, Task]:
        task = await store.get(task_id)
        chosen = _choose_key(task, key)
        after = await store.provide_input(task_id, {chosen: value}, actor=ACTOR)
        return task, chosen, after

    before, chosen, after = run_with_store(ctx, op)
    if after.updated_at == before.updated_at:
        # The store ignores an answer to a key answered meanwhile: never report that as done.
        raise KeelCliError(
            f"input {chosen!r} of task {task_id} was already answered; nothing changed"
        )
    waiting = ", ".join(repr(k) for k in after.pending_input)
    tail = f" (still waiting for {waiting})" if waiting else ""
    click.echo(
        f"task {task_id}: input {chosen!r} accepted; {before.status.value} -> "
        f"{status_text(after.status)}{tail}"
    )


def _choose_key(task: Task, explicit: str | None) -> str:
    """Which request an answer is for; refuse rather than let it be silently ignored."""
    pending = task.pending_input
    if task.status is not Status.INPUT_REQUIRED:
        # The store refuses this write with the uniform, status-naming answer: let it.
        return explicit or DEFAULT_INPUT_KEY
    if explicit is not None:
        check_answer_keys(task, [explicit])  # UnknownInputKey names the pending keys
        return explicit
    if len(pending) == 1:
        return next(iter(pending))
    if DEFAULT_INPUT_KEY in pending:
        return DEFAULT_INPUT_KEY
    raise click.UsageError(
        f"task {task.task_id} waits for several inputs ({', '.join(map(repr, pending))}); "
        "choose one with --key"
    )


@tasks.command("reclaim", short_help="Fail tasks idle for longer than --older-than SECONDS.")
@store_option
@click.option(
    "--older-than",
    "older_than",
    type=click.FloatRange(min=0),
    required=True,
    metavar="SECONDS",
    help="Fail non-terminal tasks not updated for longer than this.",
)
@click.option("--json", "as_json", is_flag=True, help="The explained list as JSON.")
@click.pass_context
def reclaim(ctx: click.Context, older_than: float, as_json: bool) -> None:
    """Fail every working or input_required task idle for longer than --older-than.

    Prints each reclaimed task with its previous status, how long it was idle, and why.
    Completed, failed and cancelled tasks are never touched.
    """

    async def op(store: Store) -> list[Reclaimed]:
        return list(await store.reclaim(older_than))

    done = run_with_store(ctx, op)
    if as_json:
        click.echo(dump_json([reclaimed_to_json(r) for r in done]))
        return
    if done:
        click.echo(reclaimed_table(done, terminal_width()))
    click.echo(f"reclaimed {_count(len(done))} idle for more than {older_than:g}s")


@tasks.command("purge", short_help="Delete finished tasks whose TTL has run out.")
@store_option
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Delete at most this many tasks.",
)
@click.option("--json", "as_json", is_flag=True, help="The purged ids as a JSON array.")
@click.pass_context
def purge(ctx: click.Context, limit: int, as_json: bool) -> None:
    """Delete finished tasks whose TTL has run out, with their history.

    Tasks without a TTL, and tasks still working or waiting for input, are never deleted.
    """

    async def op(store: Store) -> list[str]:
        return list(await store.purge(limit=limit))

    ids = run_with_store(ctx, op)
    if as_json:
        click.echo(dump_json(ids))
        return
    for task_id in ids:
        click.echo(task_id)
    click.echo(f"purged {_count(len(ids))} (finished, TTL run out)")
    if len(ids) == limit:
        click.echo("keel: note: the limit was reached; run purge again for more", err=True)


@tasks.command("import", short_help="Import a teaching-store JSON file, all or nothing.")
@store_option
@click.argument("file", type=FilePath(dir_okay=False, path_type=Path))
@click.option("--dry-run", is_flag=True, help="Check the whole file; store nothing.")
@click.pass_context
def import_(ctx: click.Context, file: Path, dry_run: bool) -> None:
    """Import the seed's teaching-store JSON file FILE: every task in it, or none.

    The whole file is checked first (truncated JSON, unknown statuses, wrong shapes,
    duplicate idempotency keys are refused, naming the problem); then all tasks are stored
    in one transaction, which also refuses ids or keys the store already holds.
    """
    if dry_run:
        report = read_teaching_file(file)
        _print_report(report, "would import", "")
        return

    async def op(store: Store) -> ImportReport:
        return await import_file(store, file, actor=f"import:{file.name}")

    report = run_with_store(ctx, op, creates=True)
    _print_report(report, "imported", f" into {chosen_location(ctx).describe()}")


def _print_report(report: ImportReport, verb: str, where: str) -> None:
    counts = ", ".join(f"{n} {s.value}" for s, n in report.counts().items())
    click.echo(
        f"{verb} {_count(len(report.tasks))} from {report.source}{where}"
        + (f": {counts}" if counts else "")
    )
    for note in report.notes:
        click.echo(f"  note: {note}")


def _count(n: int) -> str:
    return f"{n} task" if n == 1 else f"{n} tasks"
