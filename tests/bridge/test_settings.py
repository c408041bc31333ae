"""BridgeSettings.from_env reads the environment keel serve reads, so that one
environment configures front ends and `keel worker --app keel.bridge:app` alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from keel.bridge import BridgeSettings
from keel.errors import ConfigurationError


def test_defaults() -> None:
    settings = BridgeSettings.from_env({})
    assert settings.data_dir == Path("keel-data/bridge")
    assert not settings.has_sources
    assert settings.pace == "demo"


def test_the_serve_layout_and_sources_come_from_the_same_variables() -> None:
    settings = BridgeSettings.from_env(
        {
            "KEEL_DATA_DIR": "/srv/keel",
            "KEEL_BRIDGE_INCIDENTS": "/exports/incidents.json",
            "KEEL_BRIDGE_TRACES": "/exports/otel-a:/exports/otel-b",
            "KEEL_BRIDGE_DEPLOYS": "/exports/deploys.csv",
            "KEEL_BRIDGE_PACE": "fast",
        }
    )
    assert settings.data_dir == Path("/srv/keel/bridge")
    assert settings.incidents == Path("/exports/incidents.json")
    assert settings.traces == [Path("/exports/otel-a"), Path("/exports/otel-b")]
    assert settings.deploys == Path("/exports/deploys.csv")
    assert settings.has_sources
    assert settings.pace_seconds == 0.0


def test_an_explicit_bridge_data_dir_wins() -> None:
    settings = BridgeSettings.from_env({"KEEL_DATA_DIR": "/a", "KEEL_BRIDGE_DATA": "/b"})
    assert settings.data_dir == Path("/b")


@pytest.mark.parametrize(
    ("name", "value"), [("KEEL_BRIDGE_PACE", "sluggish"), ("KEEL_BRIDGE_LEASE", "soon")]
)
def test_bad_values_are_refused_by_name(name: str, value: str) -> None:
    with pytest.raises(ConfigurationError, match="(?i)" + name.removeprefix("KEEL_BRIDGE_")):
        BridgeSettings.from_env({name: value})
