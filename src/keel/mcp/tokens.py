"""Bearer tokens kept in a token file: ``keel serve --auth tokens:FILE``.

A token file is JSON, created with mode 0600, holding for each named token only the
SHA-256 of its text, never the text itself::

    {"keel_tokens": 1,
     "tokens": {"ops": {"sha256": "9f2c…", "created": "2026-12-03T12:00:00Z"}}}

``keel auth add-token NAME`` makes a token (``keel_`` and 43 random URL-safe
characters, 256 bits), stores its hash and prints it once; ``keel auth list`` shows the
names; ``keel auth revoke NAME`` removes one. Every change replaces the file whole
(written beside it, then renamed), so a server reading it never sees half of it, and
two ``keel auth`` commands at once take turns (a lock file beside it).

:class:`TokenFileVerifier` is the SDK's ``TokenVerifier`` for such a file: a token is
accepted if its hash is in the file, and its name is its principal (the ``client_id``
and ``subject`` of the ``AccessToken``), which owns the tasks it creates. The file is
looked at on every request (one ``stat``) and read again when it changed, so a revoked
token is refused from the next request on, without a restart. A file that cannot be
read any more refuses every token until it can (fail closed).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import stat
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings

from keel.errors import ConfigurationError
from keel.mcp.access import ServerAuth

__all__ = ["TOKEN_PREFIX", "TokenFile", "TokenFileVerifier", "hash_token", "token_auth"]

log = logging.getLogger(__name__)

TOKEN_PREFIX = "keel_"  # noqa: S105 - the prefix of every token, not a secret
FORMAT = 1  # the "keel_tokens" version this module writes and reads
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_FILE = 4 * 1024 * 1024  # bytes: a token file is small; a bigger one is not ours


def hash_token(token: str) -> str:
    """The SHA-256 of a token, in hex: what the token file keeps."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True, slots=True)
