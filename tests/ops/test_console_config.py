"""``keel ops`` reads keel.toml as ``keel serve`` does (the store, auth, operators), and
``--operators`` limits the console to some principals, in ``keel ops`` and in ``keel
serve`` (whose other valid tokens still reach ``/mcp``)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from keel.cli.app import cli
from keel.mcp.tokens import TokenFile

from .page import Page
from .servers import base_of, serving


def _ops(*args: str, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    result = CliRunner().invoke(cli, ["ops", "--port", "8123", "--check", *args], env=env)
    return result.exit_code, result.output.splitlines()


@pytest.fixture
def configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with a keel.toml (as keel serve reads it) and its token file, as the
    current directory: alice's and carol's tokens, only alice an operator."""
    tokens = TokenFile(tmp_path / "tokens.json")
    tokens.add("alice")
    tokens.add("carol")
    (tmp_path / "keel.toml").write_text(
        "[serve]\n"
        'data_dir = "state"\n'
        f'auth = "tokens:{tokens.path}"\n'
        'operators = ["alice"]\n'
        "port = 9000  # keel serve's /mcp port: not the console's\n"
        "store_timeout = 3\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KEEL_STORE", raising=False)
    return tmp_path


def test_keel_ops_reads_the_store_auth_and_operators_of_keel_toml(configured: Path) -> None:
    """Without flags: DATA_DIR/keel.db of keel.toml's data_dir (keel serve's store), its
    auth and its operators; the console's own port, not keel serve's."""
    code, lines = _ops()
    assert code == 0, lines
    assert "keel ops: operator console at http://127.0.0.1:8123/ops/" in lines
    assert f"  store: SQLite {configured / 'state' / 'keel.db'} " in lines[1]
    assert f"  auth:  bearer tokens of {configured / 'tokens.json'}" in lines
    assert "  who:   operators: alice" in lines
    assert "  config: keel.toml" in lines
    assert (configured / "state" / "keel.db").exists()


def test_flags_and_environment_come_before_keel_toml(configured: Path) -> None:
    """--store, --operators and $KEEL_OPERATORS beat the file, as for keel serve;
    --config names another file; a file named that is not there is an error."""
    other = configured / "other.db"
    code, lines = _ops("--store", str(other), "--operators", "carol,alice")
    assert code == 0, lines
    assert str(other) in lines[1]
    assert "  who:   operators: alice, carol" in lines
    code, lines = _ops(env={"KEEL_OPERATORS": "carol"})
    assert "  who:   operators: carol" in lines
    (configured / "plain.toml").write_text('[serve]\nstore = "plain.db"\n')
    code, lines = _ops("--config", "plain.toml")
    assert code == 0, lines
    assert "plain.db" in lines[1]
    assert "  auth:  none (loopback)" in lines
    code, lines = _ops("--config", "missing.toml")
    assert code == 2
    assert "no such file: missing.toml" in lines[-1]


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("operators = 3", "[serve] operators must be a list of names"),
        ('operators = ["alice", ""]', "--operators: operators must be names separated"),
        ("nonsense = 1", "unknown key(s) in [serve]: nonsense"),
    ],
)
def test_a_bad_keel_toml_is_one_error_line(configured: Path, toml: str, message: str) -> None:
    """A value of the wrong type, an empty operator name, an unknown key: one error line
    naming it, no traceback, no store made."""
    (configured / "keel.toml").write_text(
        f'[serve]\nauth = "tokens:{configured / "tokens.json"}"\n{toml}\n'
    )
    code, lines = _ops()
    assert code in {1, 2}
    assert message in lines[-1]
    assert "Traceback" not in "\n".join(lines)
    assert not (configured / "keel-data").exists()


def test_operators_without_auth_are_refused(tmp_path: Path) -> None:
    """--operators on a console without --auth (nobody is told apart): one error line."""
    code, lines = _ops("--store", str(tmp_path / "k.db"), "--operators", "alice")
    assert code == 1
    assert lines == [
        "keel: error: --operators needs --auth: without a token nobody is told apart "
        "(on loopback, everyone is the operator)"
    ]


@pytest.mark.anyio
@pytest.mark.slow  # a real keel serve
async def test_keel_serve_operators_limit_the_console_not_mcp(tmp_path: Path) -> None:
    """keel serve --auth tokens:FILE --operators alice: carol's valid token is let into
    /mcp but gets 403 from /ops with the page that says why; alice's gets the console."""
    db, tokens = tmp_path / "keel.db", TokenFile(tmp_path / "tokens.json")
    alice, carol = tokens.add("alice"), tokens.add("carol")
    auth = ("--auth", f"tokens:{tokens.path}", "--operators", "alice")
    async with serving("serve", db, tmp_path, *auth) as server:
        assert "operators: alice" in server.output()
        async with httpx.AsyncClient(base_url=base_of(server)) as http:
            as_carol = {"Authorization": f"Bearer {carol}"}
            refused = await http.get("/ops/", headers=as_carol)
            assert refused.status_code == 403
            assert "carol is not an operator" in Page(refused.text).all_text
            mcp = await http.post(
                "/mcp",
                headers={**as_carol, "Accept": "application/json, text/event-stream"},
                json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
            )
            assert mcp.status_code not in {401, 403}, mcp.text
            ok = await http.get("/ops/", headers={"Authorization": f"Bearer {alice}"})
            assert ok.status_code == 200
