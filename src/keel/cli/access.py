"""``keel serve``'s access options: authentication, bind safety, Host / Origin
allow-lists and old-protocol session limits (what they do: :mod:`keel.mcp.access`).

They are read like keel serve's other options (command line, environment, the
``[serve]`` table of keel.toml: ``auth``, ``insecure_no_auth``, ``allowed_hosts``,
``allowed_origins``, ``max_sessions``, ``session_idle_timeout``, ``session_rate``,
``session_burst``, ``session_queue``, ``session_openings``, ``jwt_issuer``,
``jwt_audience``, ``jwt_jwks_url``, ``operators``), and reach ``serve`` among its other
keyword arguments, which :func:`serve_access` takes them from.

``--operators NAME[,NAME]`` (keel.toml: a list of names) limits the operator console
to those principals (token names, JWT subjects): another valid token may call ``/mcp``
but gets 403 from ``/ops``. Without it every valid token is an operator's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from keel.cli.common import KeelCliError, warn

if TYPE_CHECKING:
    from mcp.server import MCPServer

    from keel.mcp.access import HttpAccess, ServerAuth

__all__ = [
    "ACCESS_KEYS",
    "ACCESS_OPTIONS",
    "AUTH_OPTIONS",
    "ServeAccess",
    "access_problem",
    "check_served",
    "console_auth",
    "console_operators",
    "operators_line",
    "refuse_over_stdio",
    "serve_access",
]

ACCESS_KEYS = frozenset(
    {
        "auth", "insecure_no_auth", "allowed_hosts", "allowed_origins", "max_sessions",
        "session_idle_timeout", "session_rate", "session_burst", "session_queue",
        "session_openings", "jwt_issuer", "jwt_audience", "jwt_jwks_url", "operators",
    }
)  # fmt: skip
"""The ``[serve]`` keys of these options (the parameter names ``serve`` receives)."""

DEFAULT_MAX_SESSIONS = 1_000  # keel.mcp.access.MAX_SESSIONS (not imported: keel --help stays fast)
DEFAULT_IDLE = 300.0  # seconds: keel.mcp.access.SESSION_IDLE_TIMEOUT
# keel.mcp.admission.SESSION_RATE (a second), SESSION_BURST, SESSION_QUEUE, SESSION_OPENINGS
DEFAULT_RATE, DEFAULT_BURST, DEFAULT_QUEUE, DEFAULT_OPENINGS = 50.0, 50, 200, 8


class _Names(click.ParamType[str]):
    """Names separated by commas on the command line; in keel.toml, a list of names too
    (given back as one string, commas between them: :func:`parse_operators` splits it)."""

    name = "names"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, list | tuple):
            return ",".join(str(item) for item in value)
        return str(value)


AUTH_OPTIONS: list[Callable[[Any], Any]] = [
    click.option(
        "--auth",
        default="none",
        show_default=True,
        envvar="KEEL_AUTH",
        metavar="none|tokens:FILE|jwt",
        help="Require bearer tokens over HTTP: those of a token file (keel auth add-token), "
        "or JWTs of an OAuth 2.1 authorization server (--jwt-*).",
    ),
    click.option(
        "--jwt-issuer", envvar="KEEL_JWT_ISSUER", metavar="URL", help="--auth jwt: the `iss`."
    ),
    click.option(
        "--jwt-audience",
        envvar="KEEL_JWT_AUDIENCE",
        metavar="AUD",
        help="--auth jwt: the `aud` tokens must name (this server's resource URL, usually).",
    ),
    click.option(
        "--jwt-jwks-url",
        envvar="KEEL_JWT_JWKS_URL",
        metavar="URL",
        help="--auth jwt: where the issuer publishes its signing keys (JWKS).",
    ),
    click.option(
        "--operators",
        type=_Names(),
        envvar="KEEL_OPERATORS",
        metavar="NAME[,NAME]",
        help="With --auth: the principals (token names, JWT subjects) who may use the "
        "operator console; another valid token gets 403 there. Default: every valid token.",
    ),
]
"""``--auth``, the ``--jwt-*`` options and ``--operators``: what ``keel ops`` takes."""


def _limit(
    flag: str, default: float, kind: click.ParamType[Any], text: str, metavar: str | None = None
) -> Callable[[Any], Any]:
    """The option of one old-protocol session limit: its default shown, also read from
    ``$KEEL_<FLAG>``."""
    name = flag.removeprefix("--").replace("-", "_").upper()
    return click.option(
        flag,
        default=default,
        show_default=True,
        type=kind,
        envvar=f"KEEL_{name}",
        metavar=metavar,
        help=text,
    )


ACCESS_OPTIONS: list[Callable[[Any], Any]] = [
    AUTH_OPTIONS[0],  # --auth
    click.option(
        "--insecure-no-auth",
        is_flag=True,
        envvar="KEEL_INSECURE_NO_AUTH",
        help="Serve a non-loopback --host without --auth (anyone who reaches it may call it).",
    ),
    click.option(
        "--allowed-host",
        "allowed_hosts",
        multiple=True,
        envvar="KEEL_ALLOWED_HOSTS",
        metavar="HOST[:PORT|:*]",
        help="Another Host header to serve (repeatable); loopback names and the bound "
        "address are always allowed. Others are answered 421.",
    ),
    click.option(
        "--allowed-origin",
        "allowed_origins",
        multiple=True,
        envvar="KEEL_ALLOWED_ORIGINS",
        metavar="http(s)://HOST[:PORT]",
        help="Another browser Origin to serve (repeatable); those of the allowed hosts are "
        "always allowed. Others are answered 403.",
    ),
    _limit(
        "--max-sessions",
        DEFAULT_MAX_SESSIONS,
        click.IntRange(1, 1_000_000),
        "2025-11-25 sessions open at once; more are refused (HTTP 503) until some end.",
    ),
    _limit(
        "--session-idle-timeout",
        DEFAULT_IDLE,
        click.FloatRange(1.0, 86_400.0),
        "A 2025-11-25 session with no request for this long is closed.",
        metavar="SECONDS",
    ),
    _limit(
        "--session-rate",
        DEFAULT_RATE,
        click.FloatRange(0.01, 1_000_000.0),
        "Requests to open a 2025-11-25 session let through a second; others wait their turn.",
        metavar="PER_SECOND",
    ),
    _limit(
        "--session-burst",
        DEFAULT_BURST,
        click.IntRange(1, 1_000_000),
        "Requests to open a 2025-11-25 session let through at once after a quiet spell.",
    ),
    _limit(
        "--session-queue",
        DEFAULT_QUEUE,
        click.IntRange(0, 1_000_000),
        "Requests to open a 2025-11-25 session that may wait for their turn; more are "
        "refused at once (HTTP 503, Retry-After).",
    ),
    _limit(
        "--session-openings",
        DEFAULT_OPENINGS,
        click.IntRange(1, 100_000),
        "Requests to open a 2025-11-25 session served at once; others wait their turn.",
    ),
    *AUTH_OPTIONS[1:],  # --jwt-*, --operators
]

_STRINGS = frozenset({"auth", "jwt_issuer", "jwt_audience", "jwt_jwks_url"})
_LISTS = frozenset({"allowed_hosts", "allowed_origins"})
_INTEGERS = frozenset({"max_sessions", "session_burst", "session_queue", "session_openings"})
_NUMBERS = {
    "session_idle_timeout": "a number of seconds",
    "session_rate": "a number of sessions a second",
}


def access_problem(key: str, value: object) -> str | None:
    """What is wrong with a TOML value's type for one of these keys (None: nothing)."""
    if key in _STRINGS and not isinstance(value, str):
        return f"must be a string, not {value!r}"
    if key in _LISTS and not (
        isinstance(value, list) and all(isinstance(item, str) for item in value)
    ):
        return f"must be a list of strings, not {value!r}"
    if key == "operators" and not (
        isinstance(value, str)
        or (isinstance(value, list) and all(isinstance(item, str) for item in value))
    ):
        return f"must be a list of names (or one string, names separated by commas), not {value!r}"
    if key == "insecure_no_auth" and not isinstance(value, bool):
        return f"must be true or false, not {value!r}"
    if key in _INTEGERS and (isinstance(value, bool) or not isinstance(value, int)):
        return f"must be an integer, not {value!r}"
    if key in _NUMBERS and (
        isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
    ):
        return f"must be {_NUMBERS[key]}, not {value!r}"
    return None


