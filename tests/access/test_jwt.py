"""OAuth 2.1 resource-server mode (issue 15, part 4): ``keel serve --auth jwt``.

An authorization server's keys are generated here and published as a JWKS by a server
of the test's own on 127.0.0.1; tokens signed with them are checked by a real Keel
server: a valid one is served, an expired one, one for another audience or from
another issuer, one with a bad signature, an unsigned one and an HS256 one are refused
401. The principal is the token's ``sub``; the protected-resource metadata names the
issuer. A JWKS that cannot be reached (connection refused, no answer, an HTTP error) is
the server's trouble, not the token's: 503 with ``Retry-After``, never 401.
"""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from access.support import Raw, build, raw, serve_asgi, serve_guarded
from keel.errors import ConfigurationError
from keel.mcp.access import AUTH_OUTAGE_RETRY, ServerAuth
from keel.mcp.jwt_auth import JwtVerifier, jwt_auth
from keel.mcp.wire import AUTH_UNAVAILABLE
from tasks_extension.support import NOT_FOUND, poll, post

pytestmark = pytest.mark.anyio

ISSUER = "https://idp.example"
AUDIENCE = "https://mcp.example/mcp"
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())
OTHER_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)


def jwks() -> dict[str, Any]:
    """The authorization server's published keys: an RSA and an EC key."""
    rsa_jwk = RSAAlgorithm.to_jwk(RSA_KEY.public_key(), as_dict=True)
    ec_jwk = ECAlgorithm.to_jwk(EC_KEY.public_key(), as_dict=True)
    return {
        "keys": [
            {**rsa_jwk, "kid": "rsa-1", "use": "sig", "alg": "RS256"},
            {**ec_jwk, "kid": "ec-1", "use": "sig", "alg": "ES256"},
        ]
    }


def token(
    sub: str = "alice",
    *,
    key: Any = RSA_KEY,
    kid: str = "rsa-1",
    algorithm: str = "RS256",
    **claims: Any,
) -> str:
    """A JWT for ``sub`` (valid for an hour, for AUDIENCE, from ISSUER, unless
    ``claims`` say otherwise)."""
    now = int(time.time())
    payload = {"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "iat": now, "exp": now + 3600}
    payload.update(claims)
    return jwt.encode(payload, key, algorithm=algorithm, headers={"kid": kid})


@asynccontextmanager
async def jwt_server(tmp_path: Path) -> AsyncIterator[str]:
    """A JWKS server and a Keel server that trusts it; yields the Keel MCP URL."""

    async def keys(_: Request) -> JSONResponse:
        return JSONResponse(jwks())

    async with serve_asgi(Starlette(routes=[Route("/jwks", keys)])) as idp:
        auth = jwt_auth(
            issuer=ISSUER,
            audience=AUDIENCE,
            jwks_url=f"{idp}/jwks",
            server_url="http://127.0.0.1/mcp",
        )
        async with serve_guarded(build(tmp_path, auth)) as url:
            yield url


def bearer(text: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {text}"}


async def test_valid_tokens_are_served_bad_ones_refused(tmp_path: Path) -> None:
    """A valid RS256 or ES256 token is served; expired, wrong audience, wrong issuer,
    bad signature, unknown key, unsigned and HS256 tokens, and none at all, get 401
    with ``WWW-Authenticate`` pointing to the resource metadata."""
    now = int(time.time())
    refused = {
        "expired": token(exp=now - 3600, iat=now - 7200),
        "wrong audience": token(aud="https://other.example/mcp"),
        "wrong issuer": token(iss="https://evil.example"),
        "bad signature": token(key=OTHER_KEY),
        "unknown key": token(kid="rsa-2"),
        "no sub": token(sub=""),
        "unsigned": token(key=None, algorithm="none"),
        "hs256": token(key="x" * 32, algorithm="HS256"),
    }
    async with jwt_server(tmp_path) as url:
        good = await raw(url, headers=bearer(token()))
        good_ec = await raw(url, headers=bearer(token(key=EC_KEY, kid="ec-1", algorithm="ES256")))
        none = await raw(url)
        answers = {name: await raw(url, headers=bearer(text)) for name, text in refused.items()}
    assert good.status == 200, good
    assert good_ec.status == 200, good_ec
    for name, answer in {"no token": none, **answers}.items():
        assert answer.status == 401, (name, answer)
        challenge = answer.headers["www-authenticate"]
        assert challenge.startswith("Bearer"), name
        assert "/.well-known/oauth-protected-resource/mcp" in challenge, name


async def test_protected_resource_metadata(tmp_path: Path) -> None:
    """The SDK's RFC 9728 metadata is served (without a token) and names the issuer as
    the authorization server and the audience as the resource."""
    async with jwt_server(tmp_path) as url:
        base = url.removesuffix("/mcp")
        meta = await raw(
            f"{base}/.well-known/oauth-protected-resource/mcp", method="GET", body=None
        )
    assert meta.status == 200, meta
    assert meta.json["resource"] == AUDIENCE
    assert meta.json["authorization_servers"] == [ISSUER]


async def test_the_principal_is_sub(tmp_path: Path) -> None:
    """Two tokens for the same ``sub`` (different token ids and clients) share tasks;
    another ``sub`` sees them as unknown ids."""
    async with jwt_server(tmp_path) as url:
        first = token("alice", jti="1", azp="app-one")
        again = token("alice", jti="2", azp="app-two")
        bob = token("bob")
        created = await post(url, "tools/call", {"name": "slow", "arguments": {}}, token=first)
        task_id = created.result["taskId"]
        seen = await poll(url, task_id, "working", token=again)
        foreign = await post(url, "tasks/get", {"taskId": task_id}, token=bob)
        unknown = await post(url, "tasks/get", {"taskId": "no-such-task"}, token=bob)
        await post(url, "tasks/cancel", {"taskId": task_id}, token=again)
    assert seen["taskId"] == task_id
    assert (foreign.status, foreign.body["error"]) == (unknown.status, unknown.body["error"])
    assert foreign.error["message"] == NOT_FOUND


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"issuer": None}, "--jwt-issuer"),
        ({"issuer": "not a url"}, "--jwt-issuer"),
        ({"jwks_url": None}, "--jwt-jwks-url"),
        ({"jwks_url": "ftp://x/jwks"}, "--jwt-jwks-url"),
        ({"audience": ""}, "--jwt-audience"),
    ],
)
def test_settings_are_checked(settings: dict[str, Any], problem: str) -> None:
    """A missing or malformed --jwt-* setting is refused naming the option."""
    given = {"issuer": ISSUER, "audience": AUDIENCE, "jwks_url": "https://idp.example/jwks"}
    given.update(settings)
    with pytest.raises(ConfigurationError, match=problem):
        jwt_auth(**given, server_url="http://127.0.0.1:8000/mcp")