class TokenFile:
    """A token file at ``path`` (which need not exist yet)."""

    path: Path

    def read(self) -> dict[str, dict[str, str]]:
        """The tokens: name -> ``{"sha256": …, "created": …}`` ({} for no file).

        Raises:
            ConfigurationError: the file cannot be read, or is not a token file.
        """
        try:
            with self.path.open("rb") as file:
                data = file.read(MAX_FILE + 1)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise ConfigurationError(
                f"cannot read the token file {self.path}: {exc.strerror or exc}"
            ) from exc
        return _parse(self.path, data)

    def exists(self) -> bool:
        """Whether the file is there (a missing file is not an error for ``read``)."""
        try:
            return self.path.is_file()
        except OSError:
            return False

    def add(self, name: str) -> str:
        """A new token named ``name``, its hash stored; the token itself is returned and
        kept nowhere.

        Raises:
            ConfigurationError: a bad or taken name; the file cannot be read or written.
        """
        _check_name(name)
        with self._locked():
            tokens = self.read()
            if name in tokens:
                raise ConfigurationError(
                    f"a token named {name!r} already exists in {self.path} "
                    "(keel auth revoke it first, or choose another name)"
                )
            token = TOKEN_PREFIX + secrets.token_urlsafe(32)
            created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            tokens[name] = {"sha256": hash_token(token), "created": created}
            self._write(tokens)
        return token

    def revoke(self, name: str) -> None:
        """Remove the token named ``name``.

        Raises:
            ConfigurationError: no such token; the file cannot be read or written.
        """
        with self._locked():
            tokens = self.read()
            if name not in tokens:
                known = ", ".join(sorted(tokens)) or "none"
                raise ConfigurationError(
                    f"no token named {name!r} in {self.path} (tokens: {known})"
                )
            del tokens[name]
            self._write(tokens)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the file's lock (``.NAME.lock`` beside it): two ``keel auth`` commands at
        once would otherwise each write the file without the other's change.

        Raises:
            ConfigurationError: the lock file cannot be made.
        """
        lock = self.path.with_name(f".{self.path.name}.lock")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot write the token file {self.path}: {exc.strerror or exc}"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _write(self, tokens: Mapping[str, Mapping[str, str]]) -> None:
        """Replace the file whole with ``tokens``, mode 0600 (its folder made if need be)."""
        body = json.dumps({"keel_tokens": FORMAT, "tokens": tokens}, indent=2, sort_keys=True)
        temporary = self.path.with_name(f".{self.path.name}.{secrets.token_hex(4)}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as file:
                    file.write(body + "\n")
                    file.flush()
                    os.fsync(file.fileno())
                os.replace(temporary, self.path)
            finally:
                temporary.unlink(missing_ok=True)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot write the token file {self.path}: {exc.strerror or exc}"
            ) from exc


def _check_name(name: str) -> None:
    if not NAME.fullmatch(name):
        raise ConfigurationError(
            f"token name {name[:80]!r}: expected 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )


def _parse(path: Path, data: bytes) -> dict[str, dict[str, str]]:
    """The tokens of a token file's bytes.

    Raises:
        ConfigurationError: not a token file (naming what is wrong).
    """
    problem = f"{path} is not a keel token file"
    if len(data) > MAX_FILE:
        raise ConfigurationError(f"{problem}: over {MAX_FILE} bytes")
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ConfigurationError(f"{problem}: not JSON ({exc})") from exc
    if not isinstance(document, dict) or document.get("keel_tokens") != FORMAT:
        raise ConfigurationError(f'{problem}: expected {{"keel_tokens": {FORMAT}, "tokens": …}}')
    tokens = document.get("tokens")
    if not isinstance(tokens, dict):
        raise ConfigurationError(f'{problem}: "tokens" must be an object')
    parsed: dict[str, dict[str, str]] = {}
    for name, entry in tokens.items():
        digest = entry.get("sha256") if isinstance(entry, dict) else None
        if not NAME.fullmatch(name) or not _is_digest(digest):
            raise ConfigurationError(f"{problem}: bad entry {name[:80]!r}")
        parsed[name] = {"sha256": str(digest), "created": str(entry.get("created", ""))}
    return parsed


def _is_digest(value: Any) -> bool:
    return isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value) is not None


def _check_private(path: Path) -> None:
    """Refuse a token file others may write: whoever can write it can let themselves in
    (a hash of a token of their own is all it takes).

    Raises:
        ConfigurationError: the file is writable by its group or by everyone.
    """
    try:
        mode = path.stat().st_mode
    except OSError:
        return  # read() names the problem
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigurationError(
            f"the token file {path} is writable by others (mode {stat.S_IMODE(mode):o}), "
            f"so anyone could add a token: chmod 600 {path}"
        )


def _by_hash(tokens: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    return {entry["sha256"]: name for name, entry in tokens.items()}


class TokenFileVerifier:
    """The SDK's ``TokenVerifier`` for a token file: a token whose hash is in the file
    is accepted, as the principal its name is. The file is read again whenever its
    ``stat`` changes (a token revoked is refused from the next request)."""

    def __init__(self, path: Path) -> None:
        """Read the token file at ``path`` now.

        Raises:
            ConfigurationError: no such file, or not a token file.
        """
        self.file = TokenFile(path)
        if not self.file.exists():
            raise ConfigurationError(
                f"no token file at {path}: create one with keel auth add-token NAME --tokens {path}"
            )
        _check_private(path)
        self._seen = self._stat()
        self._names = _by_hash(self.file.read())  # sha256 -> name; a bad file fails here

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.file.path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _reload(self) -> None:
        """Read the file again if it changed; while it is gone or broken, refuse all."""
        seen = self._stat()
        if seen == self._seen:
            return
        self._seen = seen
        if seen is None:
            log.error("refusing every token: the token file %s is gone", self.file.path)
            self._names = {}
            return
        try:
            self._names = _by_hash(self.file.read())
        except ConfigurationError as exc:
            log.error("refusing every token until the token file is fixed: %s", exc)  # noqa: TRY400 - the message says it all
            self._names = {}

    async def verify_token(self, token: str) -> AccessToken | None:
        """The principal of ``token``, or None (HTTP 401) if the file does not hold it."""
        self._reload()
        name = self._names.get(hash_token(token))
        if name is None:
            return None
        return AccessToken(token=token, client_id=name, subject=name, scopes=[])


def token_auth(path: Path, server_url: str) -> ServerAuth:
    """Authentication by the tokens of the token file at ``path``, for a server at
    ``server_url``.

    Raises:
        ConfigurationError: no such file, or not a token file.
    """
    verifier = TokenFileVerifier(path)
    # A resource server without OAuth metadata (resource_server_url None): the SDK
    # wants an issuer URL all the same; it would only name it in metadata not served.
    settings = AuthSettings(issuer_url=server_url, resource_server_url=None)  # type: ignore[arg-type]
    return ServerAuth(settings, verifier, f"bearer tokens of {path}")
