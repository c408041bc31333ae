"""``keel serve`` settings: flags over environment over the TOML file over defaults, and
clear refusals for bad files, unknown keys and bad stores (``--check`` prints the
resolved settings and exits without serving)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from keel.cli.app import cli

ENV = (
    "KEEL_STORE", "KEEL_CONFIG", "KEEL_HOST", "KEEL_PORT", "KEEL_DATA_DIR", "KEEL_APP",
    "KEEL_CONCURRENCY", "KEEL_NO_WORKER", "KEEL_RATE_LIMIT_POLLS", "KEEL_TRANSPORT",
    "KEEL_BRIDGE_PACE",
)  # fmt: skip


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test sees the caller's settings, and each runs in its own directory."""
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def check(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, ["serve", "--app", "conformance", "--check", *args], env=env)


def test_defaults_put_the_store_in_the_data_directory(tmp_path: Path) -> None:
    result = check()
    assert result.exit_code == 0, result.output
    assert "at http://127.0.0.1:8000/mcp" in result.output
    assert f"SQLite {tmp_path / 'keel-data' / 'keel.db'}" in result.output
    assert "synchronous=full" in result.output
    assert "workers: 4" in result.output
    assert (tmp_path / "keel-data" / "keel.db").exists()


def test_flags_beat_environment_beat_the_file_beat_defaults(tmp_path: Path) -> None:
    Path("keel.toml").write_text(
        '[serve]\nport = 9001\nhost = "127.0.0.2"\nconcurrency = 7\ndata_dir = "from-file"\n'
    )
    from_file = check()
    assert from_file.exit_code == 0, from_file.output
    assert "http://127.0.0.2:9001/mcp" in from_file.output
    assert "workers: 7" in from_file.output
    assert str(tmp_path / "from-file" / "keel.db") in from_file.output
    assert "config:  keel.toml" in from_file.output

    env = {"KEEL_PORT": "9002", "KEEL_CONCURRENCY": "3"}
    from_env = check(env=env)
    assert "http://127.0.0.2:9002/mcp" in from_env.output
    assert "workers: 3" in from_env.output

    from_flag = check("--port", "9003", env=env)
    assert "http://127.0.0.2:9003/mcp" in from_flag.output
    assert "workers: 3" in from_flag.output


def test_the_store_comes_from_flag_then_env_then_file_then_data_dir(tmp_path: Path) -> None:
    Path("keel.toml").write_text(f'[serve]\nstore = "{tmp_path / "file.db"}"\n')
    assert str(tmp_path / "file.db") in check().output
    env = {"KEEL_STORE": str(tmp_path / "env.db")}
    assert str(tmp_path / "env.db") in check(env=env).output
    flagged = check("--store", str(tmp_path / "flag.db"), env=env)
    assert str(tmp_path / "flag.db") in flagged.output
    rooted = CliRunner().invoke(
        cli,
        ["--store", str(tmp_path / "root.db"), "serve", "--app", "conformance", "--check"],
        env=env,
    )
    assert str(tmp_path / "root.db") in rooted.output


def test_an_explicit_config_file_that_is_missing_is_refused() -> None:
    result = check("--config", "nope.toml")
    assert result.exit_code == 2
    assert "no such file: nope.toml" in result.output


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[serve]\nport = \n", "cannot read"),
        ("[serve]\nbogus = 1\n", "unknown key(s) in [serve]: bogus"),
        ("[other]\nport = 1\n", "expected only a [serve] table, found other"),
        ("[serve]\nport = 70000\n", "70000"),
    ],
)
def test_a_bad_config_file_is_refused_naming_the_problem(text: str, message: str) -> None:
    Path("bad.toml").write_text(text)
    result = check("--config", "bad.toml")
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not Path("keel-data").exists()  # nothing was created


def test_a_bad_store_is_one_line_and_creates_nothing() -> None:
    result = check("--store", "mysql://x")
    assert result.exit_code == 1
    assert result.output.startswith("keel: error:")
    assert not Path("keel-data").exists()


