"""The console behind ``--auth``: the same token file and verifier as ``keel serve``.

Without a valid token every page and action is answered 401 with the sign-in form and
changes nothing; a bearer header or the session cookie the sign-in form sets lets the
operator in, and every action is recorded under the token's name. Off-loopback names are
served once a token is required.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from keel import ConfigurationError, Status
from keel.mcp.tokens import TokenFile, TokenFileVerifier
from keel.ops import standalone_app
from keel.ops.signin import SESSION
from keel.store import SqliteStore

from .conftest import BASE
from .page import Page

pytestmark = pytest.mark.anyio


@pytest.fixture
def tokens(tmp_path: Path) -> TokenFile:
    """A token file (mode 0600, as ``keel auth add-token`` makes it)."""
    return TokenFile(tmp_path / "tokens.json")


@pytest.fixture
async def guarded(
    store: SqliteStore, tokens: TokenFile
) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """A client on the console with ``--auth tokens:FILE``, and alice's token."""
    alice = tokens.add("alice")
    app = standalone_app(store, auth=TokenFileVerifier(tokens.path))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
        yield http, alice


async def test_without_a_valid_token_every_page_is_401_with_the_sign_in_form(
    guarded: tuple[httpx.AsyncClient, str], store: SqliteStore
) -> None:
    """No token, a wrong one, or a bad cookie: 401, the form, no task shown."""
    http, _ = guarded
    task = await store.create(name="job", owner="bob")
    for headers, cookies in [
        ({}, {}),
        ({"Authorization": "Bearer keel_wrong"}, {}),
        ({}, {SESSION: "keel_wrong"}),
    ]:
        http.cookies.clear()
        http.cookies.update(cookies)
        for url in ["/ops/", f"/ops/tasks/{task.task_id}", "/ops/events"]:
            response = await http.get(url, headers=headers)
            assert response.status_code == 401, url
            assert response.headers["www-authenticate"].startswith("Bearer")
            assert task.task_id not in response.text
            assert "Sign in" in Page(response.text).form_with("Sign in").buttons


async def test_an_action_without_a_token_is_refused_and_changes_nothing(
    guarded: tuple[httpx.AsyncClient, str], store: SqliteStore
) -> None:
    """A cancel POST without a token (even with a valid CSRF pair) is 401; the task runs."""
    http, _ = guarded
    task = await store.create(name="job")
    form = Page((await http.get("/ops/signin")).text).form_with("Sign in")
    refused = await http.post(
        f"/ops/tasks/{task.task_id}/cancel", data={"keel.csrf": form.fields["keel.csrf"]}
    )
    assert refused.status_code == 401
    assert (await store.get(task.task_id)).status is Status.WORKING


async def test_a_bearer_token_is_accepted_and_its_name_is_the_operator(
    guarded: tuple[httpx.AsyncClient, str], store: SqliteStore
) -> None:
    """``Authorization: Bearer TOKEN``: the pages answer; a cancel is recorded as alice's."""
    http, alice = guarded
    http.headers["Authorization"] = f"Bearer {alice}"
    task = await store.create(name="job", owner="bob")
    page = Page((await http.get(f"/ops/tasks/{task.task_id}")).text)
    assert "acting as alice" in page.all_text
    form = page.form_with("Cancel")
    done = await http.post(form.action, data=form.fields)
    assert done.status_code == 303, done.text
    last = (await store.history(task.task_id))[-1]
    assert (last.actor, last.to_status) == ("alice", Status.CANCELLED)


async def test_the_sign_in_form_keeps_the_token_in_a_strict_http_only_cookie(
    guarded: tuple[httpx.AsyncClient, str], store: SqliteStore, tokens: TokenFile
) -> None:
    """A wrong token is 401 with the reason; the right one sets the session cookie
    (HttpOnly, SameSite=Strict, path /ops); revoking the token signs the browser out;
    Sign out forgets the cookie."""
    http, alice = guarded
    task = await store.create(name="job")
    form = Page((await http.get("/ops/")).text).form_with("Sign in")
    wrong = await http.post(form.action, data={**form.fields, "token": "keel_nope"})
    assert wrong.status_code == 401
    assert "not accepted" in Page(wrong.text).all_text
    no_csrf = await http.post(form.action, data={"token": alice})
    assert no_csrf.status_code == 403
    signed = await http.post(form.action, data={**form.fields, "token": alice})
    assert signed.status_code == 303
    assert signed.headers["location"] == "/ops/"
    cookie = signed.headers["set-cookie"].lower()
    assert cookie.startswith(f"{SESSION}=")
    assert {"httponly", "samesite=strict", "path=/ops"} <= {p.strip() for p in cookie.split(";")}
    listed = await http.get("/ops/")
    assert listed.status_code == 200
    assert (f"/ops/tasks/{task.task_id}", task.task_id) in Page(listed.text).links
    signout = Page(listed.text).form_with("Sign out")
    out = await http.post(signout.action, data=signout.fields)
    assert out.status_code == 303
    assert (await http.get("/ops/")).status_code == 401
    again = Page((await http.get("/ops/signin")).text).form_with("Sign in")
    await http.post(again.action, data={**again.fields, "token": alice})
    assert (await http.get("/ops/")).status_code == 200
    tokens.revoke("alice")
    assert (await http.get("/ops/")).status_code == 401


