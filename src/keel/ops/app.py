"""The operator console as an ASGI app: server-rendered pages over one store.

``GET /`` lists tasks newest first (filters as a GET form, a next-page link), ``GET
/tasks/{id}`` shows one task, and the actions are POST forms on ``/tasks/{id}/answer``
and ``/tasks/{id}/cancel``, each carrying the CSRF token (:mod:`keel.ops.csrf`). Every
link is relative to where the app is mounted (``keel serve`` mounts it at ``/ops``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from collections.abc import Callable, Collection, Mapping
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup, escape
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

if TYPE_CHECKING:
    from mcp.server.auth.provider import TokenVerifier

from keel.errors import ConfigurationError, InputRejected, InvalidPayload, KeelError, TaskNotFound
from keel.model import Status, Task
from keel.ops.actions import Actions
from keel.ops.bulk import MAX_BULK, cancel_all, live_matching
from keel.ops.counts import CachedCounts
from keel.ops.csrf import FIELD, check, remember, token_for
from keel.ops.forms import fields_of, value_of
from keel.ops.live import events
from keel.ops.signin import OPERATOR, RequireOperator, keep_session, operator_of
from keel.ops.workers import STUCK, health
from keel.store import Store
from keel.store.browse import TaskFilter

__all__ = ["LOCAL_OPERATOR", "MOUNT", "ops_app", "standalone_app"]

LOCAL_OPERATOR = "local operator"
"""Who the history says acted, for a console served on loopback (no sign-in)."""

PAGE = 50
WAITING_OVER = 3600
"""Seconds of waiting for input after which ``/workers`` calls a task stuck (default)."""
MOUNT = "/ops"
"""Where the console lives, in ``keel serve`` and in ``keel ops``."""
_TEXT_FILTERS = {"name": "name", "principal": "owner", "text": "text"}
_HEADERS = {
    # No other site may frame the console (its buttons act) or read where it came from.
    "Content-Security-Policy": "frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}
_TIME_FILTERS = ("created_from", "created_to", "updated_from", "updated_to")
_FILTERS = frozenset({"status", *_TEXT_FILTERS, *_TIME_FILTERS})


def _when(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return ""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S") + "Z"


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


_ENV = Environment(
    loader=PackageLoader("keel.ops", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
_TASK_ID = re.compile(r"\b[0-9a-f]{12}[A-Za-z0-9_-]{22}(?![A-Za-z0-9_-])")


def _link_ids(text: str, base: str) -> Markup:
    """``text`` escaped, each task id in it a link to that task's page."""
    escaped = str(escape(text))
    linked = _TASK_ID.sub(lambda m: f'<a href="{escape(base)}/tasks/{m[0]}">{m[0]}</a>', escaped)
    return Markup(linked)  # noqa: S704 - the text is escaped; an id is [A-Za-z0-9_-] only


_ENV.filters.update(when=_when, pretty=_pretty, link_ids=_link_ids)
_ENV.globals.update(statuses=[s.value for s in Status])


def _parse_time(name: str, raw: str) -> float:
    """A filter time: epoch seconds, or an ISO date-time (UTC unless it says otherwise)."""
    try:
        return float(raw)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(raw.strip().removesuffix("Z"))
    except ValueError:
        raise InvalidPayload(
            f"{name.replace('_', ' ')} must be a date-time (2026-12-03T12:00) or epoch seconds, "
            f"not {raw!r}"
        ) from None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


def _filter_of(query: dict[str, str]) -> TaskFilter:
    """The list page's query string as a store filter.

    Raises:
        InvalidPayload: a status or time that is not one, naming it.
    """
    given: dict[str, Any] = {}
    status = query.get("status", "")
    if status:
        if status not in {s.value for s in Status}:
            raise InvalidPayload(f"status {status!r} is not a status")
        given["status"] = Status(status)
    for form_name, field_name in _TEXT_FILTERS.items():
        if query.get(form_name):
            given[field_name] = query[form_name]
    for name in _TIME_FILTERS:
        if query.get(name):
            given[name] = _parse_time(name, query[name])
    return TaskFilter(**given)


def _limit(raw: str | None) -> int:
    """``?limit=N``: the page size (default :data:`PAGE`); the store checks its range."""
    if not raw:
        return PAGE
    try:
        return int(raw)
    except ValueError:
        raise InvalidPayload(f"limit must be a whole number, not {raw!r}") from None


