"""The operator console over HTTP: its real ASGI app on a real SQLite store.

The list links each task to its own page, shows statuses as words, filters with a GET
form and pages with a next link; a task's page shows its history, steps, arguments and
open input requests; Answer and Cancel are POST forms that need the CSRF token, validate
as ``tasks/update`` does, and are recorded in the history as the local operator's.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from keel import InputRejected, Status
from keel.model import InputRequest
from keel.model.validation import validate_input
from keel.ops import LOCAL_OPERATOR
from keel.store import SqliteStore

from .page import Page

pytestmark = pytest.mark.anyio

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "service": {"type": "string", "title": "Affected service", "enum": ["api", "db"]},
        "replicas": {"type": "integer", "minimum": 1},
        "urgent": {"type": "boolean"},
        "note": {"type": "string"},
    },
    "required": ["service", "replicas"],
}


async def _waiting(store: SqliteStore, **create: Any) -> str:
    ask = {"which": InputRequest("Which service, how many replicas?", SCHEMA)}
    task = await store.create(name="diagnose", input_requests=ask, **create)
    return task.task_id


async def _page(client: httpx.AsyncClient, url: str, status: int = 200) -> Page:
    response = await client.get(url)
    assert response.status_code == status, response.text
    return Page(response.text)


async def test_the_list_links_every_task_to_its_page_newest_first(
    client: httpx.AsyncClient, store: SqliteStore
) -> None:
    """/ops redirects to the list; each task is an <a> with its full id; statuses as words."""
    first = await store.create(name="job", arguments={"n": 1})
    await store.complete(first.task_id, {"ok": True})
    second = await _waiting(store, owner="alice")
    response = await client.get("/ops", follow_redirects=True)
    assert response.status_code == 200
    page = Page(response.text)
    tasks = [href for href, _ in page.links if href.startswith("/ops/tasks/")]
    assert tasks == [f"/ops/tasks/{second}", f"/ops/tasks/{first.task_id}"]
    assert (f"/ops/tasks/{second}", second) in page.links
    assert "completed" in page.all_text
    assert "input_required" in page.all_text
    assert "alice" in page.all_text
    assert not any("target" in a for a in response.text.split("<a ")[1:] if "/ops/tasks/" in a)
    home = await client.get("/", follow_redirects=False)
    assert home.headers["location"] == "/ops/"


async def test_filters_are_a_get_form_and_pages_have_a_next_link(
    client: httpx.AsyncClient, store: SqliteStore
) -> None:
    """The filter form GETs the list; ?limit pages, and the next link walks every task."""
    ids = [(await store.create(name="job")).task_id for _ in range(5)]
    waiting = await _waiting(store, owner="bob")
    page = await _page(client, "/ops/")
    form = page.form_with("Filter")
    assert form.method == "get"
    assert {"status", "name", "principal", "text", "created_from", "updated_to"} <= set(form.fields)
    only = await _page(client, "/ops/?status=input_required")
    assert [h for h, _ in only.links if h.startswith("/ops/tasks/")] == [f"/ops/tasks/{waiting}"]
    by_principal = await _page(client, "/ops/?principal=bob&name=diagnose")
    assert f"/ops/tasks/{waiting}" in dict(by_principal.links)
    seen: list[str] = []
    url: str | None = "/ops/?name=job&limit=2"
    while url is not None:
        current = await _page(client, url)
        seen += [h.rsplit("/", 1)[1] for h, _ in current.links if h.startswith("/ops/tasks/")]
        url = next((h for h, text in current.links if text.startswith("Next page")), None)
    assert sorted(seen) == sorted(ids)
    assert len(seen) == len(ids)


async def test_a_bad_filter_is_a_400_naming_it(client: httpx.AsyncClient) -> None:
    """A status or time that is not one is refused on the page, naming it."""
    bad = await _page(client, "/ops/?status=done", 400)
    assert "status 'done' is not a status" in bad.all_text
    bad = await _page(client, "/ops/?created_from=yesterday", 400)
    assert "created from must be a date-time" in bad.all_text
    bad = await _page(client, "/ops/?cursor=nope", 400)
    assert "is not one a page of tasks gave" in bad.all_text


async def test_the_task_page_shows_history_steps_arguments_and_the_answer_form(
    client: httpx.AsyncClient, store: SqliteStore
) -> None:
    """Input fields are named after the schema's properties, inside a form with Answer."""
    task_id = await _waiting(store, arguments={"incident_id": "INC-7"})
    page = await _page(client, f"/ops/tasks/{task_id}")
    text = page.all_text
    assert "input_required" in text
    assert "INC-7" in text
    assert "Which service" in text
    assert "created" in text
    assert "client" in text
    form = page.form_with("Answer")
    assert form.method == "post"
    assert form.action == f"/ops/tasks/{task_id}/answer"
    assert {"service", "replicas", "urgent", "note"} <= set(form.fields)
    assert form.inputs["service"] == "select"
    assert form.options["service"][-2:] == ["api", "db"]
    assert form.inputs["replicas"] == "input:number"
    assert page.form_with("Cancel").action == f"/ops/tasks/{task_id}/cancel"
    missing = await _page(client, "/ops/tasks/nope", 404)
    assert "No task has the id nope" in missing.all_text


