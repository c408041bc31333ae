"""Fixtures of the Bridge tests: generated datasets (made once per session and seed)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from keel.bridge.core import prepare
from keel.bridge.generate import GROUND_TRUTH, generate
from keel.bridge.settings import BridgeSettings

DatasetFactory = Callable[..., BridgeSettings]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> DatasetFactory:
    """``dataset(seed, incidents=12)``: a generated, indexed dataset's settings (fast pace).

    The ground truth is moved out of the data folder, to ``truth_of(settings)``: what
    the Bridge is given holds nothing that tells the answer.
    """
    made: dict[tuple[int, int], BridgeSettings] = {}

    def make(seed: int, incidents: int = 12) -> BridgeSettings:
        key = (seed, incidents)
        if key not in made:
            root = tmp_path_factory.mktemp(f"bridge-{seed}-{incidents}")
            data = root / "data"
            generate(data, seed=seed, incidents=incidents)
            (data / GROUND_TRUTH).rename(root / GROUND_TRUTH)
            settings = BridgeSettings(data_dir=data, pace="fast")
            prepare(settings, log=lambda _line: None)
            made[key] = settings
        return made[key]

    return make


def truth_of(settings: BridgeSettings) -> list[dict[str, Any]]:
    """The injected causes of a dataset made by the ``dataset`` fixture."""
    truth = json.loads((settings.data_dir.parent / GROUND_TRUTH).read_text())
    incidents: list[dict[str, Any]] = truth["incidents"]
    return incidents


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path, with its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }
