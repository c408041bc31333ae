"""``keel serve --app MODULE``: an app module of the user's (the seam of
keel.mcp.serving) serves with its own options, shown in help, read from the command
line, the environment and the ``[serve]`` table, and checked like a built-in app's."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from keel.cli.app import cli
from keel.cli.serve import app_module

GREETER = """
import click
from keel.mcp.serving import Served
from keel.runtime import Keel

app = Keel()

@app.task("greet")
async def greet(ctx) -> str:
    return "hello"

serve_options = [
    click.Option(["--greeting"], default="hi", envvar="KEEL_GREETER_GREETING",
                 help="Greeter: what it says."),
]

def config_problem(key, value):
    if key == "greeting" and not isinstance(value, str):
        return f"must be a string, not {value!r}"
    return None

def build_server(settings, *, greeting="hi"):
    app.use_store(settings.store)
    return Served(app, settings.server_for(app, "greeter"), "Greeter",
                  (f"  greeting: {greeting}",))
"""


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Each test in its own directory holding the app modules; the import path, the
    imported modules and keel serve's cache of app modules put back after it."""
    for name in ("KEEL_STORE", "KEEL_CONFIG", "KEEL_APP", "KEEL_GREETER_GREETING"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "greeter_app.py").write_text(GREETER)
    (tmp_path / "no_seam_app.py").write_text("from keel.runtime import Keel\napp = Keel()\n")
    app_module.cache_clear()
    yield
    app_module.cache_clear()
    for name in ("greeter_app", "no_seam_app"):
        sys.modules.pop(name, None)


def serve(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, ["serve", *args], env=env)


def test_an_app_module_is_built_with_its_own_option() -> None:
    result = serve("--app", "greeter_app", "--greeting", "hello", "--check")
    assert result.exit_code == 0, result.output
    assert "keel serve: Greeter at http://127.0.0.1:8000/mcp" in result.output
    assert "greeting: hello" in result.output
    default = serve("--app=greeter_app", "--check")
    assert "greeting: hi" in default.output


def test_its_option_is_in_help_only_when_it_is_named() -> None:
    assert "Greeter: what it says." in serve("--app", "greeter_app", "--help").output
    assert "--greeting" not in serve("--help").output
    refused = serve("--app", "conformance", "--greeting", "x", "--check")
    assert refused.exit_code == 2
    assert "No such option '--greeting'" in refused.output


def test_keel_app_in_the_environment_names_it_and_its_variable_is_read() -> None:
    env = {"KEEL_APP": "greeter_app", "KEEL_GREETER_GREETING": "from env"}
    result = serve("--check", env=env)
    assert result.exit_code == 0, result.output
    assert "greeting: from env" in result.output


def test_its_keys_in_the_config_file_are_read_and_checked() -> None:
    Path("keel.toml").write_text('[serve]\ngreeting = "from file"\n')
    result = serve("--app", "greeter_app", "--check")
    assert result.exit_code == 0, result.output
    assert "greeting: from file" in result.output
    Path("keel.toml").write_text("[serve]\ngreeting = 5\n")
    bad = serve("--app", "greeter_app", "--check")
    assert bad.exit_code == 2
    assert "[serve] greeting must be a string, not 5" in bad.output


def test_named_only_in_the_config_file_it_is_served_with_its_defaults() -> None:
    Path("keel.toml").write_text('[serve]\napp = "greeter_app"\n')
    result = serve("--check")
    assert result.exit_code == 0, result.output
    assert "keel serve: Greeter" in result.output
    assert "greeting: hi" in result.output


def test_a_built_in_apps_option_is_refused_for_it() -> None:
    result = serve("--app", "greeter_app", "--pace", "fast", "--check")
    assert result.exit_code == 2
    assert "--pace: Bridge settings, not for --app greeter_app" in result.output


@pytest.mark.parametrize(
    ("module", "message"),
    [
        ("no_such_module_here", "cannot import 'no_such_module_here' for --app"),
        ("no_seam_app", "has no build_server (the seam of keel.mcp.serving); for a Keel app"),
    ],
)
def test_a_module_that_is_no_app_module_is_one_clear_error(module: str, message: str) -> None:
    result = serve("--app", module, "--check")
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert not Path("keel-data").exists()


def test_a_keel_app_in_it_is_still_served_by_module_and_attribute() -> None:
    result = serve("--app", "no_seam_app:app", "--check")
    assert result.exit_code == 0, result.output
    assert "keel serve: app no_seam_app:app" in result.output
