"""The console's Reclaim stale tasks and Purge expired tasks buttons, on a real SQLite
store with a clock the test moves: each is a CSRF-checked POST form on the list page;
a reclaim is recorded in every reclaimed task's history as the operator's (the token's
name behind ``--auth``); a purge deletes only finished tasks whose TTL has run out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from keel import Status
from keel.mcp.tokens import TokenFile, TokenFileVerifier
from keel.ops import LOCAL_OPERATOR, standalone_app
from keel.store import SqliteStore

from .conftest import BASE
from .page import Page

pytestmark = pytest.mark.anyio


class Clock:
    """Seconds since the epoch, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def timed(tmp_path: Path) -> AsyncIterator[tuple[SqliteStore, Clock]]:
    """A SQLite store on a test clock."""
    clock = Clock()
    store = SqliteStore(tmp_path / "keel.db", clock=clock)
    try:
        yield store, clock
    finally:
        await store.close()


async def _http(store: SqliteStore, **app: object) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=standalone_app(store, **app))  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url=BASE)


async def test_reclaim_fails_the_idle_tasks_as_the_operator(
    timed: tuple[SqliteStore, Clock],
) -> None:
    """Only tasks idle longer than the field's seconds are failed; the history names the
    local operator; a bad number is 400 and changes nothing."""
    store, clock = timed
    stale = await store.create(name="job")
    clock.now += 7200
    fresh = await store.create(name="job")
    clock.now += 60
    async with await _http(store) as http:
        form = Page((await http.get("/ops/")).text).form_with("Reclaim stale tasks")
        bad = await http.post(form.action, data={**form.fields, "older_than": "soon"})
        assert bad.status_code == 400
        assert "number of seconds" in Page(bad.text).all_text
        assert (await store.get(stale.task_id)).status is Status.WORKING
        done = await http.post(form.action, data={**form.fields, "older_than": "3600"})
        assert done.status_code == 200, done.text
        page = Page(done.text)
        assert "Reclaimed 1 task idle for more than 3600 s." in page.all_text
        assert (f"/ops/tasks/{stale.task_id}", stale.task_id) in page.links
    assert (await store.get(stale.task_id)).status is Status.FAILED
    assert (await store.get(fresh.task_id)).status is Status.WORKING
    last = (await store.history(stale.task_id))[-1]
    assert (last.actor, last.to_status) == (LOCAL_OPERATOR, Status.FAILED)
    assert last.reason.startswith("reclaimed: no update for 7260s")


async def test_purge_deletes_only_the_expired_finished_tasks(
    timed: tuple[SqliteStore, Clock],
) -> None:
    """A finished task past its TTL goes; a live one with the same TTL and a finished one
    within its TTL stay; without the CSRF field nothing happens (403)."""
    store, clock = timed
    expired = await store.create(name="job", ttl=60)
    await store.complete(expired.task_id, {"ok": True})
    live = await store.create(name="job", ttl=60)
    clock.now += 120
    kept = await store.create(name="job", ttl=60)
    await store.complete(kept.task_id, {"ok": True})
    async with await _http(store) as http:
        form = Page((await http.get("/ops/")).text).form_with("Purge expired tasks")
        assert (await http.post(form.action, data={})).status_code == 403
        assert sum((await store.counts()).values()) == 3
        done = await http.post(form.action, data=form.fields)
        assert done.status_code == 200, done.text
        assert "Purged 1 expired task." in Page(done.text).all_text
        assert expired.task_id in done.text
    left = {t.task_id for t in (await store.browse(limit=10)).tasks}
    assert left == {live.task_id, kept.task_id}


async def test_behind_auth_a_reclaim_is_recorded_under_the_token_name(
    timed: tuple[SqliteStore, Clock], tmp_path: Path
) -> None:
    """With --auth, the reclaimed task's history names the token's principal."""
    store, clock = timed
    tokens = TokenFile(tmp_path / "tokens.json")
    alice = tokens.add("alice")
    stale = await store.create(name="job")
    clock.now += 7200
    async with await _http(store, auth=TokenFileVerifier(tokens.path)) as http:
        http.headers["Authorization"] = f"Bearer {alice}"
        form = Page((await http.get("/ops/")).text).form_with("Reclaim stale tasks")
        done = await http.post(form.action, data={**form.fields, "older_than": "60"})
        assert done.status_code == 200, done.text
    last = (await store.history(stale.task_id))[-1]
    assert (last.actor, last.to_status) == ("alice", Status.FAILED)
