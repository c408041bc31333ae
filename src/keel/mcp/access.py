"""Who may reach ``keel serve`` over HTTP: bind safety, Host / Origin allow-lists, the
limits on old-protocol sessions, and the bearer authentication the server is built with.

* **Bind safety** (:func:`bind_problem`): a server listening on anything but a loopback
  address must authenticate its clients (``--auth``), unless the operator says
  otherwise in so many words (``--insecure-no-auth``).
* **Host / Origin allow-lists** (:class:`HttpAccess`), on every bind, loopback included:
  the SDK's own DNS-rebinding protection (``TransportSecuritySettings``), given to its
  Streamable HTTP transport and, through :class:`HostOriginGuard`, put in front of every
  other route the app serves (the protected-resource metadata, custom routes). A wrong
  ``Host`` is answered 421, a wrong ``Origin`` 403, before authentication is looked at.
* **Old-protocol sessions** (2025-11-25 clients, which keep a session per connection in
  the server's memory): at most :data:`MAX_SESSIONS` at once (more are refused:
  :class:`SessionsFull`), each closed after :data:`SESSION_IDLE_TIMEOUT` seconds without
  a request, and opened at a bounded rate, the requests over it waiting their turn in a
  bounded queue before the SDK sees them (:mod:`keel.mcp.admission`). Current-protocol
  (2026-07-28) requests hold no session and are neither counted nor held.
* **Authentication** (:class:`ServerAuth`): a ``TokenVerifier`` (bearer tokens of a token
  file, :mod:`keel.mcp.tokens`; JWTs of an OAuth 2.1 authorization server,
  :mod:`keel.mcp.jwt_auth`) and the SDK's ``AuthSettings``, which the ``MCPServer`` is
  built with (``keel.mcp.serving.app_server``): the SDK then answers 401 with
  ``WWW-Authenticate`` to a request without a valid token, and the token's principal owns
  the tasks it creates. A verifier that cannot check a token because what it relies on
  is down (the JWKS of ``--auth jwt`` unreachable) says so with
  :func:`report_auth_outage`, and :class:`AuthOutageGuard` answers that request 503
  with ``Retry-After`` instead of the SDK's 401, which would tell the client that its
  token is bad.
"""

from __future__ import annotations

import ipaddress
import json
import math
import socket
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from mcp.server import MCPServer
from mcp.server.auth.provider import TokenVerifier
from mcp.server.auth.settings import AuthSettings
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from keel.errors import ConfigurationError
from keel.mcp.admission import SessionAdmission, SessionGate, SessionRate, opens_session
from keel.mcp.wire import AUTH_UNAVAILABLE, SESSIONS_FULL

__all__ = [
    "AUTH_OUTAGE_RETRY",
    "LOOPBACK_HOSTS",
    "MAX_SESSIONS",
    "SESSION_IDLE_TIMEOUT",
    "AuthOutageGuard",
    "HostOriginGuard",
    "HttpAccess",
    "ServerAuth",
    "SessionsFull",
    "bind_problem",
    "is_loopback",
    "own_url",
    "report_auth_outage",
]

MAX_SESSIONS = 1_000
"""Old-protocol sessions open at once, by default (the SDK's own default is 10,000: a
flood of ``initialize`` calls took a server to 462 MB before it)."""
SESSIONS_FULL_RETRY = 5.0  # seconds a client refused a session is told to wait
AUTH_OUTAGE_RETRY = 5.0  # seconds a client whose token could not be checked is told to wait
SESSION_IDLE_TIMEOUT = 300.0  # seconds an old-protocol session may sit idle (SDK: 1,800)
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
"""Host names every server answers to, with any port: a client on the same machine."""
WILDCARD = frozenset({"0.0.0.0", "::", ""})  # noqa: S104 - names of the wildcard binds


@dataclass(frozen=True, slots=True)
class ServerAuth:
    """How a server authenticates its clients: the SDK's ``AuthSettings`` and the
    ``TokenVerifier`` that checks each bearer token, as ``MCPServer`` takes them."""

    settings: AuthSettings
    verifier: TokenVerifier
    description: str
    """How ``keel serve``'s startup message names it (``bearer tokens of FILE``)."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) reaches this machine only: a loopback
    address, ``localhost``, or a name every address of which is a loopback one."""
    name = host.strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False  # keel serve's port check names the problem
    addresses = {str(info[4][0]) for info in infos}
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def bind_problem(host: str, *, authenticated: bool, insecure_no_auth: bool) -> str | None:
    """What is wrong with serving on ``host`` with (or without) authentication: None when
    nothing is, or when the operator chose ``--insecure-no-auth``."""
    if authenticated or insecure_no_auth or is_loopback(host):
        return None
    return (
        f"--host {host} is reachable from other machines, and no --auth is set: choose "
        "--auth tokens:FILE (keel auth add-token NAME) or --auth jwt, or say "
        "--insecure-no-auth to serve anyone who can reach it"
    )


