"""Bearer tokens of a token file (issue 15, part 4): ``keel serve --auth tokens:FILE``.

The file keeps hashes only, mode 0600; a real server on 127.0.0.1 refuses a request
without a token or with a wrong or revoked one (401 with ``WWW-Authenticate``), serves
a good one, and binds each task to its token's name: another token's task id answers
exactly as an unknown id does. A revoke takes effect on the next request, without a
restart.
"""

from __future__ import annotations

import json
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from access.support import build, raw, serve_guarded
from keel.cli.app import cli
from keel.errors import ConfigurationError
from keel.mcp.tokens import TOKEN_PREFIX, TokenFile, TokenFileVerifier, hash_token, token_auth
from tasks_extension.support import NOT_FOUND, Answer, client_as, poll, post

pytestmark = pytest.mark.anyio


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def observed(answer: Answer) -> tuple[int, Any]:
    return answer.status, answer.body.get("error")


def test_token_file_keeps_hashes_only(tmp_path: Path) -> None:
    """``add`` returns a fresh 256-bit token and stores only its SHA-256, in a file of
    mode 0600; ``revoke`` removes it; names are checked and unique."""
    tokens = TokenFile(tmp_path / "secret" / "tokens.json")
    ops = tokens.add("ops")
    ci = tokens.add("ci.bot-1")
    text = tokens.path.read_text()
    assert ops.startswith(TOKEN_PREFIX)
    assert len(ops) == len(TOKEN_PREFIX) + 43
    assert ops not in text
    assert ci not in text
    assert hash_token(ops) in text
    assert stat.S_IMODE(os.stat(tokens.path).st_mode) == 0o600
    assert sorted(tokens.read()) == ["ci.bot-1", "ops"]
    with pytest.raises(ConfigurationError, match="already exists"):
        tokens.add("ops")
    for bad in ("", "has space", "../up", "x" * 65, "-dash"):
        with pytest.raises(ConfigurationError, match="token name"):
            tokens.add(bad)
    tokens.revoke("ops")
    assert sorted(tokens.read()) == ["ci.bot-1"]
    with pytest.raises(ConfigurationError, match="no token named 'ops'"):
        tokens.revoke("ops")
    assert not list(tokens.path.parent.glob(".*.tmp"))  # no temporary file left behind


def test_concurrent_adds_keep_every_token(tmp_path: Path) -> None:
    """Sixteen ``add`` calls at once, from threads (as separate ``keel auth`` commands
    would be): the lock makes them take turns, and every token is kept."""
    tokens = TokenFile(tmp_path / "tokens.json")
    with ThreadPoolExecutor(max_workers=16) as pool:
        made = list(pool.map(tokens.add, [f"t{i}" for i in range(16)]))
    assert len(set(made)) == 16
    assert sorted(tokens.read()) == sorted(f"t{i}" for i in range(16))


@pytest.mark.parametrize(
    "content",
    [b"", b"{", b'{"tokens": {}}', b'{"keel_tokens": 1, "tokens": {"a": {"sha256": "x"}}}'],
)
def test_a_broken_token_file_is_refused(tmp_path: Path, content: bytes) -> None:
    """A file that is not a token file is refused when the server starts, naming it."""
    path = tmp_path / "tokens.json"
    path.write_bytes(content)
    with pytest.raises(ConfigurationError, match="not a keel token file"):
        TokenFileVerifier(path)


def test_a_token_file_others_may_write_is_refused(tmp_path: Path) -> None:
    """Whoever can write the token file can let themselves in: a group- or
    world-writable file is refused, naming the fix."""
    tokens = TokenFile(tmp_path / "tokens.json")
    tokens.add("ops")
    for mode in (0o620, 0o602):
        tokens.path.chmod(mode)
        with pytest.raises(ConfigurationError, match=r"writable by others.*chmod 600"):
            TokenFileVerifier(tokens.path)
    tokens.path.chmod(0o640)  # readable by the group is fine: it holds hashes only
    assert TokenFileVerifier(tokens.path).file.read()