async def test_with_auth_any_host_name_is_served(
    guarded: tuple[httpx.AsyncClient, str],
) -> None:
    """Behind a token the loopback-name rule is lifted (the console may listen anywhere)."""
    http, alice = guarded
    headers = {"Host": "ops.example.com", "Authorization": f"Bearer {alice}"}
    assert (await http.get("/ops/", headers=headers)).status_code == 200


@pytest.fixture
async def listed(
    store: SqliteStore, tokens: TokenFile
) -> AsyncIterator[tuple[httpx.AsyncClient, str, str]]:
    """The console with ``--auth tokens:FILE --operators alice``: alice's token and
    carol's, both valid, only alice's an operator's."""
    alice, carol = tokens.add("alice"), tokens.add("carol")
    app = standalone_app(store, auth=TokenFileVerifier(tokens.path), operators=["alice"])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
        yield http, alice, carol


async def test_a_valid_token_that_is_not_an_operators_is_403_and_changes_nothing(
    listed: tuple[httpx.AsyncClient, str, str], store: SqliteStore
) -> None:
    """carol's token is valid (for /mcp) but not on the operator list: every page and
    action is 403 with a page that says so, no task shown, a cancel changes nothing;
    alice's token is let in."""
    http, alice, carol = listed
    task = await store.create(name="job", owner="carol")
    form = Page((await http.get("/ops/signin")).text).form_with("Sign in")
    for method, url in [
        ("GET", "/ops/"),
        ("GET", f"/ops/tasks/{task.task_id}"),
        ("GET", "/ops/workers"),
        ("GET", "/ops/events"),
        ("POST", f"/ops/tasks/{task.task_id}/cancel"),
    ]:
        data = form.fields if method == "POST" else None
        response = await http.request(
            method, url, data=data, headers={"Authorization": f"Bearer {carol}"}
        )
        assert response.status_code == 403, url
        text = Page(response.text).all_text
        assert "the token of carol is valid, but carol is not an operator" in text
        assert task.task_id not in response.text
    assert (await store.get(task.task_id)).status is Status.WORKING
    assert len(await store.history(task.task_id)) == 1
    ok = await http.get("/ops/", headers={"Authorization": f"Bearer {alice}"})
    assert ok.status_code == 200
    assert "acting as alice" in Page(ok.text).all_text


async def test_the_sign_in_form_keeps_no_cookie_for_a_non_operator(
    listed: tuple[httpx.AsyncClient, str, str],
) -> None:
    """Signing in with carol's token: 403 and the reason, no session cookie; alice's
    signs in as before."""
    http, alice, carol = listed
    form = Page((await http.get("/ops/signin")).text).form_with("Sign in")
    refused = await http.post(form.action, data={**form.fields, "token": carol})
    assert refused.status_code == 403
    assert "carol is not an operator of this console" in Page(refused.text).all_text
    assert SESSION not in refused.headers.get("set-cookie", "")
    signed = await http.post(form.action, data={**form.fields, "token": alice})
    assert signed.status_code == 303
    assert (await http.get("/ops/")).status_code == 200


async def test_a_non_operator_holding_a_session_can_sign_out(
    listed: tuple[httpx.AsyncClient, str, str],
) -> None:
    """A browser whose cookie holds a valid non-operator token (the list changed since it
    signed in): 403 with a Sign out button, and Sign out works (back to the form)."""
    http, _, carol = listed
    http.cookies.set(SESSION, carol, domain="127.0.0.1", path="/ops")  # as signing in sets it
    refused = await http.get("/ops/")
    assert refused.status_code == 403
    signout = Page(refused.text).form_with("Sign out")
    out = await http.post(signout.action, data=signout.fields)
    assert out.status_code == 303
    assert out.headers["location"] == "/ops/signin"
    assert (await http.get("/ops/")).status_code == 401


async def test_an_operator_list_needs_auth_and_a_name(
    store: SqliteStore, tokens: TokenFile
) -> None:
    """``operators`` without ``auth`` (loopback: everyone is the operator) or empty is a
    ConfigurationError naming the problem."""
    with pytest.raises(ConfigurationError, match="operator list needs --auth"):
        standalone_app(store, operators=["alice"])
    tokens.add("alice")
    with pytest.raises(ConfigurationError, match="operator list is empty"):
        standalone_app(store, auth=TokenFileVerifier(tokens.path), operators=[])