async def test_the_task_page_shows_its_trace_and_last_claim(
    client: httpx.AsyncClient, store: SqliteStore
) -> None:
    """A task created in a span names its traceparent (to find the trace), and a claimed
    one when it was last claimed; one created outside any span, neither."""
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    traced = await store.create(name="job", trace_context={"traceparent": traceparent})
    await store.claim(["job"], worker="w1", lease_seconds=30)
    plain = await store.create(name="other")
    text = (await _page(client, f"/ops/tasks/{traced.task_id}")).all_text
    assert traceparent in text
    assert "last claimed" in text
    text = (await _page(client, f"/ops/tasks/{plain.task_id}")).all_text
    assert "trace" not in text
    assert "last claimed" not in text


async def _submit(
    client: httpx.AsyncClient, page: Page, button: str, **values: str
) -> httpx.Response:
    form = page.form_with(button)
    return await client.post(form.action, data={**form.fields, **values})


async def test_answering_through_the_form_resumes_the_task_as_the_operator(
    client: httpx.AsyncClient, store: SqliteStore
) -> None:
    """Converted per schema, accepted, ready again; the history names the local operator."""
    task_id = await _waiting(store)
    page = await _page(client, f"/ops/tasks/{task_id}")
    done = await _submit(client, page, "Answer", service="db", replicas="3", urgent="true")
    assert done.status_code == 303
    assert done.headers["location"] == f"/ops/tasks/{task_id}?done=answered"
    task = await store.get(task_id)
    assert task.status is Status.WORKING
    assert task.input_responses == {"which": {"service": "db", "replicas": 3, "urgent": True}}
    last = (await store.history(task_id))[-1]
    assert (last.actor, last.to_status) == (LOCAL_OPERATOR, Status.WORKING)
    after = await _page(client, done.headers["location"])
    assert "answered" in after.all_text
    assert "local operator" in after.all_text


@pytest.mark.parametrize(
    ("values", "answer"),
    [
        ({"service": "web", "replicas": "2"}, {"service": "web", "replicas": 2}),
        ({"service": "db", "replicas": "0"}, {"service": "db", "replicas": 0}),
        ({"service": "db", "replicas": "two"}, {"service": "db", "replicas": "two"}),
        ({"service": "db", "replicas": ""}, {"service": "db"}),
    ],
    ids=["not-in-enum", "below-minimum", "not-a-number", "missing"],
)
async def test_a_wrong_answer_is_refused_as_tasks_update_refuses_it(
    client: httpx.AsyncClient, store: SqliteStore, values: dict[str, str], answer: Any
) -> None:
    """A 400 with InputRejected's own message; the task still waits, its history unchanged."""
    task_id = await _waiting(store)
    before = await store.history(task_id)
    page = await _page(client, f"/ops/tasks/{task_id}")
    refused = await _submit(client, page, "Answer", **values)
    assert refused.status_code == 400
    with pytest.raises(InputRejected) as expected:
        validate_input(task_id, "which", SCHEMA, answer)
    assert str(expected.value) in Page(refused.text).all_text
    assert (await store.get(task_id)).status is Status.INPUT_REQUIRED
    assert await store.history(task_id) == before
    again = Page(refused.text).form_with("Answer")
    assert again.fields["service"] == values["service"] or values["service"] == "web"


