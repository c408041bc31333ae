"""The interop harness's own tests: ``uv run pytest -q interop/tests`` (no clients needed)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
