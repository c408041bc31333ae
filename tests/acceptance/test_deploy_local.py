"""Acceptance: examples/deploy_local.py, the topology of docs/deploy.md on one machine.

Two front ends and two workers on a PostgreSQL schema of their own: all ready, tasks
created through both front ends, a worker SIGKILLed while it runs tasks and replaced,
every task completed, the metrics and health read back from every process, everything
stopped with exit code 0 (the script checks each and exits 1 if one fails).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from postgres.pg import drop_schema, new_schema, require_postgres, store_url

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "deploy_local.py"


def test_the_local_deployment_comes_up_survives_a_kill_and_reports() -> None:
    """The script's own checks pass: creations counted by the front ends, every task
    completed, the killed worker's leases recovered, every process ready, exit codes 0."""
    require_postgres()
    schema = new_schema()
    try:
        done = subprocess.run(
            [sys.executable, str(SCRIPT), "--store", store_url(schema), "--tasks", "30"],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        drop_schema(schema)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "deploy_local: ok" in done.stdout
    assert '"created_by_front_ends": 30' in done.stdout
