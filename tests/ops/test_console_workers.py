"""The console's Workers and health page (``/ops/workers``) on a real SQLite store with a
clock the test moves: live leases grouped by worker (attempt, fence, lease expiry, last
renewal), and stuck tasks (a lease expired but not recovered, an input wait over the
threshold, a live task past its TTL), each task a link to its page."""

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


@pytest.fixture
async def timed(tmp_path: Path) -> AsyncIterator[tuple[SqliteStore, Clock, httpx.AsyncClient]]:
    """A SQLite store and the console over it, both on one test clock."""
    clock = Clock()
    store = SqliteStore(tmp_path / "keel.db", clock=clock)
    transport = httpx.ASGITransport(app=standalone_app(store, clock=clock))
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
    """Each worker's leased tasks are listed under it with attempt, fence and status as a
    word; the page is linked from the console's header; unclaimed tasks hold no lease."""
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
    one = _part(html, 'data-worker="w-one"', "</table>")
    assert f'<a class="id" href="/ops/tasks/{mine.task_id}">{mine.task_id}</a>' in one
    assert theirs.task_id not in one
    assert theirs.task_id in _part(html, 'data-worker="w-two"', "</table>")
    assert idle.task_id not in html
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


async def test_a_live_task_past_its_ttl_shows_as_stuck(
    timed: tuple[SqliteStore, Clock, httpx.AsyncClient],
) -> None:
    """A task still working after its TTL ran out is stuck (``past its TTL``)."""
    store, clock, http = timed
    task = await store.create(name="slow", ttl=60)
    clock.now += 100
    stuck = _part(await _workers(http), 'id="stuck"', "</section>")
    row = Page(_part(stuck, f'data-task-id="{task.task_id}"', "</tr>")).all_text
    assert all(word in row for word in ("past its TTL", "40 s"))