@dataclass(frozen=True, slots=True)
class ServeAccess:
    """What ``keel serve`` settled about access: the allow-lists and limits, the
    authentication (None: none), and lines for its startup message."""

    http: HttpAccess
    auth: ServerAuth | None
    lines: list[str] = field(default_factory=list)
    operators: frozenset[str] | None = None
    """Who may use the operator console (None: every valid token)."""


def serve_access(host: str, port: int, options: dict[str, Any]) -> ServeAccess:
    """The access settings of ``keel serve --host HOST --port PORT``, taken (popped) from
    its keyword ``options``.

    Raises:
        KeelCliError: a non-loopback ``host`` without ``--auth`` or
            ``--insecure-no-auth``; an allowed host or origin that cannot be one.
        click.BadParameter: an ``--auth`` that is none of its forms.
        KeelError: the token file or the JWT settings cannot be used.
    """
    from keel.mcp.access import HttpAccess, bind_problem, is_loopback
    from keel.mcp.admission import SessionRate

    values = {key: options.pop(key) for key in ACCESS_KEYS if key in options}
    auth = _auth(str(values.get("auth") or "none"), host, port, values)
    insecure = bool(values.get("insecure_no_auth"))
    problem = bind_problem(host, authenticated=auth is not None, insecure_no_auth=insecure)
    if problem:
        raise KeelCliError(problem)
    http = HttpAccess.for_bind(
        host,
        port,
        hosts=values.get("allowed_hosts") or (),
        origins=values.get("allowed_origins") or (),
        max_sessions=values.get("max_sessions", DEFAULT_MAX_SESSIONS),
        session_idle_timeout=values.get("session_idle_timeout", DEFAULT_IDLE),
        session_rate=SessionRate(
            rate=values.get("session_rate", DEFAULT_RATE),
            burst=values.get("session_burst", DEFAULT_BURST),
            queue=values.get("session_queue", DEFAULT_QUEUE),
            openings=values.get("session_openings", DEFAULT_OPENINGS),
        ),
    )
    if auth is None and insecure and not is_loopback(host):
        warn(f"--insecure-no-auth: anyone who can reach {host}:{port} may call every tool")
    operators = console_operators(values, auth)
    lines = [f"  auth:    {'none' if auth is None else auth.description}", *http.describe()]
    return ServeAccess(http, auth, lines, operators)