class Console:
    """The pages and actions over one store."""

    def __init__(
        self,
        actions: Actions,
        verifier: TokenVerifier | None = None,
        clock: Callable[[], float] = time.time,
        deadlines: Mapping[str, float] | None = None,
        operators: frozenset[str] | None = None,
    ) -> None:
        self.actions = actions
        self.operators = operators
        self.clock = clock
        self.deadlines = dict(deadlines or {})
        self.store: Store = actions.store
        self.counts = CachedCounts(self.store)
        self.verifier = verifier

    def acting(self, request: Request) -> Actions:
        """The actions, made as the request's operator (its token's principal, if signed in)."""
        operator = request.scope.get(OPERATOR)
        if operator is None:
            return self.actions
        return dataclasses.replace(self.actions, operator=operator)

    def render(
        self, request: Request, template: str, status_code: int = 200, **context: Any
    ) -> HTMLResponse:
        token, new = token_for(request)
        signed_out = self.verifier is not None and OPERATOR not in request.scope
        html = _ENV.get_template(template).render(
            base=request.scope.get("root_path", ""),
            csrf_field=FIELD,
            csrf_token=token,
            operator=None if signed_out else self.acting(request).operator,
            signed_in=OPERATOR in request.scope,
            **context,
        )
        response = HTMLResponse(html, status_code=status_code, headers=_HEADERS)
        if new:
            remember(response, request, token)
        return response

    async def tasks(self, request: Request) -> Response:
        query = dict(request.query_params)
        counts, age = await self.counts.get()
        try:
            where = _filter_of(query)
            page = await self.store.browse(
                where, limit=_limit(query.get("limit")), cursor=query.get("cursor") or None
            )
        except InvalidPayload as exc:
            return self.render(
                request,
                "tasks.html",
                400,
                query=query,
                counts=counts,
                counts_age=age,
                tasks=(),
                error=str(exc),
            )
        more = None
        if page.next_cursor is not None:
            more = request.url.include_query_params(cursor=page.next_cursor)
        return self.render(
            request,
            "tasks.html",
            query=query,
            counts=counts,
            counts_age=age,
            tasks=page.tasks,
            next_url=more,
            error=None,
        )

    async def workers(self, request: Request) -> Response:
        """Live leases per worker, one worker's leases, stuck tasks (:mod:`keel.ops.workers`)."""
        query = request.query_params
        raw = query.get("waiting_over") or str(WAITING_OVER)
        page = partial(self.render, request, "workers.html", waiting_over_raw=raw, stuck_max=STUCK)
        try:
            limit = float(raw)
        except ValueError:
            limit = math.nan
        if not math.isfinite(limit) or limit < 0:
            return page(400, error=f"waiting_over must be seconds (0 or more), not {raw!r}")
        now = self.clock()
        try:
            view = await health(
                self.store,
                now,
                wait_limit=limit,
                deadlines=self.deadlines,
                worker=query.get("worker") or None,
                cursor=query.get("cursor") or None,
            )
        except InvalidPayload as exc:
            return page(400, error=str(exc))
        more = None
        if view.leases is not None and view.leases.next_cursor is not None:
            more = request.url.include_query_params(cursor=view.leases.next_cursor)
        return page(view=view, now=now, next_url=more, error=None)

    async def events(self, request: Request) -> Response:
        return events(self.store, request)

    async def task(self, request: Request, **context: Any) -> Response:
        task_id = request.path_params["task_id"]
        try:
            task = await self.store.get(task_id)
            history = await self.store.history(task_id)
            steps = await self.store.steps(task_id)
        except TaskNotFound:
            return self.render(request, "missing.html", 404, task_id=task_id)
        submitted: dict[str, dict[str, str]] = context.pop("submitted", {})
        forms = {
            key: fields_of(request_.schema, submitted.get(key))
            for key, request_ in task.pending_input.items()
        }
        return self.render(
            request,
            "task.html",
            context.pop("status_code", 200),
            task=task,
            history=history,
            steps=steps,
            forms=forms,
            notice=request.query_params.get("done"),
            error=context.pop("error", None),
        )

    async def _posted(self, request: Request) -> tuple[dict[str, str], Response | None]:
        form = await request.form()
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        problem = check(request, fields.get(FIELD))
        if problem is not None:
            return fields, self.render(request, "refused.html", 403, problem=problem)
        return fields, None

    def _back(self, request: Request, task: Task, done: str) -> Response:
        url = f"{request.scope.get('root_path', '')}/tasks/{task.task_id}?done={done}"
        return RedirectResponse(url, status_code=303)

    async def answer(self, request: Request) -> Response:
        fields, refused = await self._posted(request)
        if refused is not None:
            return refused
        task_id, key = request.path_params["task_id"], fields.get("keel.request", "")
        try:
            waiting = await self.store.get(task_id)
            asked = waiting.input_requests.get(key)
            schema = {} if asked is None else asked.schema
            task = await self.acting(request).answer(task_id, key, value_of(schema, fields))
        except TaskNotFound:
            return self.render(request, "missing.html", 404, task_id=task_id)
        except InputRejected as exc:
            return await self.task(
                request, error=str(exc), submitted={key: fields}, status_code=400
            )
        except KeelError as exc:  # not waiting any more, a key not open: say so
            return await self.task(request, error=str(exc), status_code=409)
        return self._back(request, task, "answered")

    async def retry(self, request: Request) -> Response:
        _, refused = await self._posted(request)
        if refused is not None:
            return refused
        task_id = request.path_params["task_id"]
        try:
            task = await self.acting(request).retry(task_id)
        except TaskNotFound:
            return self.render(request, "missing.html", 404, task_id=task_id)
        except KeelError as exc:  # it did not fail
            return await self.task(request, error=str(exc), status_code=409)
        return self._back(request, task, f"retry of {task_id}")

    async def bulk_cancel(self, request: Request) -> Response:
        """Count the live tasks the posted filter matches; cancel them once confirmed."""
        fields, refused = await self._posted(request)
        if refused is not None:
            return refused
        query = {k: v for k, v in fields.items() if k in _FILTERS and v}
        page = partial(self.render, request, "bulk.html", query=query, limit=MAX_BULK)
        try:
            ids = await live_matching(self.store, _filter_of(query))
        except InvalidPayload as exc:
            return page(400, error=str(exc), count=None)
        confirmed = fields.get("confirm")
        if confirmed != str(len(ids)):  # a dry run, or the count changed since
            return page(count=len(ids), changed=confirmed)
        cancelled, finished = await cancel_all(self.acting(request), ids)
        return page(count=len(ids), cancelled=cancelled, finished=finished)

    async def cancel(self, request: Request) -> Response:
        fields, refused = await self._posted(request)
        if refused is not None:
            return refused
        task_id = request.path_params["task_id"]
        try:
            task = await self.acting(request).cancel(task_id, fields.get("reason") or None)
        except TaskNotFound:
            return self.render(request, "missing.html", 404, task_id=task_id)
        except KeelError as exc:  # it completed or failed first
            return await self.task(request, error=str(exc), status_code=409)
        return self._back(request, task, "cancelled")

    async def reclaim(self, request: Request) -> Response:
        """Fail the live tasks idle for more than ``older_than`` seconds (store.reclaim)."""
        fields, refused = await self._posted(request)
        if refused is not None:
            return refused
        page = partial(self.render, request, "maintenance.html", title="Reclaim stale tasks")
        raw = fields.get("older_than", "")
        try:
            older_than = float(raw)
            done = await self.acting(request).reclaim(older_than)
        except ValueError:
            return page(400, error=f"idle time must be a number of seconds, not {raw!r}")
        except InvalidPayload as exc:
            return page(400, error=str(exc))
        outcome = f"Reclaimed {len(done)} task{'' if len(done) == 1 else 's'}"
        return page(outcome=f"{outcome} idle for more than {older_than:g} s.", reclaimed=done)

    async def purge(self, request: Request) -> Response:
        """Delete the finished tasks whose TTL has run out (store.purge)."""
        _, refused = await self._posted(request)
        if refused is not None:
            return refused
        ids = await self.acting(request).purge()
        outcome = f"Purged {len(ids)} expired task{'' if len(ids) == 1 else 's'}."
        return self.render(
            request, "maintenance.html", title="Purge expired tasks", outcome=outcome, purged=ids
        )

    def signin_form(
        self, request: Request, error: str | None = None, status_code: int = 401
    ) -> Response:
        """The sign-in form: HTTP 401 (no valid token yet), or 200 when asked for."""
        response = self.render(request, "signin.html", status_code, error=error)
        response.headers["WWW-Authenticate"] = 'Bearer realm="keel operator console"'
        return response

    def forbidden(self, request: Request, principal: str) -> Response:
        """HTTP 403 for a valid token that is not an operator's (``--operators``)."""
        return self.render(request, "forbidden.html", 403, principal=principal)

    async def signin(self, request: Request) -> Response:
        """``GET``: the form; ``POST``: check the token, keep it in the session cookie."""
        home = f"{request.scope.get('root_path', '')}/"
        if self.verifier is None:  # no sign-in on a console without --auth
            return RedirectResponse(home, status_code=303)
        if request.method == "GET":
            return self.signin_form(request, status_code=200)
        fields, refused = await self._posted(request)
        if refused is not None:
            return refused
        token = fields.get("token", "").strip()
        access = await self.verifier.verify_token(token) if token else None
        if access is None:
            return self.signin_form(request, "that token is not accepted (wrong or revoked)")
        principal = operator_of(access)
        if self.operators is not None and principal not in self.operators:
            return self.forbidden(request, principal)  # and no cookie for it
        response = RedirectResponse(home, status_code=303)
        keep_session(response, request, token)
        return response

    async def signout(self, request: Request) -> Response:
        """Forget the session cookie; back to the sign-in form."""
        _, refused = await self._posted(request)
        if refused is not None:
            return refused
        url = f"{request.scope.get('root_path', '')}/signin"
        response = RedirectResponse(url, status_code=303)
        keep_session(response, request, None)
        return response


