"""``--store-timeout``: how long ``keel serve`` and ``keel worker`` let a call wait for the
store; from the flag, ``$KEEL_STORE_TIMEOUT`` or ``keel.toml``, and refused when it is not
a number of seconds."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from keel.cli.app import cli


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test sees the caller's settings, and each runs in its own directory."""
    for name in ("KEEL_STORE", "KEEL_CONFIG", "KEEL_STORE_TIMEOUT", "KEEL_APP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def check(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, ["serve", "--app", "conformance", "--check", *args], env=env)


def test_the_default_is_ten_seconds_and_the_flag_beats_env_beats_the_file() -> None:
    """The startup lines say how long calls wait; each source overrides the next."""
    assert "calls wait 10 s at most" in check().output
    Path("keel.toml").write_text("[serve]\nstore_timeout = 4.5\n")
    assert "calls wait 4.5 s at most" in check().output
    assert "calls wait 3 s at most" in check(env={"KEEL_STORE_TIMEOUT": "3"}).output
    flagged = check("--store-timeout", "2", env={"KEEL_STORE_TIMEOUT": "3"})
    assert "calls wait 2 s at most" in flagged.output


@pytest.mark.parametrize(
    ("args", "env", "config", "message"),
    [
        (["--store-timeout", "0"], {}, "", "0.0 is not in the range 0.1<=x<=3600"),
        ([], {"KEEL_STORE_TIMEOUT": "soon"}, "", "'soon' is not a valid float"),
        ([], {}, 'store_timeout = "10"', "[serve] store_timeout must be a number of seconds"),
    ],
    ids=["zero", "env-not-a-number", "file-a-string"],
)
def test_a_timeout_that_is_not_seconds_is_refused(
    args: list[str], env: dict[str, str], config: str, message: str
) -> None:
    """A usage error naming the problem (exit 2), no traceback."""
    if config:
        Path("keel.toml").write_text(f"[serve]\n{config}\n")
    result = check(*args, env=env)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_keel_worker_takes_it_too() -> None:
    """keel worker --store-timeout (its help names the variable's default)."""
    result = CliRunner().invoke(cli, ["worker", "--help"])
    assert result.exit_code == 0
    assert "--store-timeout" in result.output
    refused = CliRunner().invoke(cli, ["worker", "--app", "m:a", "--store-timeout", "-1"])
    assert refused.exit_code == 2
    assert "--store-timeout" in refused.output
