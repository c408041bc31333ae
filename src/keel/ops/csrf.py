"""CSRF protection for the console's forms: a double-submitted token.

Every page makes sure the browser holds a random token in a cookie (``SameSite=Strict``,
``HttpOnly``, scoped to the console's path) and puts the same token in a hidden field of
each form. A POST is accepted only when the field equals the cookie: another site can
make a browser send the cookie, but cannot read it to fill the field. A POST whose
``Origin`` names another host is refused as well.
"""

from __future__ import annotations

import hmac
import secrets
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response

__all__ = ["COOKIE", "FIELD", "check", "remember", "token_for"]

COOKIE = "keel_ops_csrf"
FIELD = "keel.csrf"


def token_for(request: Request) -> tuple[str, bool]:
    """The request's token, and whether it is new (then :func:`remember` it)."""
    token = request.cookies.get(COOKIE)
    if token and len(token) >= 32:
        return token, False
    return secrets.token_urlsafe(32), True


def remember(response: Response, request: Request, token: str) -> None:
    """Set the token cookie on ``response``, for the console's path only."""
    path = request.scope.get("root_path") or "/"
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path=path)


def check(request: Request, submitted: object) -> str | None:
    """Why a POST is refused (None: it carries the right token from this site)."""
    origin = request.headers.get("origin")
    if origin is not None and origin != "null" and urlsplit(origin).netloc != request.url.netloc:
        return f"the form was sent from another site ({origin})"
    cookie = request.cookies.get(COOKIE)
    if not cookie or not isinstance(submitted, str) or not submitted:
        return "the form carries no CSRF token: reload the page and try again"
    if not hmac.compare_digest(cookie.encode(), submitted.encode()):
        return "the form's CSRF token does not match this browser's: reload the page"
    return None