def test_bridge_settings_are_refused_for_other_apps() -> None:
    result = check("--pace", "fast")
    assert result.exit_code == 2
    assert "Bridge settings" in result.output


def test_no_worker_with_memory_is_refused() -> None:
    result = check("--store", "memory://", "--no-worker")
    assert result.exit_code == 1
    assert "could never run a task" in result.output


def test_rate_limiting_is_shown_when_on() -> None:
    assert "polls:   rate-limited" in check("--rate-limit-polls").output
    assert "polls:   not rate-limited" in check().output


def test_the_rate_of_new_sessions_is_shown_from_keel_toml_and_options() -> None:
    """The ``session_*`` keys of keel.toml, overridden by the options, in --check's
    printout; the defaults without them."""
    assert "new 2025-11-25 sessions: 50 a second (bursts of 50), 8 opening at once, 200 more" in (
        check().output
    )
    Path("rate.toml").write_text("[serve]\nsession_rate = 2.5\nsession_queue = 0\n")
    result = check("--config", "rate.toml", "--session-burst", "3", "--session-openings", "1")
    assert result.exit_code == 0, result.output
    assert "new 2025-11-25 sessions: 2.5 a second (bursts of 3), 1 opening at once, 0 more" in (
        result.output
    )


def test_a_port_in_use_is_one_line_before_anything_serves() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["serve", "--app", "conformance", "--port", str(port)])
    assert result.exit_code == 1
    assert f"keel: error: cannot listen on 127.0.0.1:{port}" in result.output
    assert "choose one with --port" in result.output


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("store = 5", "[serve] store must be a string, not 5"),
        ("incidents = 3", "[serve] incidents must be a string"),
        ('port = "80"', "[serve] port must be an integer"),
        ('verbose = "maybe"', "[serve] verbose must be true or false"),
        ("traces = [1, 2]", "[serve] traces must be a path or a list of paths"),
        ("pace = true", "[serve] pace must be a preset name or seconds"),
        ('session_rate = "fast"', "[serve] session_rate must be a number of sessions a second"),
        ("session_queue = 1.5", "[serve] session_queue must be an integer"),
        ("session_burst = true", "[serve] session_burst must be an integer"),
        ("session_queue = -1", "'--session-queue': -1 is not in the range 0<=x<=1000000"),
        ("session_rate = 0", "'--session-rate': 0.0 is not in the range 0.01<=x<=1000000.0"),
    ],
)
def test_a_config_value_of_the_wrong_type_is_refused_naming_it(line: str, message: str) -> None:
    Path("bad.toml").write_text(f"[serve]\n{line}\n")
    result = check("--config", "bad.toml")
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_bridge_settings_from_the_environment_do_not_stop_another_app() -> None:
    """The Bridge's variables, set for front ends and workers alike, are ignored by
    --app conformance; only Bridge flags on the command line are refused."""
    result = check(env={"KEEL_BRIDGE_PACE": "fast", "KEEL_BRIDGE_TRACES": "/nowhere"})
    assert result.exit_code == 0, result.output
    refused = check("--pace", "fast", "--deploys", __file__)
    assert refused.exit_code == 2
    assert "--pace, --deploys: Bridge settings, not for --app conformance" in refused.output


@pytest.mark.slow
def test_the_bridge_reads_the_environment_its_workers_read(tmp_path: Path) -> None:
    """KEEL_BRIDGE_DATA places the Bridge's data for keel serve as for keel worker."""
    result = CliRunner().invoke(
        cli,
        ["serve", "--check", "--pace", "fast"],
        env={"KEEL_BRIDGE_DATA": str(tmp_path / "shared-bridge")},
    )
    assert result.exit_code == 0, result.output
    assert f"bridge data:  {tmp_path / 'shared-bridge'}" in result.output
    assert (tmp_path / "shared-bridge" / "incidents.json").exists()