def _host_port(host: str, port: int) -> str:
    """``host:port`` as a ``Host`` header spells it (an IPv6 address in brackets)."""
    name = host.strip("[]")
    try:
        if ipaddress.ip_address(name).version == 6:
            return f"[{name}]:{port}"
    except ValueError:
        pass
    return f"{host}:{port}"


def own_url(host: str, port: int, path: str = "") -> str:
    """``http://host:port`` + ``path``: where a server bound to ``host:port`` is."""
    return f"http://{_host_port(host, port)}{path}"


def _with_ports(host: str) -> list[str]:
    """A host the operator allows: as given if it names a port, else with any port or
    none (a reverse proxy on port 80 or 443 sends the bare name)."""
    bare = host.rsplit("]", 1)[-1] if host.startswith("[") else host
    if ":" in bare:  # host:port (or [v6]:port)
        return [host]
    return [host, f"{host}:*"]


def _bound_hosts(host: str, port: int) -> list[str]:
    """The names a server bound to ``host:port`` is reached by, besides loopback ones:
    the address itself, or (a wildcard bind) this machine's own name."""
    if host in WILDCARD:
        return [_host_port(socket.gethostname(), port)] if port else []
    if is_loopback(host):
        return []
    return [_host_port(host, port) if port else f"{host}:*"]


@dataclass(frozen=True, slots=True)
class HttpAccess:
    """The Host / Origin allow-lists and the old-protocol session limits of one server.

    Patterns are the SDK's: an exact ``Host`` (``mcp.example.com:8443``) or a name with
    any port (``mcp.example.com:*``); origins likewise (``https://app.example.com``).
    """

    allowed_hosts: tuple[str, ...]
    allowed_origins: tuple[str, ...]
    max_sessions: int | None = MAX_SESSIONS
    session_idle_timeout: float | None = SESSION_IDLE_TIMEOUT
    session_rate: SessionRate = field(default_factory=SessionRate)

    @classmethod
    def for_bind(
        cls,
        host: str,
        port: int,
        *,
        hosts: Iterable[str] = (),
        origins: Iterable[str] = (),
        max_sessions: int | None = MAX_SESSIONS,
        session_idle_timeout: float | None = SESSION_IDLE_TIMEOUT,
        session_rate: SessionRate | None = None,
    ) -> HttpAccess:
        """The defaults for a server bound to ``host:port`` (loopback names with any
        port, the bound address, or this machine's name on a wildcard bind), plus the
        ``hosts`` and ``origins`` the operator allows. Each allowed host allows its own
        ``http://`` and ``https://`` origins: a page served from the server itself.

        Raises:
            ConfigurationError: an allowed host or origin that cannot be one.
        """
        extra = [_checked_host(h) for h in hosts]
        allowed = [f"{name}:*" for name in LOOPBACK_HOSTS] + _bound_hosts(host, port)
        for name in extra:
            allowed += _with_ports(name)
        own_origins = [f"{scheme}://{name}" for name in allowed for scheme in ("http", "https")]
        return cls(
            allowed_hosts=_unique(allowed),
            allowed_origins=_unique([*own_origins, *(_checked_origin(o) for o in origins)]),
            max_sessions=max_sessions,
            session_idle_timeout=session_idle_timeout,
            session_rate=session_rate or SessionRate(),
        )

    @property
    def transport_security(self) -> TransportSecuritySettings:
        """The SDK's settings for these allow-lists (DNS-rebinding protection on)."""
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=list(self.allowed_hosts),
            allowed_origins=list(self.allowed_origins),
        )

    def app(
        self,
        server: MCPServer[Any],
        *,
        host: str,
        mounts: Mapping[str, ASGIApp] | None = None,
        gate: SessionGate | None = None,
        **options: Any,
    ) -> ASGIApp:
        """``server``'s Streamable HTTP app (``options`` as ``streamable_http_app`` takes
        them) with these limits and ``mounts`` (other apps by path) beside it, every route
        behind the allow-lists; new sessions admitted by ``gate`` (default: one of
        :attr:`session_rate` on the monotonic clock; tests give one with a clock of
        their own), unless ``stateless_http``: then the SDK keeps no session."""
        security = self.transport_security
        app = server.streamable_http_app(
            host=host,
            transport_security=security,
            max_sessions=self.max_sessions,
            session_idle_timeout=self.session_idle_timeout,
            **options,
        )
        for path, mounted in (mounts or {}).items():
            app.mount(path, mounted)
        if options.get("stateless_http"):
            return HostOriginGuard(SessionsFull(AuthOutageGuard(app), self), security)
        endpoint = str(options.get("streamable_http_path", "/mcp"))
        gate = gate or SessionGate(self.session_rate)
        full = SessionsFull(AuthOutageGuard(app), self, on_full=gate.found_full)
        admission = SessionAdmission(
            full, gate, endpoint, queue_full=_queue_full(gate.limits), sessions_full=full.refusal
        )
        return HostOriginGuard(admission, security)

    def describe(self) -> list[str]:
        """Lines for ``keel serve``'s startup message."""
        idle = "never" if self.session_idle_timeout is None else f"{self.session_idle_timeout:g} s"
        return [
            f"  hosts:   {', '.join(self.allowed_hosts)}",
            f"  origins: {', '.join(o for o in self.allowed_origins if o.startswith('http://'))}"
            " (and https)",
            f"  2025-11-25 sessions: at most {self.max_sessions}, closed when idle {idle}",
            self.session_rate.describe(),
        ]