def trusting(jwks_url: str, **jwks: float) -> ServerAuth:
    """``--auth jwt`` trusting the keys at ``jwks_url``, its verifier built with the
    ``jwks`` options (``jwks_timeout``, ``jwks_cooldown``) if any are given."""
    auth = jwt_auth(
        issuer=ISSUER, audience=AUDIENCE, jwks_url=jwks_url, server_url="http://127.0.0.1/mcp"
    )
    if not jwks:
        return auth
    verifier = JwtVerifier(issuer=ISSUER, audience=AUDIENCE, jwks_url=jwks_url, **jwks)
    return replace(auth, verifier=verifier)


@contextmanager
def dead_port(*, listening: bool) -> Iterator[str]:
    """A JWKS URL on 127.0.0.1 that never answers: a bound socket that does not listen
    (connections refused) or one that listens and never accepts (requests time out)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        if listening:
            sock.listen(8)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/jwks"


def assert_outage(answer: Raw, *causes: str) -> None:
    """``answer`` is the 503 of a token that could not be checked, naming the JWKS URL
    and one of ``causes``."""
    assert answer.status == 503, answer
    assert answer.headers["retry-after"] == str(round(AUTH_OUTAGE_RETRY)), answer
    assert "www-authenticate" not in answer.headers, answer
    error = answer.json["error"]
    assert error["code"] == AUTH_UNAVAILABLE, error
    assert error["data"] == {"retryAfterMs": round(AUTH_OUTAGE_RETRY * 1000)}, error
    assert "cannot be fetched from http://127.0.0.1:" in error["message"], error
    assert "not the token" in error["message"], error
    assert any(cause in error["message"] for cause in causes), error


async def test_jwks_that_went_away_is_503_not_401(tmp_path: Path) -> None:
    """Keys fetched while the JWKS was up keep verifying their tokens after it stops (the
    cache); a token whose key must be fetched again (an unknown key id, no cooldown
    between fetches here) is answered 503 with Retry-After and a message naming the JWKS
    and the refused connection, not 401; a token that is bad on its face (another
    audience) and no token at all are still 401."""

    async def keys(_: Request) -> JSONResponse:
        return JSONResponse(jwks())

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    jwks_url = f"http://127.0.0.1:{sock.getsockname()[1]}/jwks"
    async with serve_guarded(build(tmp_path, trusting(jwks_url, jwks_cooldown=0))) as url:
        async with serve_asgi(Starlette(routes=[Route("/jwks", keys)]), sock):
            before = await raw(url, headers=bearer(token()))
        # The JWKS server has stopped and its socket is closed: connections are refused.
        cached = await raw(url, headers=bearer(token()))
        new_key = await raw(url, headers=bearer(token(kid="rsa-2")))
        wrong_audience = await raw(url, headers=bearer(token(aud="https://other.example")))
        no_token = await raw(url)
    assert (before.status, cached.status) == (200, 200), (before, cached)
    assert_outage(new_key, "Connection refused")
    assert (wrong_audience.status, no_token.status) == (401, 401)


@pytest.mark.parametrize("listening", [False, True], ids=["refused", "timeout"])
async def test_unreachable_jwks_is_503_not_401(tmp_path: Path, listening: bool) -> None:
    """A server whose JWKS was never reachable (the port refuses connections, or accepts
    them and never answers) answers every token 503 with Retry-After, naming the JWKS
    and the cause; a request without a token is still 401."""
    with dead_port(listening=listening) as jwks_url:
        auth = trusting(jwks_url, jwks_timeout=0.5)
        async with serve_guarded(build(tmp_path, auth)) as url:
            answer = await raw(url, headers=bearer(token()))
            no_token = await raw(url)
    assert_outage(answer, "timed out" if listening else "Connection refused")
    assert no_token.status == 401


async def test_jwks_http_error_is_503(tmp_path: Path) -> None:
    """A JWKS that answers an HTTP error (the authorization server failing) is an outage
    too: 503 naming the status, not 401."""

    async def broken(_: Request) -> JSONResponse:
        return JSONResponse({"error": "down for maintenance"}, status_code=500)

    idp = serve_asgi(Starlette(routes=[Route("/jwks", broken)]))
    async with idp as base, serve_guarded(build(tmp_path, trusting(f"{base}/jwks"))) as url:
        answer = await raw(url, headers=bearer(token()))
    assert_outage(answer, "500")