async def test_cancel_stops_a_running_task_and_says_who(
    client: httpx.AsyncClient, store: SqliteStore
) -> None:
    """A leased task is cancelled at once; the reason and the operator are in the history."""
    task = await store.create(name="job")
    await store.claim(["job"], worker="w1", lease_seconds=30)
    page = await _page(client, f"/ops/tasks/{task.task_id}")
    assert "w1" in page.all_text  # the lease's worker
    done = await _submit(client, page, "Cancel", reason="stuck on a dead host")
    assert done.status_code == 303
    cancelled = await store.get(task.task_id)
    assert cancelled.status is Status.CANCELLED
    assert cancelled.lease_owner is None
    last = (await store.history(task.task_id))[-1]
    assert (last.actor, last.reason) == (LOCAL_OPERATOR, "cancelled: stuck on a dead host")
    finished = await _page(client, f"/ops/tasks/{task.task_id}")
    assert "Cancel" not in [b for f in finished.forms for b in f.buttons]


async def test_cancelling_a_task_that_completed_first_says_so(
    client: httpx.AsyncClient, store: SqliteStore
) -> None:
    """A 409 naming the outcome; the task stays completed."""
    task = await store.create(name="job")
    page = await _page(client, f"/ops/tasks/{task.task_id}")
    await store.complete(task.task_id, {"ok": True})
    refused = await _submit(client, page, "Cancel")
    assert refused.status_code == 409
    assert "completed" in Page(refused.text).all_text
    assert (await store.get(task.task_id)).status is Status.COMPLETED


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"keel.csrf": ""}, "carries no CSRF token"),
        ({"keel.csrf": "x" * 43}, "does not match"),
    ],
    ids=["missing", "wrong"],
)
async def test_a_post_without_the_right_token_is_refused(
    client: httpx.AsyncClient, store: SqliteStore, change: dict[str, str], problem: str
) -> None:
    """403 and nothing changed, for Answer and for Cancel."""
    task_id = await _waiting(store)
    page = await _page(client, f"/ops/tasks/{task_id}")
    for button in ("Answer", "Cancel"):
        values = {"service": "db", "replicas": "1"} if button == "Answer" else {}
        refused = await _submit(client, page, button, **values, **change)
        assert refused.status_code == 403
        assert problem in Page(refused.text).all_text
    assert (await store.get(task_id)).status is Status.INPUT_REQUIRED


async def test_a_post_from_another_site_is_refused(
    client: httpx.AsyncClient, store: SqliteStore
) -> None:
    """The right token but an Origin of another host: 403, and a fresh client has no cookie."""
    task_id = await _waiting(store)
    page = await _page(client, f"/ops/tasks/{task_id}")
    form = page.form_with("Cancel")
    refused = await client.post(form.action, data=form.fields, headers={"origin": "http://evil"})
    assert refused.status_code == 403
    assert "sent from another site" in Page(refused.text).all_text
    client.cookies.clear()
    refused = await client.post(form.action, data=form.fields)
    assert refused.status_code == 403
    assert (await store.get(task_id)).status is Status.INPUT_REQUIRED