def _queue_full(limits: SessionRate) -> Response:
    """The answer to a session-opening request beyond the queue (prepared once: the
    same bytes for every such request)."""
    waiting = (
        f"{limits.queue} requests are already waiting to open a 2025-11-25 session, the "
        "most that may wait"
        if limits.queue
        else "a request to open a 2025-11-25 session came sooner than the rate allows, and "
        "none may wait"
    )
    return _retry_response(
        SESSIONS_FULL,
        f"{waiting} (keel serve --session-queue); requests to open one are let through at "
        f"{limits.rate:g} a second (--session-rate): try again in {limits.drain_seconds:g} s, "
        "or use protocol 2026-07-28, which needs no session",
        limits.drain_seconds,
    )


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def _checked_host(host: str) -> str:
    """An allowed ``Host``: a name or address, perhaps with ``:port`` or ``:*``."""
    if not host or any(c in host for c in "/ \t\r\n\x00@?#") or not host.isprintable():
        raise ConfigurationError(
            f"--allowed-host {host!r}: expected a host name, host:port or host:* "
            "(no scheme, no path)"
        )
    return host


def _checked_origin(origin: str) -> str:
    """An allowed ``Origin``: ``scheme://host[:port]``, as a browser sends it."""
    scheme, sep, rest = origin.partition("://")
    if (
        not sep
        or scheme not in {"http", "https"}
        or not rest
        or any(c in rest for c in "/ \t\r\n\x00@?#")
        or not origin.isprintable()
    ):
        raise ConfigurationError(
            f"--allowed-origin {origin!r}: expected http(s)://host[:port] (no path), "
            "as a browser sends it"
        )
    return origin


class HostOriginGuard:
    """ASGI middleware: every HTTP request's ``Host`` and ``Origin`` checked against the
    allow-lists before the app sees it (421 / 403 otherwise).

    The SDK applies its ``TransportSecuritySettings`` to the MCP endpoint only; its
    public seam for the rest is ``TransportSecurityMiddleware.validate_request``, used
    here for every route. (The Content-Type of a POST is left to each route: the MCP
    endpoint checks its own.)
    """

    def __init__(self, app: ASGIApp, settings: TransportSecuritySettings) -> None:
        self.app = app
        self.security = TransportSecurityMiddleware(settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refused = await self.security.validate_request(Request(scope), is_post=False)
            if refused is not None:
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)