async def test_the_official_client_with_a_token(tmp_path: Path) -> None:
    """The official MCP client, sending the token as a bearer header, lists the tools
    and runs a task to its result."""
    tokens = TokenFile(tmp_path / "tokens.json")
    good = tokens.add("ops")
    server = build(tmp_path, token_auth(tokens.path, "http://127.0.0.1"))
    async with serve_guarded(server) as url, client_as(url, good) as client:
        listed = await client.list_tools()
        result = await client.call_tool("quick", {"n": 21})
    assert "quick" in {tool.name for tool in listed.tools}
    assert result.structured_content == {"n": 42}


def test_keel_auth_commands(tmp_path: Path) -> None:
    """``keel auth add-token`` prints the token once (stdout), ``list`` the names and
    dates, ``revoke`` removes it; errors are one ``keel: error:`` line."""
    runner = CliRunner()
    path = str(tmp_path / "t.json")
    added = runner.invoke(cli, ["auth", "add-token", "ops", "--tokens", path])
    assert added.exit_code == 0, added.output
    token = added.stdout.strip()
    assert token.startswith(TOKEN_PREFIX)
    assert token not in Path(path).read_text()
    listed = runner.invoke(cli, ["auth", "list", "--tokens", path])
    assert listed.stdout.startswith("ops\t")
    again = runner.invoke(cli, ["auth", "add-token", "ops", "--tokens", path])
    assert again.exit_code == 1
    assert again.stderr.strip().splitlines()[-1].startswith("keel: error: a token named 'ops'")
    revoked = runner.invoke(cli, ["auth", "revoke", "ops", "--tokens", path])
    assert revoked.exit_code == 0
    assert json.loads(Path(path).read_text())["tokens"] == {}


async def test_requests_need_a_good_token(tmp_path: Path) -> None:
    """No token and a wrong token: 401 with ``WWW-Authenticate: Bearer``; a good token
    is served (old and current protocol alike); a revoked one is refused from the next
    request on, the server still running."""
    tokens = TokenFile(tmp_path / "tokens.json")
    good = tokens.add("ops")
    server = build(tmp_path, token_auth(tokens.path, "http://127.0.0.1"))
    async with serve_guarded(server) as url:
        missing = await raw(url)
        wrong = await raw(url, headers=bearer(TOKEN_PREFIX + "x" * 43))
        served = await raw(url, headers=bearer(good))
        quick = {"name": "quick", "arguments": {"n": 2}}
        current = await post(url, "tools/call", quick, token=good)
        tokens.revoke("ops")
        revoked = await raw(url, headers=bearer(good))
        revoked_current = await post(url, "tasks/get", {"taskId": "x"}, token=good)
    for refused in (missing, wrong, revoked):
        assert refused.status == 401, refused
        assert refused.headers["www-authenticate"].startswith("Bearer")
    assert served.status == 200, served
    assert current.status == 200, current
    assert revoked_current.status == 401


async def test_each_token_sees_only_its_own_tasks(tmp_path: Path) -> None:
    """The token's name is the principal: a task created with token A is, for token B,
    exactly an unknown id (same HTTP status, same JSON-RPC error) on tasks/get and
    tasks/cancel, and A still reads and cancels it."""
    tokens = TokenFile(tmp_path / "tokens.json")
    alice, bob = tokens.add("alice"), tokens.add("bob")
    server = build(tmp_path, token_auth(tokens.path, "http://127.0.0.1"))
    async with serve_guarded(server) as url:
        created = await post(url, "tools/call", {"name": "slow", "arguments": {}}, token=alice)
        task_id = created.result["taskId"]
        await poll(url, task_id, "working", token=alice)
        for method in ("tasks/get", "tasks/cancel"):
            foreign = await post(url, method, {"taskId": task_id}, token=bob)
            unknown = await post(url, method, {"taskId": "no-such-task"}, token=bob)
            assert observed(foreign) == observed(unknown)
            assert foreign.status == 400
            assert foreign.error["message"] == NOT_FOUND
        await post(url, "tasks/cancel", {"taskId": task_id}, token=alice)
        assert (await poll(url, task_id, "cancelled", token=alice))["status"] == "cancelled"
