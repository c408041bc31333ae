"""Signing in to the console with a bearer token (``keel ops --auth``, ``keel serve --auth``).

The console takes the same tokens as the MCP endpoint, checked by the same verifier
(:class:`~keel.mcp.access.ServerAuth`'s ``TokenVerifier``: a token file's, or JWTs'), and
records the token's principal as the operator of every action. A request carries it as
``Authorization: Bearer TOKEN`` (programs), or in the session cookie a browser gets by
posting the token once to the sign-in form (``POST /signin``): the cookie holds the
token itself (``HttpOnly``, ``SameSite=Strict``, ``Secure`` over HTTPS, scoped to the
console's path), so it is checked again on every request and a revoked token is refused
at once, as on ``/mcp``. A request without a valid token gets the sign-in form with HTTP
401; the form is CSRF-protected like every other one (:mod:`keel.ops.csrf`).

A valid token is not always an operator's: with an operator list (``--operators
NAME[,NAME]``, :func:`parse_operators`), only those principals may use the console,
and a valid token of anyone else gets HTTP 403 with a page that says so (nothing of
the console is shown, the sign-in form refuses to keep such a token). Without a list,
every valid token is an operator's, as on a console with a token file of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from mcp.server.auth.provider import AccessToken, TokenVerifier
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = [
    "OPERATOR",
    "SESSION",
    "SIGNIN_PATHS",
    "RequireOperator",
    "operator_of",
    "parse_operators",
    "token_of",
]

SESSION = "keel_ops_session"
"""The cookie that keeps a signed-in browser's token."""
OPERATOR = "keel.ops.operator"
"""The scope key the operator's name is kept under, once its token is checked."""
SIGNIN_PATHS = frozenset({"/signin"})
"""Paths (below the console's mount) served without a token: the sign-in form itself."""
SIGNOUT_PATH = "/signout"
"""Served to any valid token, an operator's or not (a refused one must be able to leave)."""


def token_of(request: Request) -> str | None:
    """The bearer token a request carries: its ``Authorization`` header, else the cookie."""
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.cookies.get(SESSION) or None


def operator_of(access: AccessToken) -> str:
    """The name an accepted token acts as: its principal (a token file's token name, a
    JWT's ``sub``)."""
    return access.subject or access.client_id


def parse_operators(names: str | Collection[str] | None) -> frozenset[str] | None:
    """The operator list of ``--operators`` (``"alice,bob"``) or of keel.toml (a list of
    names, or that string); None when none is given (every valid token is an operator's).

    Raises:
        ValueError: an empty name (``"alice,,bob"``), or no name at all.
    """
    if names is None:
        return None
    given = names.split(",") if isinstance(names, str) else list(names)
    if not all(isinstance(name, str) for name in given):
        raise ValueError(f"operators must be names, not {names!r}")
    cleaned = [name.strip() for name in given]
    if not cleaned or not all(cleaned):
        raise ValueError(f"operators must be names separated by commas, not {names!r}")
    return frozenset(cleaned)


def keep_session(response: Response, request: Request, token: str | None) -> None:
    """Set (``token``) or clear (None) the session cookie on ``response``."""
    path = request.scope.get("root_path") or "/"
    if token is None:
        response.delete_cookie(SESSION, path=path, httponly=True, samesite="strict")
        return
    secure = request.url.scheme == "https"
    response.set_cookie(SESSION, token, httponly=True, samesite="strict", secure=secure, path=path)


class RequireOperator:
    """ASGI middleware: every request but the sign-in form's needs a token ``verifier``
    accepts; its principal is put in the scope (:data:`OPERATOR`). Others get
    ``refuse(request)``: the sign-in form, HTTP 401. With ``operators``, a principal not
    among them gets ``forbid(request, principal)``: HTTP 403."""

    def __init__(
        self,
        app: ASGIApp,
        verifier: TokenVerifier,
        refuse: Callable[[Request], Response],
        operators: frozenset[str] | None = None,
        forbid: Callable[[Request, str], Response] | None = None,
    ) -> None:
        self.app = app
        self.verifier = verifier
        self.refuse = refuse
        self.operators = operators
        self.forbid = forbid

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        inner = scope["path"].removeprefix(scope.get("root_path", "")) or "/"
        if inner not in SIGNIN_PATHS:
            token = token_of(request)
            access = None if token is None else await self.verifier.verify_token(token)
            if access is None:
                await self.refuse(request)(scope, receive, send)
                return
            name = operator_of(access)
            if self.operators is not None and name not in self.operators and inner != SIGNOUT_PATH:
                assert self.forbid is not None  # given with operators
                await self.forbid(request, name)(scope, receive, send)
                return
            if self.operators is None or name in self.operators:
                scope[OPERATOR] = name
        await self.app(scope, receive, send)