def refuse_over_stdio(options: dict[str, Any]) -> None:
    """Take (pop) the access settings from ``keel serve --transport stdio``'s keyword
    ``options``: over stdio the client that starts the process is the only one, so
    there is nothing to authenticate; an ``--auth`` is refused, not silently ignored.

    Raises:
        KeelCliError: ``--auth`` names an authentication.
    """
    values = {key: options.pop(key) for key in ACCESS_KEYS if key in options}
    auth = str(values.get("auth") or "none")
    if auth != "none":
        raise KeelCliError(
            f"--auth {auth} applies to --transport http only: over stdio the client "
            "that starts keel serve is its only client; drop --auth or serve over HTTP"
        )


def check_served(access: ServeAccess | None, server: MCPServer[Any], app: str) -> None:
    """Refuse to serve an app whose server does not authenticate as ``--auth`` asked
    (an app module that built its ``MCPServer`` without ``ServeSettings.server_for``).

    Raises:
        KeelCliError: ``--auth`` is set and the server has no token verifier.
    """
    if access is not None and access.auth is not None and server.settings.auth is None:
        raise KeelCliError(
            f"--app {app} built its server without ServeSettings.server_for, so --auth "
            "cannot apply to it; build it with settings.server_for(app, name)"
        )


def console_auth(host: str, port: int, options: dict[str, Any]) -> ServerAuth | None:
    """The authentication ``keel ops --auth`` names (None for ``none``), from its keyword
    ``options`` (``auth`` and the ``jwt_*`` ones): the same verifiers as ``keel serve``.

    Raises:
        click.BadParameter: an ``--auth`` that is none of its forms.
        KeelError: the token file or the JWT settings cannot be used.
    """
    return _auth(str(options.get("auth") or "none"), host, port, options)


def console_operators(options: dict[str, Any], auth: ServerAuth | None) -> frozenset[str] | None:
    """The operator list ``--operators`` names (None: not given), for a console whose
    authentication is ``auth``.

    Raises:
        KeelCliError: an empty name, or a list without ``--auth``.
    """
    from keel.ops.signin import parse_operators

    given = options.get("operators")
    try:
        operators = parse_operators(given or None)
    except ValueError as exc:
        raise KeelCliError(f"--operators: {exc}") from exc
    if operators is not None and auth is None:
        raise KeelCliError(
            "--operators needs --auth: without a token nobody is told apart "
            "(on loopback, everyone is the operator)"
        )
    return operators


def operators_line(access: ServeAccess | frozenset[str] | None) -> str:
    """Who may use the console, for a startup message."""
    operators = access.operators if isinstance(access, ServeAccess) else access
    if operators is None:
        return "every valid token is an operator's"
    return f"operators: {', '.join(sorted(operators))}"


def _auth(spec: str, host: str, port: int, values: dict[str, Any]) -> ServerAuth | None:
    """The authentication ``--auth`` names (None for ``none``).

    Raises:
        click.BadParameter: none of its forms.
        KeelError: the token file cannot be used.
    """
    from keel.errors import ConfigurationError
    from keel.mcp.access import own_url

    jwt_given = sorted(k for k in ("jwt_issuer", "jwt_audience", "jwt_jwks_url") if values.get(k))
    if jwt_given and spec != "jwt":
        names = ", ".join("--" + k.replace("_", "-") for k in jwt_given)
        raise ConfigurationError(f"{names} given, but --auth is {spec[:200]!r}, not jwt")
    if spec == "none":
        return None
    if spec.startswith("tokens:") and spec != "tokens:":
        return _token_auth(spec.removeprefix("tokens:"), host, port)
    if spec == "jwt":
        from keel.mcp.jwt_auth import jwt_auth

        return jwt_auth(
            issuer=values.get("jwt_issuer"),
            audience=values.get("jwt_audience"),
            jwks_url=values.get("jwt_jwks_url"),
            server_url=own_url(host, port, "/mcp"),
        )
    raise click.BadParameter(
        f"must be none, tokens:FILE or jwt, not {spec[:200]!r}", param_hint="--auth"
    )


def _token_auth(name: str, host: str, port: int) -> ServerAuth:
    """Bearer tokens of the token file ``name`` (:mod:`keel.mcp.tokens`)."""
    from keel.errors import ConfigurationError
    from keel.mcp.access import own_url
    from keel.mcp.tokens import token_auth
    from keel.store.locations import file_name_problem

    problem = file_name_problem(name)
    if problem:
        raise ConfigurationError(f"--auth tokens:FILE: the file name {problem}")
    return token_auth(Path(name), own_url(host, port))
