"""A ``requestState`` key that outlives the process.

The SDK seals every ``requestState`` (MRTR) it sends and refuses one it cannot unseal. Its
default key lives in the process only, so a client that was asked a question before a
restart (a deploy, a crash) could no longer answer it: the retry would be refused and the
task it was about would wait for nobody. A Keel server instead seals with a key kept
beside its store (created once, readable by its owner only), or given by
``$KEEL_REQUEST_STATE_KEY`` when several front ends must accept each other's state.

A sealed state stays valid for :data:`STATE_TTL`: long enough for a person to answer.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from mcp.server.request_state import RequestStateSecurity

from keel.errors import ConfigurationError

__all__ = ["KEY_FILE", "KEY_VARIABLE", "STATE_TTL", "request_state_security"]

KEY_FILE = "request-state.key"
KEY_VARIABLE = "KEEL_REQUEST_STATE_KEY"
STATE_TTL = 24 * 3600.0  # seconds a client may take to answer an input-required result
MIN_KEY = 32  # characters of secret randomness (the SDK's floor)


def _load_or_create(path: Path) -> str:
    try:
        try:
            return path.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            pass
        path.parent.mkdir(parents=True, exist_ok=True)
        key = secrets.token_hex(32)
        # Written aside, then linked into place: the file appears whole or not at all, and
        # of two processes starting at once both end up with the first one's key.
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(key + "\n")
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            key = path.read_text(encoding="ascii").strip()
        finally:
            tmp.unlink()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"cannot read the request-state key {path}: {exc}") from exc
    return key


def request_state_security(data_dir: Path | None) -> RequestStateSecurity:
    """The sealing policy of a server whose state lives in ``data_dir``: the key from
    ``$KEEL_REQUEST_STATE_KEY``, else ``data_dir/request-state.key`` (made on first use),
    else (no data directory: a ``memory://`` store) a key of this process only.

    Raises:
        ConfigurationError: a key shorter than 32 characters, or a key file that cannot
            be read or written.
    """
    key = os.environ.get(KEY_VARIABLE)
    if key is None and data_dir is not None:
        key = _load_or_create(data_dir / KEY_FILE)
    if key is None:
        return RequestStateSecurity.ephemeral(ttl=STATE_TTL)
    if len(key) < MIN_KEY:
        source = f"${KEY_VARIABLE}" if KEY_VARIABLE in os.environ else str(data_dir)
        raise ConfigurationError(
            f"the request-state key from {source} is {len(key)} characters; it needs at "
            f"least {MIN_KEY} of secret randomness"
        )
    return RequestStateSecurity(keys=[key], ttl=STATE_TTL)