async def test_the_token_cookie_is_strict_and_scoped_to_the_console(
    client: httpx.AsyncClient,
) -> None:
    """HttpOnly, SameSite=Strict, path /ops; a second page keeps the same token."""
    first = await client.get("/ops/")
    cookie = first.headers["set-cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie
    assert "Path=/ops" in cookie
    second = await client.get("/ops/")
    assert "set-cookie" not in second.headers
    assert second.headers["x-frame-options"] == "DENY"  # no clickjacking of the buttons
    assert second.headers["content-security-policy"] == "frame-ancestors 'none'"


async def test_retry_makes_a_new_linked_task_of_a_dead_lettered_one(
    client: httpx.AsyncClient, store: SqliteStore
) -> None:
    """Retry on a failed task's page: a new task, both pages linking to each other."""
    task = await store.create(name="job", arguments={"n": 7})
    claimed = (await store.claim(["job"], worker="w1", lease_seconds=30))[0]
    error = {"code": -32000, "message": "upstream refused"}
    await store.retry(task.task_id, error, fence=claimed.fence, delay_seconds=0)
    page = await _page(client, f"/ops/tasks/{task.task_id}")
    assert "upstream refused" in page.all_text
    done = await _submit(client, page, "Retry")
    assert done.status_code == 303
    new_id = done.headers["location"].split("/tasks/")[1].split("?")[0]
    assert new_id != task.task_id
    new = await store.get(new_id)
    assert new.arguments == {"n": 7}
    assert new.status is Status.WORKING
    assert (await store.get(task.task_id)).status is Status.FAILED
    shown = await _page(client, done.headers["location"])
    assert (f"/ops/tasks/{task.task_id}", task.task_id) in shown.links
    old = await _page(client, f"/ops/tasks/{task.task_id}")
    assert (f"/ops/tasks/{new_id}", new_id) in old.links
    assert (await store.history(new_id))[0].actor == LOCAL_OPERATOR


async def test_retry_of_a_task_that_did_not_fail_is_refused(
    client: httpx.AsyncClient, store: SqliteStore
) -> None:
    """No Retry button but a working task; a forged POST is a 409 naming the status."""
    task = await store.create(name="job")
    page = await _page(client, f"/ops/tasks/{task.task_id}")
    assert "Retry" not in [b for f in page.forms for b in f.buttons]
    form = page.form_with("Cancel")
    refused = await client.post(f"/ops/tasks/{task.task_id}/retry", data=form.fields)
    assert refused.status_code == 409
    assert "only a failed task can be retried" in Page(refused.text).all_text


async def test_bulk_cancel_counts_first_then_cancels_the_live_matches(
    client: httpx.AsyncClient, store: SqliteStore
) -> None:
    """The list's bulk form: a dry-run count of live matches, then Cancel N tasks."""
    live = [(await store.create(name="job", owner="bob")).task_id for _ in range(3)]
    done = await store.create(name="job", owner="bob")
    await store.complete(done.task_id, {"ok": True})
    other = await store.create(name="other", owner="bob")
    page = await _page(client, "/ops/?name=job&principal=bob")
    dry = await _submit(client, page, "Cancel matching tasks…")
    assert dry.status_code == 200
    counted = Page(dry.text)
    assert "Dry run: 3 live tasks match" in counted.all_text
    assert [(await store.get(i)).status for i in live] == [Status.WORKING] * 3
    confirm = counted.form_with("Cancel 3 tasks")
    assert (confirm.fields["name"], confirm.fields["principal"]) == ("job", "bob")
    await store.cancel(live[0])  # one finishes between the count and the confirmation
    stale = await client.post(confirm.action, data=confirm.fields)
    assert "The count changed since you looked (it was 3)" in Page(stale.text).all_text
    again = Page(stale.text).form_with("Cancel 2 tasks")
    finished = await client.post(again.action, data=again.fields)
    assert "Cancelled 2 tasks." in Page(finished.text).all_text
    for task_id in live[1:]:
        assert (await store.get(task_id)).status is Status.CANCELLED
        last = (await store.history(task_id))[-1]
        assert last.actor == LOCAL_OPERATOR
        assert last.reason == "cancelled: bulk cancel from the operator console"
    assert (await store.get(done.task_id)).status is Status.COMPLETED
    assert (await store.get(other.task_id)).status is Status.WORKING


async def test_bulk_cancel_needs_the_token_and_a_valid_filter(
    client: httpx.AsyncClient, store: SqliteStore
) -> None:
    """No token: 403, nothing cancelled; a bad filter: 400 naming it."""
    task = await store.create(name="job")
    page = await _page(client, "/ops/")
    form = page.form_with("Cancel matching tasks…")
    refused = await client.post(form.action, data={**form.fields, "keel.csrf": ""})
    assert refused.status_code == 403
    bad = await client.post(form.action, data={**form.fields, "status": "done"})
    assert bad.status_code == 400
    assert "status 'done' is not a status" in Page(bad.text).all_text
    assert (await store.get(task.task_id)).status is Status.WORKING


@pytest.mark.parametrize(
    ("host", "code"),
    [
        ("127.0.0.1:8000", 200),
        ("localhost:8001", 200),
        ("[::1]:8000", 200),
        ("127.0.0.1", 200),
        ("rebound.example:8000", 421),
        ("127.0.0.1.evil.example", 421),
    ],
)
async def test_only_loopback_host_names_are_answered(
    client: httpx.AsyncClient, host: str, code: int
) -> None:
    """DNS rebinding: a page of another site resolved to 127.0.0.1 gets nothing (421)."""
    response = await client.get("/ops/", headers={"host": host})
    assert response.status_code == code
    if code == 421:
        assert "loopback names only" in response.text
        assert "set-cookie" not in response.headers