class SessionsFull:
    """ASGI middleware: the SDK's refusal of a new old-protocol session at the session
    limit (HTTP 503, JSON-RPC ``-32603 "Too many open sessions"``) told as what it is:
    :data:`~keel.mcp.wire.SESSIONS_FULL`, naming the limit and what to do, with
    ``data.retryAfterMs`` and a ``Retry-After`` header. Any other answer passes as is.

    The SDK has no seam for that answer; its session manager writes it itself. This
    watches the responses to requests that would open a session
    (:func:`~keel.mcp.admission.opens_session`) and replaces that one body, recognised
    by status and message, then tells ``on_full`` (the :class:`SessionGate`, which
    refuses the next ones itself for a while).
    """

    SDK_MESSAGE = b"Too many open sessions"

    def __init__(
        self, app: ASGIApp, access: HttpAccess, on_full: Callable[[], None] | None = None
    ) -> None:
        self.app = app
        self.access = access
        self.on_full = on_full
        self.refusal = self._refusal()
        """The answer, prepared once (the same bytes every time)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not opens_session(scope):
            await self.app(scope, receive, send)
            return
        held: list[Message] = []  # a 503's messages, until its body shows what it is

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 503:
                held.append(message)
                return
            if not held:
                await send(message)
                return
            held.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                body = b"".join(m.get("body", b"") for m in held[1:])
                if self.SDK_MESSAGE in body:
                    if self.on_full is not None:
                        self.on_full()
                    await self.refusal(scope, receive, send)
                else:
                    for kept in held:
                        await send(kept)
                held.clear()

        await self.app(scope, receive, watch)

    def _refusal(self) -> Response:
        idle = self.access.session_idle_timeout
        message = (
            f"the server has {self.access.max_sessions} 2025-11-25 sessions open, its limit "
            "(keel serve --max-sessions): try again when one ends"
            + (f" or idles out ({idle:g} s)" if idle is not None else "")
            + ", or use protocol 2026-07-28, which needs no session"
        )
        return _retry_response(SESSIONS_FULL, message, SESSIONS_FULL_RETRY)


@dataclass(slots=True)
class _Outage:
    """What one request's token check could not reach, if anything."""

    causes: list[str] = field(default_factory=list[str])


_OUTAGE: ContextVar[_Outage | None] = ContextVar("keel_auth_outage", default=None)
"""The current request's :class:`_Outage` (set by :class:`AuthOutageGuard`)."""


def report_auth_outage(cause: str) -> None:
    """Tell the request being served that its token could not be checked because of
    ``cause`` (what is down, e.g. "the JWKS at URL cannot be fetched: ..."), not because
    it is bad. The verifier then returns None as usual; :class:`AuthOutageGuard` turns
    the SDK's 401 into a 503. Outside a guarded request this does nothing."""
    outage = _OUTAGE.get()
    if outage is not None:
        outage.causes.append(cause)


class AuthOutageGuard:
    """ASGI middleware: a request whose token could not be checked because the
    authentication's own infrastructure failed (:func:`report_auth_outage`) is answered
    HTTP 503 with ``Retry-After`` and a JSON-RPC error
    (:data:`~keel.mcp.wire.AUTH_UNAVAILABLE`, naming the cause, ``data.retryAfterMs``),
    not the SDK's 401 ``invalid_token``: the client's token may be perfectly good.

    The SDK's bearer backend has no way to tell "bad token" from "cannot check": its
    verifier returns a principal or None. The verifier reports the outage through a
    context variable this sets for each request (the same task runs the SDK's
    authentication), and only a 401 of a request that reported one is replaced.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        outage = _Outage()
        reset = _OUTAGE.set(outage)
        replaced = False

        async def watch(message: Message) -> None:
            nonlocal replaced
            if message["type"] == "http.response.start":
                replaced = message["status"] == 401 and bool(outage.causes)
                if replaced:
                    await _outage_response(outage.causes[-1])(scope, receive, send)
                    return
            if not replaced:  # the replaced 401's body is dropped
                await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            _OUTAGE.reset(reset)


def _outage_response(cause: str) -> Response:
    message = (
        f"cannot check the access token now: {cause}. This is the server's authentication "
        f"failing, not the token: try again in {AUTH_OUTAGE_RETRY:g} s"
    )
    return _retry_response(AUTH_UNAVAILABLE, message, AUTH_OUTAGE_RETRY)


def _retry_response(code: int, message: str, retry_after: float) -> Response:
    """HTTP 503 with ``Retry-After`` and a JSON-RPC error (no request id): ``code``,
    ``message`` and ``data.retryAfterMs``. The response may be sent any number of times."""
    error = {"code": code, "message": message, "data": {"retryAfterMs": round(retry_after * 1000)}}
    return Response(
        json.dumps({"jsonrpc": "2.0", "id": None, "error": error}),
        status_code=503,
        media_type="application/json",
        headers={"Retry-After": str(max(1, math.ceil(retry_after)))},
    )
