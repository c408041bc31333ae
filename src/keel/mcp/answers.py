"""Keel's wire errors as the SDK raises them: the one place that turns the JSON-RPC errors
of ``keel.mcp.wire`` (its error table, a finished task's outcome) into ``MCPError``, for
the server of both protocol generations and for the client helper."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcp.shared.exceptions import MCPError

from keel.errors import KeelError
from keel.mcp.wire import rpc_error

__all__ = ["error_of", "mcp_error"]


def error_of(error: Mapping[str, Any]) -> MCPError:
    """A JSON-RPC error ``{code, message, data?}`` as the ``MCPError`` the SDK sends."""
    return MCPError(code=error["code"], message=str(error["message"]), data=error.get("data"))


def mcp_error(exc: KeelError) -> MCPError:
    """A Keel error by the one table (``wire.rpc_error``)."""
    return error_of(rpc_error(exc))
