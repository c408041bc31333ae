"""What every benchmark in bench/ ends with: the target checks, and the JSON file."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any


def print_targets(checks: list[dict[str, Any]]) -> None:
    """One line per target: ``[ok]`` or ``[MISS]``, what it is, what was measured."""
    print()
    for check in checks:
        print(f"  [{'ok' if check['ok'] else 'MISS'}] {check['target']}: {check['measured']}")


def write_results(path: str, benchmark: str, args: Any, **payload: Any) -> Path:
    """Write the results with when and where they were measured; return the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": benchmark,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "args": vars(args),
        **payload,
    }
    out.write_text(json.dumps(document, indent=2))
    return out