_LOOPBACK_NAMES = re.compile(r"^(localhost|127(\.\d{1,3}){3}|\[::1\])(:\d+)?$", re.I)


class LoopbackHostOnly:
    """Refuse a request whose ``Host`` is not a loopback name (DNS rebinding: a page of
    another site whose name was made to resolve to 127.0.0.1 would otherwise read the
    console, its CSRF token included, as its own origin)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = Headers(scope=scope).get("host", "")
            if not _LOOPBACK_NAMES.match(host):
                refusal = PlainTextResponse(
                    f"the operator console answers loopback names only, not {host!r}\n", 421
                )
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _nothing() -> None:
    pass


def ops_app(
    store: Store,
    *,
    operator: str = LOCAL_OPERATOR,
    on_ready: Callable[[], None] | None = None,
    on_cancel: Callable[[str], None] | None = None,
    auth: TokenVerifier | None = None,
    clock: Callable[[], float] = time.time,
    deadlines: Mapping[str, float] | None = None,
    operators: Collection[str] | None = None,
) -> Starlette:
    """The console over ``store``; its actions are recorded as made by ``operator``.

    ``on_ready`` / ``on_cancel`` wake this process's workers after an answer or a cancel
    (``keel serve`` passes its app's event hub); the store tells other processes.
    ``clock`` is the time ``/workers`` judges leases and waits by (tests pass one);
    ``deadlines`` (seconds by tool name: the app's ``deadline_seconds``) the attempts.

    With ``auth`` (the verifier of ``--auth``, :mod:`keel.ops.signin`), every page needs a
    token it accepts, and actions are recorded as made by the token's principal; it may
    then be served on any host. Without it, only loopback ``Host`` names are answered.
    With ``operators`` (principals' names, ``auth`` required), the valid token of anyone
    else is answered 403.

    Raises:
        ConfigurationError: ``operators`` without ``auth``, or an empty list.
    """
    allowed = None if operators is None else frozenset(operators)
    if allowed is not None and (auth is None or not allowed):
        raise ConfigurationError(
            "an operator list needs --auth (without it, on loopback, everyone is the operator)"
            if auth is None
            else "the operator list is empty: name at least one operator"
        )
    console = Console(
        Actions(store, operator, on_ready or _nothing, on_cancel or (lambda _task_id: None)),
        auth,
        clock,
        deadlines,
        allowed,
    )
    guard = (
        Middleware(LoopbackHostOnly)
        if auth is None
        else Middleware(
            RequireOperator,
            verifier=auth,
            refuse=console.signin_form,
            operators=allowed,
            forbid=console.forbidden,
        )
    )
    return Starlette(
        middleware=[guard],
        routes=[
            Route("/signin", console.signin, methods=["GET", "POST"], name="signin"),
            Route("/signout", console.signout, methods=["POST"], name="signout"),
            Route("/", console.tasks, methods=["GET"], name="tasks"),
            Route("/workers", console.workers, methods=["GET"], name="workers"),
            Route("/events", console.events, methods=["GET"], name="events"),
            Route("/bulk-cancel", console.bulk_cancel, methods=["POST"], name="bulk_cancel"),
            Route("/reclaim", console.reclaim, methods=["POST"], name="reclaim"),
            Route("/purge", console.purge, methods=["POST"], name="purge"),
            Route("/tasks/{task_id}", console.task, methods=["GET"], name="task"),
            Route("/tasks/{task_id}/answer", console.answer, methods=["POST"], name="answer"),
            Route("/tasks/{task_id}/cancel", console.cancel, methods=["POST"], name="cancel"),
            Route("/tasks/{task_id}/retry", console.retry, methods=["POST"], name="retry"),
        ],
    )


def standalone_app(
    store: Store,
    *,
    operator: str = LOCAL_OPERATOR,
    auth: TokenVerifier | None = None,
    clock: Callable[[], float] = time.time,
    deadlines: Mapping[str, float] | None = None,
    operators: Collection[str] | None = None,
) -> Starlette:
    """What ``keel ops`` serves: the console at :data:`MOUNT`, and ``/`` leading there.

    Raises:
        ConfigurationError: see :func:`ops_app`.
    """
    console = ops_app(
        store, operator=operator, auth=auth, clock=clock, deadlines=deadlines, operators=operators
    )

    async def home(request: Request) -> Response:
        return RedirectResponse(f"{MOUNT}/", status_code=307)

    return Starlette(
        routes=[
            Route("/", home),
            Mount(MOUNT, console),
        ]
    )
