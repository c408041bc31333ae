"""Host and Origin allow-lists on every bind (issue 15, part 4): a real server on
127.0.0.1 answers a foreign ``Host`` 421 and a foreign ``Origin`` 403, on the MCP
endpoint and on every other route, and serves the names it was told to allow."""

from __future__ import annotations

from pathlib import Path

import pytest

from access.support import build, raw, serve_guarded
from keel.mcp.access import HttpAccess

pytestmark = pytest.mark.anyio


async def test_foreign_host_is_refused_421(tmp_path: Path) -> None:
    """``Host: evil.example`` (a DNS-rebinding page) is answered 421 and never reaches
    the MCP endpoint; the server's own address is served."""
    async with serve_guarded(build(tmp_path)) as url:
        refused = await raw(url, headers={"Host": "evil.example"})
        served = await raw(url)
    assert refused.status == 421, refused
    assert served.status == 200, served
    assert served.json["result"]["protocolVersion"] == "2025-11-25"


async def test_foreign_origin_is_refused_403(tmp_path: Path) -> None:
    """``Origin: http://evil.example`` (a browser page elsewhere) is answered 403; the
    server's own origin, and a request without an Origin, are served."""
    async with serve_guarded(build(tmp_path)) as url:
        base = url.removesuffix("/mcp")
        refused = await raw(url, headers={"Origin": "http://evil.example"})
        own = await raw(url, headers={"Origin": base})
        localhost = await raw(url, headers={"Origin": base.replace("127.0.0.1", "localhost")})
    assert refused.status == 403, refused
    assert own.status == 200, own
    assert localhost.status == 200, localhost


async def test_every_route_is_guarded(tmp_path: Path) -> None:
    """Not only the MCP endpoint: any path, with a foreign Host, is answered 421 before
    the app looks at it (a path the app does not serve answers 404 to a good Host)."""
    async with serve_guarded(build(tmp_path)) as url:
        other = url.removesuffix("/mcp") + "/.well-known/oauth-protected-resource/mcp"
        refused = await raw(other, method="GET", body=None, headers={"Host": "evil.example"})
        origin = await raw(other, method="GET", body=None, headers={"Origin": "http://evil"})
        good = await raw(other, method="GET", body=None)
    assert refused.status == 421, refused
    assert origin.status == 403, origin
    assert good.status == 404, good


async def test_allowed_names_are_served(tmp_path: Path) -> None:
    """``--allowed-host`` / ``--allowed-origin``: a name behind a reverse proxy (bare, as
    on port 443) and a browser app's origin are served; a near miss is not."""
    access = HttpAccess.for_bind(
        "127.0.0.1", 0, hosts=["mcp.example.com"], origins=["https://app.example.com"]
    )
    async with serve_guarded(build(tmp_path), access) as url:
        proxied = await raw(url, headers={"Host": "mcp.example.com"})
        with_port = await raw(url, headers={"Host": "mcp.example.com:8443"})
        app = await raw(
            url, headers={"Host": "mcp.example.com", "Origin": "https://app.example.com"}
        )
        own = await raw(
            url, headers={"Host": "mcp.example.com", "Origin": "https://mcp.example.com"}
        )
        near = await raw(url, headers={"Host": "mcp.example.com.evil.example"})
        near_origin = await raw(url, headers={"Origin": "https://app.example.com.evil"})
    assert [proxied.status, with_port.status, app.status, own.status] == [200] * 4
    assert near.status == 421, near
    assert near_origin.status == 403, near_origin
