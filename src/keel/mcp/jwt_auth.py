"""OAuth 2.1 resource-server mode: ``keel serve --auth jwt``.

Clients bring an access token (a JWT) from an authorization server: Keel checks its
signature against the issuer's published keys (JWKS, fetched and cached by PyJWT's
``PyJWKClient``: kept 5 minutes, fetched again for an unknown ``kid`` at most every 30
s), its ``iss``, its ``aud`` and its ``exp`` (and ``nbf``, ``iat``), with 30 s of leeway
for clocks. Only asymmetric algorithms are accepted (RSA, RSA-PSS, EC, EdDSA): a
public JWKS can never verify an ``HS256`` token, nor ``none``.

The principal is the token's issuer and ``sub`` (the ``AccessToken``'s ``client_id``
and ``subject`` are both ``sub``, its ``claims`` hold ``iss``): the same user through
two client applications owns the same tasks. Scopes (``scope`` or ``scp``) are passed
on; none is required.

The server also publishes its protected-resource metadata (RFC 9728, the SDK's route:
``/.well-known/oauth-protected-resource/mcp``), naming the issuer as its authorization
server, and its 401 answers point to it in ``WWW-Authenticate``.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio.to_thread
import jwt
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from pydantic import AnyHttpUrl, ValidationError

from keel.errors import ConfigurationError
from keel.mcp.access import ServerAuth, report_auth_outage

__all__ = ["ALGORITHMS", "LEEWAY", "JwtVerifier", "jwt_auth"]

log = logging.getLogger(__name__)

ALGORITHMS = (
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA",
)  # fmt: skip
"""Signature algorithms accepted: asymmetric only (a JWKS publishes public keys)."""
LEEWAY = 30.0  # seconds of clock difference allowed on exp, nbf and iat
JWKS_LIFESPAN = 300.0  # seconds the fetched key set is kept
JWKS_TIMEOUT = 10.0  # seconds one fetch of the key set may take
JWKS_COOLDOWN = 30.0  # seconds between fetches for a key id the set does not have
REQUIRED = ["exp", "iss", "aud", "sub"]


class JwtVerifier:
    """The SDK's ``TokenVerifier`` for JWTs of one issuer and audience, signed by a key
    of the issuer's JWKS."""

    def __init__(
        self,
        *,
        issuer: str,
        audience: str,
        jwks_url: str,
        jwks_timeout: float = JWKS_TIMEOUT,
        jwks_cooldown: float = JWKS_COOLDOWN,
    ) -> None:
        self.issuer = issuer
        self.audience = audience
        self.jwks_url = jwks_url
        self.jwks = jwt.PyJWKClient(
            jwks_url,
            cache_keys=True,
            lifespan=JWKS_LIFESPAN,
            timeout=jwks_timeout,
            cooldown_duration=jwks_cooldown,
        )

    async def verify_token(self, token: str) -> AccessToken | None:
        """The principal of a valid token, or None (HTTP 401): a bad signature, another
        issuer or audience, expired. Keys that cannot be fetched (the JWKS unreachable,
        timing out, answering an HTTP error) are reported as an outage
        (:func:`~keel.mcp.access.report_auth_outage`): HTTP 503, not 401."""
        try:
            claims = await anyio.to_thread.run_sync(self._claims, token)
        except jwt.PyJWKClientConnectionError as exc:
            log.warning("cannot fetch the JWKS to verify a token: %s", exc)
            reason = exc.__cause__ or exc  # the URLError / TimeoutError / HTTPError
            report_auth_outage(
                f"the authorization server's keys (JWKS) cannot be fetched from "
                f"{self.jwks_url} ({reason})"
            )
            return None
        except (jwt.PyJWTError, ValueError) as exc:  # PyJWKClientError is a PyJWTError
            log.info("token refused: %s", exc)
            return None
        subject = claims["sub"]
        if not isinstance(subject, str) or not subject:
            log.info("token refused: sub is not a non-empty string")
            return None
        return AccessToken(
            token=token,
            client_id=subject,
            subject=subject,
            scopes=_scopes(claims),
            expires_at=int(claims["exp"]),
            resource=self.audience,
            claims={"iss": claims["iss"]},
        )

    def _claims(self, token: str) -> dict[str, Any]:
        """The verified claims of ``token`` (blocking: the key set may be fetched).

        Raises:
            jwt.PyJWTError: the token is not valid, or its key cannot be found.
        """
        key = self.jwks.get_signing_key_from_jwt(token)
        claims: dict[str, Any] = jwt.decode(
            token,
            key.key,
            algorithms=list(ALGORITHMS),
            audience=self.audience,
            issuer=self.issuer,
            leeway=LEEWAY,
            options={"require": REQUIRED},
        )
        return claims


def _scopes(claims: dict[str, Any]) -> list[str]:
    scope = claims.get("scope", claims.get("scp", []))
    if isinstance(scope, str):
        return scope.split()
    return [str(s) for s in scope] if isinstance(scope, list) else []


def _url(option: str, value: str | None) -> str:
    """``value``, checked to be an http(s) URL, or an error naming ``option``."""
    if not value:
        raise ConfigurationError(f"--auth jwt needs {option} URL")
    try:
        AnyHttpUrl(value)
    except ValidationError as exc:
        raise ConfigurationError(
            f"{option} {value[:200]!r}: expected an http(s) URL ({exc.errors()[0]['msg']})"
        ) from exc
    return value


def jwt_auth(
    *, issuer: str | None, audience: str | None, jwks_url: str | None, server_url: str
) -> ServerAuth:
    """Authentication by JWTs of ``issuer`` for ``audience``, checked against the keys
    at ``jwks_url``, for a server at ``server_url`` (its MCP endpoint). The resource
    named in the protected-resource metadata is ``audience`` if it is an http(s) URL
    (as RFC 8707 resource indicators are), else ``server_url``.

    Raises:
        ConfigurationError: a setting missing, or not a URL where one is needed.
    """
    issuer = _url("--jwt-issuer", issuer)
    jwks_url = _url("--jwt-jwks-url", jwks_url)
    if not audience:
        raise ConfigurationError("--auth jwt needs --jwt-audience (the aud tokens must name)")
    try:
        resource = _url("--jwt-audience", audience)
    except ConfigurationError:
        resource = server_url
    # As strings, which AuthSettings keeps as given (a URL object gains a trailing
    # slash, and issuers are compared as exact strings).
    settings = AuthSettings.model_validate(
        {
            "issuer_url": issuer,
            "resource_server_url": resource,
            "validate_token_resource": False,  # the verifier checks aud itself
        }
    )
    verifier = JwtVerifier(issuer=issuer, audience=audience, jwks_url=jwks_url)
    return ServerAuth(settings, verifier, f"JWTs of {issuer} for audience {audience}")
