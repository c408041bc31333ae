"""Bind safety (issue 15, part 4): ``keel serve`` on an address other machines reach,
without ``--auth``, refuses to start in one ``keel: error:`` line, unless
``--insecure-no-auth`` says so (then it warns); the allow-list options are read from
the command line and keel.toml alike."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from keel.mcp.access import HttpAccess, bind_problem, is_loopback
from keel_serve import KEEL

TIMEOUT = 60.0  # seconds a refusing (or --check) keel serve may take


def keel_serve(cwd: Path, *args: str, app: str = "conformance") -> subprocess.CompletedProcess[str]:
    """``keel serve --app APP ARGS`` as a real process in ``cwd``."""
    env = {**os.environ, "KEEL_STORE": "", "KEEL_APP": ""}
    return subprocess.run(
        [str(KEEL), "serve", "--app", app, "--data-dir", str(cwd / "data"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def test_public_bind_without_auth_refuses_to_start(tmp_path: Path) -> None:
    """``--host 0.0.0.0`` with no ``--auth``: exit 1, one ``keel: error:`` line naming
    the choices, nothing served, no store created."""
    done = keel_serve(tmp_path, "--host", "0.0.0.0", "--port", "0")
    assert done.returncode == 1, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("keel: error: --host 0.0.0.0 is reachable from other machines")
    assert "--auth tokens:FILE" in lines[0]
    assert "--insecure-no-auth" in lines[0]
    assert not (tmp_path / "data" / "keel.db").exists()


def test_insecure_no_auth_warns_and_starts(tmp_path: Path) -> None:
    """``--insecure-no-auth`` lets it start, with a warning; the allow-lists it would
    serve with are printed."""
    done = keel_serve(
        tmp_path,
        "--host",
        "0.0.0.0",
        "--insecure-no-auth",
        "--allowed-host",
        "mcp.example.com",
        "--check",
    )
    assert done.returncode == 0, done
    assert "keel: warning: --insecure-no-auth" in done.stderr
    assert "mcp.example.com:*" in done.stderr
    assert "auth:    none" in done.stderr


def test_config_file_keys(tmp_path: Path) -> None:
    """keel.toml's ``insecure_no_auth`` and ``allowed_hosts`` work as the flags do; a
    value of the wrong type is refused naming the key."""
    (tmp_path / "keel.toml").write_text(
        '[serve]\nhost = "0.0.0.0"\ninsecure_no_auth = true\n'
        'allowed_hosts = ["proxy.example"]\nallowed_origins = ["https://ui.example"]\n'
    )
    done = keel_serve(tmp_path, "--check")
    assert done.returncode == 0, done
    assert "proxy.example:*" in done.stderr

    (tmp_path / "keel.toml").write_text('[serve]\nallowed_hosts = "proxy.example"\n')
    done = keel_serve(tmp_path, "--check")
    assert done.returncode == 2, done
    assert "allowed_hosts must be a list of strings" in done.stderr


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("192.168.0.7", False),
    ],
)
def test_which_binds_are_loopback(host: str, loopback: bool) -> None:
    """Loopback addresses (and ``localhost``) need no auth; wildcard and other addresses
    do."""
    assert is_loopback(host) is loopback
    problem = bind_problem(host, authenticated=False, insecure_no_auth=False)
    assert (problem is None) is loopback
    assert bind_problem(host, authenticated=True, insecure_no_auth=False) is None


def test_default_allow_lists() -> None:
    """Every bind allows the loopback names with any port and the bound address; an
    allowed host brings its own origins; bad entries are refused naming the option."""
    access = HttpAccess.for_bind("10.1.2.3", 8000, hosts=["mcp.example.com:8443"])
    assert access.allowed_hosts == (
        "127.0.0.1:*",
        "localhost:*",
        "[::1]:*",
        "10.1.2.3:8000",
        "mcp.example.com:8443",
    )
    assert "https://mcp.example.com:8443" in access.allowed_origins
    assert "http://10.1.2.3:8000" in access.allowed_origins
    assert HttpAccess.for_bind("::1", 9).allowed_hosts == ("127.0.0.1:*", "localhost:*", "[::1]:*")
    from keel.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="--allowed-host"):
        HttpAccess.for_bind("127.0.0.1", 1, hosts=["http://x/"])
    with pytest.raises(ConfigurationError, match="--allowed-origin"):
        HttpAccess.for_bind("127.0.0.1", 1, origins=["app.example.com"])


OWN_SERVER_APP = """
from mcp.server import MCPServer

from keel.mcp.serving import Served
from keel.runtime import Keel


def build_server(settings):
    app = Keel()
    app.use_store(settings.store)
    return Served(app, MCPServer("own"), "own server")
"""


def test_auth_on_an_app_that_ignores_it_refuses_to_start(tmp_path: Path) -> None:
    """An app module that builds its MCPServer itself (not with ``server_for``) would
    serve without the ``--auth`` it was started with: keel serve refuses, naming why."""
    from keel.mcp.tokens import TokenFile

    TokenFile(tmp_path / "tokens.json").add("ops")
    (tmp_path / "own_server_app.py").write_text(OWN_SERVER_APP)
    auth = f"tokens:{tmp_path / 'tokens.json'}"
    done = keel_serve(tmp_path, "--auth", auth, "--check", app="own_server_app")
    assert done.returncode == 1, done
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "keel: error: --app own_server_app built its server without ServeSettings.server_for"
        )
    )


def test_cli_defaults_are_the_modules() -> None:
    """The CLI's session-limit defaults (kept as literals so that ``keel --help`` does
    not import the SDK's server) are those of keel.mcp.access."""
    from keel.cli import access as cli_access
    from keel.mcp import access

    assert cli_access.DEFAULT_MAX_SESSIONS == access.MAX_SESSIONS
    assert cli_access.DEFAULT_IDLE == access.SESSION_IDLE_TIMEOUT


def test_auth_over_stdio_is_refused_not_ignored(tmp_path: Path) -> None:
    """``--auth`` with ``--transport stdio``: over stdio there is no one to
    authenticate, so the setting is refused in one ``keel: error:`` line, not silently
    dropped; nothing is served and no store created."""
    tokens = tmp_path / "tokens.json"
    done = keel_serve(tmp_path, "--transport", "stdio", "--auth", f"tokens:{tokens}", "--check")
    assert done.returncode == 1, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("keel: error: --auth tokens:")
    assert "--transport http only" in lines[0]
    assert not (tmp_path / "data" / "keel.db").exists()
