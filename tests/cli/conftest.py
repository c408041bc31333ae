"""What every in-process CLI test needs."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def no_env_store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test sees the caller's $KEEL_STORE, and each runs in its own directory."""
    monkeypatch.delenv("KEEL_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
