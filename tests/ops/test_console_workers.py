"""The console's Workers and health page (``/ops/workers``) on a real SQLite store with a
clock the test moves: a line per worker (leases, expired, last heartbeat), a chosen
worker's leases a page at a time (attempt, fence, lease expiry, last renewal), and stuck
tasks (a lease expired but not recovered, an input wait over the threshold, an attempt
past its tool's deadline; not a live task past its TTL), each task a link to its page."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from keel.model import InputRequest
from keel.ops import standalone_app
from keel.store import SqliteStore

from .conftest import BASE
from .page import Page

pytestmark = pytest.mark.anyio

QUESTION = {"ok": InputRequest("Proceed?", {"type": "object", "properties": {}})}


class Clock:
    """Seconds since the epoch, moved by the test (the store's and the console's)."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


DEADLINES = {"slow": 60.0}
"""The tools' deadlines the console is given (as keel serve gives its app's)."""


@pytest.fixture
async def timed(tmp_path: Path) -> AsyncIterator[tuple[SqliteStore, Clock, httpx.AsyncClient]]:
    """A SQLite store and the console over it, both on one test clock."""
    clock = Clock()
    store = SqliteStore(tmp_path / "keel.db", clock=clock)
    transport = httpx.ASGITransport(app=standalone_app(store, clock=clock, deadlines=DEADLINES))
    try:
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
            yield store, clock, http
    finally:
        await store.close()


def _part(html: str, start: str, end: str) -> str:
    """The markup from ``start`` to the next ``end`` after it."""
    assert start in html, start
    rest = html[html.index(start) :]
    return rest[: rest.index(end)]


async def _workers(http: httpx.AsyncClient, query: str = "") -> str:
    response = await http.get(f"/ops/workers{query}")
    assert response.status_code == 200, response.text
    return response.text


async def test_a_claimed_task_shows_under_its_worker(
    timed: tuple[SqliteStore, Clock, httpx.AsyncClient],
) -> None:
    """A line per worker (how many leases, its last heartbeat), a link to its leases;
    there each leased task with attempt, fence and status as a word; the page is linked
    from the console's header; unclaimed tasks hold no lease."""
    store, clock, http = timed
    mine = await store.create(name="diagnose", max_attempts=3)
    theirs = await store.create(name="report")
    idle = await store.create(name="nobody-claims-this")
    (claimed,) = await store.claim(["diagnose"], worker="w-one", lease_seconds=30)
    await store.claim(["report"], worker="w-two", lease_seconds=30)
    clock.now += 10
    await store.renew(mine.task_id, fence=claimed.fence, lease_seconds=30)
    home = Page((await http.get("/ops/")).text)
    assert ("/ops/workers", "Workers and health") in home.links
    html = await _workers(http)
    line = Page(_part(html, '<tr data-worker-row="w-one"', "</tr>"))
    assert line.all_text.split()[:3] == ["w-one", "1", "0"]
    assert "2027-01-15 08:00:10Z" in line.all_text  # its last heartbeat: the renewal
    ((href, _),) = line.links
    assert href == "/ops/workers?worker=w-one&waiting_over=3600"
    html = await _workers(http, "?worker=w-one")
    one = _part(html, 'data-worker="w-one"', "</table>")
    assert f'<a class="id" href="/ops/tasks/{mine.task_id}">{mine.task_id}</a>' in one
    assert theirs.task_id not in one
    assert 'data-worker="w-two"' not in html
    two = await _workers(http, "?worker=w-two")
    assert theirs.task_id in _part(two, 'data-worker="w-two"', "</table>")
    assert idle.task_id not in html + two
    row = Page(_part(one, f'data-task-id="{mine.task_id}"', "</tr>")).all_text
    assert all(word in row for word in ("working", "1/3", str(claimed.fence)))
    assert "2027-01-15 08:00:40Z" in row  # the lease, renewed at +10 s for 30 s
    assert "No stuck tasks." in Page(html).all_text


async def test_an_expired_lease_shows_as_stuck_until_recovered(
    timed: tuple[SqliteStore, Clock, httpx.AsyncClient],
) -> None:
    """A lease whose heartbeats stopped is stuck (``lease expired``, for how long) and
    still shown under its worker; once recovered it is neither."""
    store, clock, http = timed
    task = await store.create(name="diagnose", max_attempts=2)
    await store.claim(["diagnose"], worker="w-dead", lease_seconds=30)
    clock.now += 90
    html = await _workers(http)
    stuck = _part(html, 'id="stuck"', "</section>")
    assert (f"/ops/tasks/{task.task_id}", task.task_id) in Page(stuck).links
    row = Page(_part(stuck, f'data-task-id="{task.task_id}"', "</tr>")).all_text
    assert all(word in row for word in ("lease expired", "60 s", "w-dead"))
    assert "1 lease expired" in Page(_part(html, '<tr data-worker-row="w-dead"', "</tr>")).all_text
    html = await _workers(http, "?worker=w-dead")
    assert task.task_id in _part(html, 'data-worker="w-dead"', "</table>")
    assert await store.recover_expired()
    html = await _workers(http)
    assert task.task_id not in _part(html, 'id="stuck"', "</section>")
    assert "No worker holds a lease." in Page(html).all_text


