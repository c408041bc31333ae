"""Contract: browsing tasks as an operator (``store.browse``, :mod:`keel.store.browse`).

Newest first by ``created_at`` then id; filters by status, tool name, principal,
created and updated range, and text; keyset cursor paging that visits every task once,
never hides a task created meanwhile, and survives its cursor task being purged. Bad
filters, cursors and limits are refused, naming the problem, and change nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from keel import InvalidPayload, Status
from keel.store import Store
from keel.store.browse import MAX_PAGE, TaskFilter

from .support import ERROR, FakeClock, ask, refused

pytestmark = pytest.mark.anyio


async def _all_pages(store: Store, where: TaskFilter | None = None, limit: int = 2) -> list[str]:
    ids: list[str] = []
    cursor = None
    for _ in range(1000):
        page = await store.browse(where, limit=limit, cursor=cursor)
        assert len(page.tasks) <= limit
        ids += [t.task_id for t in page.tasks]
        cursor = page.next_cursor
        if cursor is None:
            return ids
    raise AssertionError("paging did not end")  # pragma: no cover


async def _made(store: Store, clock: FakeClock, n: int, **create: Any) -> list[str]:
    ids = []
    for _ in range(n):
        clock.advance(1)
        ids.append((await store.create(name="job", **create)).task_id)
    return ids


async def test_tasks_come_newest_first_a_page_at_a_time(store: Store, clock: FakeClock) -> None:
    """Every task once, newest first, over pages of two; the last page has no cursor."""
    ids = await _made(store, clock, 5)
    assert await _all_pages(store) == ids[::-1]
    whole = await store.browse(limit=MAX_PAGE)
    assert [t.task_id for t in whole.tasks] == ids[::-1]
    assert whole.next_cursor is None
    exact = await store.browse(limit=5)
    assert exact.next_cursor is None


async def test_an_empty_store_gives_an_empty_last_page(store: Store) -> None:
    """No tasks: no tasks and no cursor."""
    page = await store.browse()
    assert (page.tasks, page.next_cursor) == ((), None)


async def test_a_task_created_while_paging_is_on_the_first_page_not_a_later_one(
    store: Store, clock: FakeClock
) -> None:
    """Keyset paging: a newer task never shifts later pages nor hides behind a limit."""
    ids = await _made(store, clock, 4)
    first = await store.browse(limit=2)
    newer = await _made(store, clock, 1)
    second = await store.browse(limit=2, cursor=first.next_cursor)
    assert [t.task_id for t in second.tasks] == [ids[1], ids[0]]
    assert (await store.browse(limit=1)).tasks[0].task_id == newer[0]


async def test_tasks_created_at_the_same_instant_page_by_id(store: Store) -> None:
    """Ties on created_at are broken by task id (descending), and paging crosses them."""
    ids = [(await store.create(name="job")).task_id for _ in range(5)]
    assert await _all_pages(store) == sorted(ids, reverse=True)


async def test_filters_by_status_name_principal_and_text(store: Store, clock: FakeClock) -> None:
    """Each filter alone and together; a value no task has gives an empty page."""
    a = await _made(store, clock, 2, owner="alice")
    clock.advance(1)
    waiting = await store.create(name="diagnose", owner="bob", input_requests={"k": ask()})
    clock.advance(1)
    failed = await store.create(name="diagnose", owner="alice")
    await store.fail(failed.task_id, ERROR)
    await store.set_status_message(a[0], "fetching logs 3/7")

    async def ids(**where: Any) -> list[str]:
        return await _all_pages(store, TaskFilter(**where))

    assert await ids(status=Status.INPUT_REQUIRED) == [waiting.task_id]
    assert await ids(status="failed") == [failed.task_id]
    assert await ids(name="diagnose") == [failed.task_id, waiting.task_id]
    assert await ids(owner="alice") == [failed.task_id, a[1], a[0]]
    assert await ids(owner="alice", name="job", status=Status.WORKING) == [a[1], a[0]]
    assert await ids(text="logs 3/") == [a[0]]
    assert await ids(text=waiting.task_id[5:20]) == [waiting.task_id]
    assert await ids(owner="carol") == []
    assert await ids(name="diagnose", status=Status.COMPLETED) == []


async def test_filters_by_created_and_updated_range(store: Store, clock: FakeClock) -> None:
    """``from`` is inclusive and ``to`` exclusive, on created_at and on updated_at."""
    ids = await _made(store, clock, 4)
    created = [(await store.get(i)).created_at for i in ids]
    clock.advance(10)
    await store.set_status_message(ids[0], "touched")
    touched = (await store.get(ids[0])).updated_at

    async def found(**where: Any) -> list[str]:
        return await _all_pages(store, TaskFilter(**where), limit=3)

    assert await found(created_from=created[1]) == [ids[3], ids[2], ids[1]]
    assert await found(created_to=created[1]) == [ids[0]]
    assert await found(created_from=created[1], created_to=created[3]) == [ids[2], ids[1]]
    assert await found(updated_from=touched) == [ids[0]]
    assert await found(updated_to=touched) == [ids[3], ids[2], ids[1]]


async def test_a_cursor_outlives_its_task(store: Store, clock: FakeClock) -> None:
    """The cursor is a position, not a task: purging the task it came from changes nothing."""
    ids = await _made(store, clock, 3, ttl=0)
    first = await store.browse(limit=1)
    await store.cancel(ids[2])
    assert ids[2] in await store.purge()
    second = await store.browse(limit=5, cursor=first.next_cursor)
    assert [t.task_id for t in second.tasks] == [ids[1], ids[0]]


async def test_browse_and_counts_agree(store: Store, clock: FakeClock) -> None:
    """The tasks of each status browsed number what ``counts`` says."""
    ids = await _made(store, clock, 3)
    await store.cancel(ids[1])
    counts = await store.counts()
    for status in Status:
        assert len(await _all_pages(store, TaskFilter(status=status))) == counts[status]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        pytest.param({"cursor": "not-a-cursor"}, "cursor 'not-a-cursor' is not one", id="cursor"),
        pytest.param({"cursor": "W10"}, "is not one a page of tasks gave", id="cursor-shape"),
        pytest.param({"cursor": "é"}, "is not one a page of tasks gave", id="cursor-text"),
        pytest.param({"limit": 0}, "page limit must be an integer from 1 to 500", id="limit-0"),
        pytest.param({"limit": MAX_PAGE + 1}, "not 501", id="limit-big"),
        pytest.param({"limit": True}, "not True", id="limit-bool"),
        pytest.param({"where": TaskFilter(status="done")}, "'done' is not a status", id="status"),  # type: ignore[arg-type]
        pytest.param({"where": TaskFilter(name=3)}, "filter name must be", id="name"),  # type: ignore[arg-type]
        pytest.param({"where": TaskFilter(owner="a\x00")}, "filter owner must be", id="owner"),
        pytest.param({"where": TaskFilter(created_from=float("nan"))}, "finite time", id="created"),
        pytest.param({"where": TaskFilter(updated_to="1")}, "must be a number", id="updated"),  # type: ignore[arg-type]
    ],
)
async def test_bad_requests_are_refused_naming_the_problem(
    store: Store, clock: FakeClock, call: dict[str, Any], message: str
) -> None:
    """InvalidPayload naming the cursor, limit or filter field; the store is unchanged."""
    await _made(store, clock, 2)
    error = await refused(store, InvalidPayload, lambda: store.browse(**call))
    assert message in str(error)
