"""``keel tasks watch``: the newest tasks, kept up to date from the store's change feed.

On a terminal it draws a live table (rich) of the newest ``--limit`` tasks, redrawn on
every change; piped or redirected it prints one plain line per task as it changes
(``updated  id  status  name  message``, tab-separated, nothing cut): the current tasks
first, then each change. ``--count N`` stops after N changes; otherwise it runs until
interrupted (Ctrl-C: exit 0).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import click

from keel.cli.common import run_with_store, store_option, warn
from keel.cli.render import format_time, task_table, terminal_width
from keel.errors import TaskNotFound
from keel.model import Task
from keel.store import Store
from keel.store.browse import MAX_PAGE, TaskFilter

__all__ = ["watch"]


def plain_line(task: Task) -> str:
    """One task as a piped line: tab-separated, nothing cut, no colour."""
    message = " ".join((task.status_message or "").split())
    return "\t".join(
        [format_time(task.updated_at), task.task_id, task.status.value, task.name or "-", message]
    )


class Watched:
    """The tasks shown, and what changed since they were last shown."""

    def __init__(self, store: Store, where: TaskFilter, limit: int) -> None:
        self.store, self.where, self.limit = store, where, limit
        self.tasks: dict[str, Task] = {}

    def _wanted(self, task: Task) -> bool:
        name, owner = self.where.name, self.where.owner
        return (name is None or task.name == name) and (owner is None or task.owner == owner)

    async def changed(self, task_ids: frozenset[str] | None) -> list[Task]:
        """Read the tasks a change names (None: the newest page again); those that differ
        from what was shown, oldest change first."""
        if task_ids is None:
            page = await self.store.browse(self.where, limit=self.limit)
            found = list(reversed(page.tasks))
        else:
            found = []
            for task_id in sorted(task_ids):
                try:
                    task = await self.store.get(task_id)
                except TaskNotFound:  # purged meanwhile
                    self.tasks.pop(task_id, None)
                    continue
                if self._wanted(task):
                    found.append(task)
        fresh = [t for t in found if self.tasks.get(t.task_id) != t]
        for task in fresh:
            self.tasks[task.task_id] = task
        newest = sorted(self.tasks.values(), key=lambda t: (t.created_at, t.task_id), reverse=True)
        self.tasks = {t.task_id: t for t in newest[: self.limit]}
        return sorted(fresh, key=lambda t: (t.updated_at, t.task_id))

    def table(self) -> str:
        """The shown tasks, newest first, as ``keel tasks list`` draws them."""
        return task_table(list(self.tasks.values()), terminal_width())


async def _follow(watched: Watched, count: int | None, show: Callable[[list[Task]], None]) -> None:
    """Show the current tasks, then each change, until ``count`` changes were shown."""
    shown = 0
    first = True
    async for change in watched.store.changes():
        fresh = await watched.changed(None if first else change.task_ids)
        if not first:
            fresh = fresh[: None if count is None else count - shown]
            shown += len(fresh)
        show(fresh)
        if first:
            warn_ready()
            first = False
        if count is not None and shown >= count:
            return


def warn_ready() -> None:
    """The line that says the watch has started (tests wait for it through a pipe)."""
    click.echo("keel tasks watch: watching for changes (Ctrl-C stops)", err=True)


@click.command("watch", short_help="Follow the newest tasks live (a table on a terminal).")
@store_option
@click.option("--name", help="Only tasks of this tool (task name).")
@click.option("--principal", help="Only tasks of this principal (owner).")
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_PAGE),
    default=20,
    show_default=True,
    help="How many of the newest tasks to show at first (and in the table).",
)
@click.option(
    "--count",
    type=click.IntRange(min=0),
    help="Stop after this many changes (0: show the current tasks and stop).",
)
@click.pass_context
def watch(
    ctx: click.Context, name: str | None, principal: str | None, limit: int, count: int | None
) -> None:
    """Follow the newest tasks as they change (every process's commits, through the
    store's change feed). On a terminal: a live table of the newest --limit tasks.
    Piped: one tab-separated line per task as it changes (updated, id, status, name,
    message), the current tasks first. Runs until --count changes or Ctrl-C."""
    where = TaskFilter(name=name, owner=principal)

    async def op(store: Store) -> None:
        watched = Watched(store, where, limit)
        if not sys.stdout.isatty():
            await _follow(watched, count, _print_lines)
            return
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text

        with Live(console=Console(), auto_refresh=False) as live:

            def redraw(_fresh: list[Task]) -> None:
                shown = Text.from_ansi(watched.table(), no_wrap=True, overflow="ellipsis")
                live.update(shown, refresh=True)

            await _follow(watched, count, redraw)

    try:
        run_with_store(ctx, op)
    except KeyboardInterrupt:
        warn("stopped")


def _print_lines(tasks: list[Task]) -> None:
    for task in tasks:
        click.echo(plain_line(task))
    sys.stdout.flush()
