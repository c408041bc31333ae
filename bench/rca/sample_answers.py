"""Write ``answers.json`` for a dataset of ``keel bridge sample-data`` (the Bridge's own
generator), so that ``evaluate.py`` scores both generators the same way.

    uv run keel bridge sample-data /tmp/sample-2718 --seed 2718
    uv run python bench/rca/sample_answers.py /tmp/sample-2718
    uv run python bench/rca/evaluate.py /tmp/sample-2718

The sample generator's ground truth (``ground-truth.json``) is moved out of the dataset
(beside it, ``<dir>.ground-truth.json``), so the Bridge cannot read it while diagnosing.
Its causes are always services; its kinds are ``bad_deploy``, ``saturation`` and
``config_change``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TRUTH = "ground-truth.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dataset", type=Path)
    args = parser.parse_args()
    dataset: Path = args.dataset
    inside, outside = dataset / TRUTH, dataset.with_name(f"{dataset.name}.{TRUTH}")
    if inside.exists():
        inside.rename(outside)
    truth = json.loads(outside.read_text(encoding="utf-8"))
    named = {
        i["id"]: bool(i.get("service"))
        for i in json.loads((dataset / "incidents.json").read_text(encoding="utf-8"))
    }
    incidents = [
        {
            "id": case["incident_id"],
            "kind": case["kind"],
            "variant": case["kind"],
            "cause": case["root_service"],
            "cause_type": "service",
            "aliases": [case["root_service"]],
            "onset": case["onset"],
            "symptom_service": case["symptom_service"],
            "service_named": named[case["incident_id"]],
            "deploy_id": case.get("deploy_id"),
        }
        for case in truth["incidents"]
    ]
    answers = {"seed": truth.get("seed"), "generator": "sample-data", "incidents": incidents}
    (dataset / "answers.json").write_text(json.dumps(answers, indent=1), encoding="utf-8")
    print(f"{len(incidents)} incidents -> {dataset / 'answers.json'}")


if __name__ == "__main__":
    main()