async def test_an_old_input_wait_shows_as_stuck(
    timed: tuple[SqliteStore, Clock, httpx.AsyncClient],
) -> None:
    """A task waiting for input longer than ``waiting_over`` (default 1 h) is stuck, a
    recent one is not; a bad threshold is 400 naming it."""
    store, clock, http = timed
    old = await store.create(name="ask", input_requests=QUESTION)
    clock.now += 7200
    new = await store.create(name="ask", input_requests=QUESTION)
    clock.now += 60
    stuck = _part(await _workers(http), 'id="stuck"', "</section>")
    assert new.task_id not in stuck
    row = Page(_part(stuck, f'data-task-id="{old.task_id}"', "</tr>")).all_text
    assert all(word in row for word in ("input_required", "waiting for input", "7260 s"))
    stuck = _part(await _workers(http, "?waiting_over=30"), 'id="stuck"', "</section>")
    assert old.task_id in stuck
    assert new.task_id in stuck
    stuck = _part(await _workers(http, "?waiting_over=10000"), 'id="stuck"', "</section>")
    assert old.task_id not in stuck
    bad = await http.get("/ops/workers?waiting_over=soon")
    assert bad.status_code == 400
    assert "waiting_over must be seconds" in Page(bad.text).all_text


async def test_an_attempt_past_its_deadline_shows_as_stuck(
    timed: tuple[SqliteStore, Clock, httpx.AsyncClient],
) -> None:
    """An attempt of a tool with a deadline still leased (and renewed) past it, counted
    from its claim, is stuck (``past its deadline``, by how much); one within it is not,
    nor one of a tool without a deadline, nor a live task past its TTL (a TTL is how long
    a finished task is kept, not a deadline)."""
    store, clock, http = timed
    slow = await store.create(name="slow")
    free = await store.create(name="free", ttl=10)
    (claimed,) = await store.claim(["slow"], worker="w-1", lease_seconds=30)
    await store.claim(["free"], worker="w-1", lease_seconds=30)

    async def heartbeat(seconds: float) -> None:
        clock.now += seconds
        for task in (slow, free):
            await store.renew(task.task_id, fence=claimed.fence, lease_seconds=30)

    await heartbeat(25)
    await heartbeat(25)
    html = await _workers(http)
    assert "Deadlines judged: slow 60 s." in Page(html).all_text
    assert "No stuck tasks." in Page(html).all_text
    later = await store.create(name="slow")
    await store.claim(["slow"], worker="w-2", lease_seconds=30)
    await heartbeat(25)
    stuck = _part(await _workers(http), 'id="stuck"', "</section>")
    row = Page(_part(stuck, f'data-task-id="{slow.task_id}"', "</tr>")).all_text
    assert all(word in row for word in ("past its deadline", "15 s", "w-1"))
    assert later.task_id not in stuck
    assert free.task_id not in stuck


async def test_a_workers_leases_come_a_page_at_a_time(
    timed: tuple[SqliteStore, Clock, httpx.AsyncClient],
) -> None:
    """A worker with more leases than a page: the first 50, soonest expiry first, and a
    next-page link to the rest; a cursor that no page gave is 400 naming it."""
    store, clock, http = timed
    ids = [(await store.create(name="job")).task_id for _ in range(60)]
    for _ in ids:
        clock.now += 1
        await store.claim(["job"], worker="w-busy", lease_seconds=3600)

    def shown(html: str) -> list[str]:
        table = Page(_part(html, 'data-worker="w-busy"', "</table>"))
        return [href.rsplit("/", 1)[1] for href, _ in table.links]

    first = await _workers(http, "?worker=w-busy")
    assert shown(first) == ids[:50]
    ((next_url, _),) = [(h, t) for h, t in Page(first).links if t == "Next page"]
    second = (await http.get(next_url)).text
    assert shown(second) == ids[50:]
    assert "Next page" not in Page(second).all_text
    bad = await http.get("/ops/workers?worker=w-busy&cursor=nope!")
    assert bad.status_code == 400
    assert "cursor 'nope!' is not one" in Page(bad.text).all_text
