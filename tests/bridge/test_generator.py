"""The sample-data generator: deterministic per seed, every kind of cause, the seed's
incident, and the ``keel bridge`` commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from keel.bridge.generate import GROUND_TRUTH, KINDS, SEED_DEPLOY, SEED_INCIDENT, generate
from keel.cli.app import cli

from .conftest import tree_bytes


@pytest.mark.slow  # two whole datasets generated: about a second
def test_same_seed_same_bytes_other_seed_other_data(tmp_path: Path) -> None:
    """Two runs with one seed write identical files; another seed writes other data."""
    for name, seed in (("a", 11), ("b", 11), ("c", 12)):
        generate(tmp_path / name, seed=seed, incidents=4, rate=5)
    assert tree_bytes(tmp_path / "a") == tree_bytes(tmp_path / "b")
    assert tree_bytes(tmp_path / "a") != tree_bytes(tmp_path / "c")


def test_dataset_holds_every_kind_the_seed_incident_and_the_truth_beside(tmp_path: Path) -> None:
    """Incidents of every kind, red herrings, the seed's incident naming no service and
    caused by d-8812; the truth in its own file, which the data files never mention."""
    summary = generate(tmp_path, seed=5, incidents=6, rate=5)
    truth = json.loads((tmp_path / GROUND_TRUTH).read_text())["incidents"]
    incidents = {i["id"]: i for i in json.loads((tmp_path / "incidents.json").read_text())}
    deploys = {d["id"]: d for d in json.loads((tmp_path / "deploys.json").read_text())}
    assert summary.incidents == len(incidents) == len(truth) == 7
    assert {t["kind"] for t in truth} == set(KINDS)
    assert incidents[SEED_INCIDENT]["service"] is None
    assert deploys[SEED_DEPLOY]["service"] == "payments"
    assert deploys[SEED_DEPLOY]["kind"] == "config"
    for case in truth:
        assert case["incident_id"] in incidents
        if case["kind"] == "saturation":
            assert case["deploy_id"] is None
        else:
            assert deploys[case["deploy_id"]]["service"] == case["root_service"]
        for herring in case["herring_ids"]:
            assert herring in deploys
    for name in ("incidents.json", "deploys.json"):
        assert "root_service" not in (tmp_path / name).read_text()


@pytest.mark.slow
def test_cli_sample_data_ingest_and_diagnose(tmp_path: Path) -> None:
    """``keel bridge sample-data``, ``ingest`` (a no-op the second time) and ``diagnose``."""
    runner = CliRunner()
    data = tmp_path / "d"
    made = runner.invoke(
        cli, ["bridge", "sample-data", str(data), "--seed", "9", "--incidents", "3"]
    )
    assert made.exit_code == 0, made.output
    assert "4 incidents" in made.output
    first = runner.invoke(cli, ["bridge", "ingest", "--data-dir", str(data)])
    assert first.exit_code == 0, first.output
    assert "indexed now" in first.output
    second = runner.invoke(cli, ["bridge", "ingest", "--data-dir", str(data)])
    assert "indexed now" not in second.output
    done = runner.invoke(
        cli, ["bridge", "diagnose", SEED_INCIDENT, "--service", "payments", "--data-dir", str(data)]
    )
    assert done.exit_code == 0, done.output
    assert SEED_DEPLOY in done.output.splitlines()[0]
    unknown = runner.invoke(cli, ["bridge", "diagnose", "INC-NOPE", "--data-dir", str(data)])
    assert unknown.exit_code == 1
    assert "unknown incident: 'INC-NOPE'" in unknown.output
