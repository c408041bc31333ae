"""Score the Incident Bridge's root-cause diagnosis on a dataset from ``generate.py``.

    uv run python bench/rca/evaluate.py DATASET [--cli] [--strip-bom] [--out FILE]
    uv run python bench/rca/evaluate.py --self-check

The trace index is built once (``keel bridge ingest``, a real subprocess), then every
incident is diagnosed, by default in this process through the entry point the CLI uses
(``keel.bridge.core.open_bridge`` + ``keel.bridge.diagnosis.run_diagnosis``, the same
dict ``keel bridge diagnose --json`` prints), or with ``--cli`` by running
``keel bridge diagnose ID --json …`` once per incident. An incident that names no service
is answered ``--service <symptom service from answers.json>``, as a responder would.

How an answer is read (the output format will grow; unknown fields are ignored):

* the **named cause** is ``root_cause``'s dependency name if it has one (the first of
  ``dependency``, ``target``, ``peer``, ``name`` that is a string), else its ``service``;
* **no clear cause** is ``root_cause`` missing or null, or its ``kind`` one of
  ``none``/``no_clear_cause``/``unknown``/``inconclusive``, or no name in it;
* the **ranked list** is the named cause, then ``hypotheses`` by ``rank`` (each named the
  same way), duplicates dropped;
* the **confidence** is ``confidence`` (missing means 0).

A name matches the truth when it equals any alias in ``answers.json`` (case-insensitive):
for a service its ``service.name``; for a dependency every name its callers' spans give it
(``peer.service``, ``server.address``, ``db.name``, a unique ``db.system``/
``messaging.system``, the topics of a broker).

Metrics, per kind and overall:

* ``AC@1`` / ``AC@3``: the true cause is the named cause / in the first three. On a
  noise-only incident (no true cause) an answer counts as right when it abstains.
* ``abstain``: share of incidents answered "no clear cause" or with confidence < 0.5 (on
  noise-only incidents this is the rate we want high, elsewhere low).
* ``AUROC`` and ``Brier``: of the confidence as a predictor of "the named cause is
  right", over the incidents where a cause was named (a named cause on a noise-only
  incident is wrong). AUROC is null when all are right or all wrong.
* ``wrong>0.9``: named causes that are wrong with confidence above 0.9.
* ``deploy@1`` (bad deploys only): the named deploy id is the bad one.
* ``onset±min``: median distance between the reported ``onset`` and the true one
  (minutes; the fault's start, for a slow leak when it became visible).
* ``errors``: diagnoses that failed (counted wrong, not named).

``--strip-bom`` hands the Bridge a copy of a deploys CSV without its UTF-8 byte-order
mark; it exists only because the current CSV reader rejects such a file (see README).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

ABSTAIN_KINDS = {"none", "no_clear_cause", "unknown", "inconclusive", "no_cause"}
NAME_FIELDS = ("dependency", "target", "peer", "name")
KIND_ORDER = [
    "service_self_slowdown",
    "dependency_saturation",
    "queue_or_external",
    "fanout_dilution",
    "bad_deploy",
    "overlapping",
    "noise_only",
]


# ---------------------------------------------------------------- metrics


def auroc(scores: Sequence[float], labels: Sequence[int]) -> float | None:
    """Area under the ROC curve (Mann-Whitney; ties count one half); None if one class."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not pos or not neg:
        return None
    wins = 0.0
    for p in pos:
        for n in neg:
            wins += 1.0 if p > n else 0.5 if p == n else 0.0
    return wins / (len(pos) * len(neg))


def brier(scores: Sequence[float], labels: Sequence[int]) -> float | None:
    if not scores:
        return None
    return sum((s - y) ** 2 for s, y in zip(scores, labels, strict=True)) / len(scores)


def _name_of(entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return None
    for key in NAME_FIELDS:
        value = entry.get(key)
        if isinstance(value, str) and value:
            return value
    value = entry.get("service")
    return value if isinstance(value, str) and value else None


def read_answer(result: dict[str, Any]) -> dict[str, Any]:
    """The parts of a diagnosis result that are scored (see the module docstring)."""
    root = result.get("root_cause")
    named = _name_of(root)
    kind = root.get("kind") if isinstance(root, dict) else None
    no_cause = named is None or (isinstance(kind, str) and kind.lower() in ABSTAIN_KINDS)
    ranked: list[str] = []
    if not no_cause and named:
        ranked.append(named)
    hypotheses = result.get("hypotheses")
    if isinstance(hypotheses, list):
        ordered = sorted(
            (h for h in hypotheses if isinstance(h, dict)),
            key=lambda h: h.get("rank", 10**6) if isinstance(h.get("rank"), int) else 10**6,
        )
        for h in ordered:
            name = _name_of(h)
            hkind = h.get("kind")
            if (
                name
                and not (isinstance(hkind, str) and hkind.lower() in ABSTAIN_KINDS)
                and name.lower() not in {r.lower() for r in ranked}
            ):
                ranked.append(name)
    confidence = result.get("confidence")
    conf = float(confidence) if isinstance(confidence, int | float) else 0.0
    deploy = root.get("deploy_id") if isinstance(root, dict) else None
    onset = result.get("onset")
    return {
        "named": None if no_cause else named,
        "ranked": ranked,
        "confidence": conf,
        "root_kind": kind,
        "deploy_id": deploy if isinstance(deploy, str) else None,
        "onset": onset if isinstance(onset, str) else None,
    }


def _ns(text: str) -> int:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int(moment.timestamp() * 1e9)


def matches(name: str | None, aliases: Sequence[str]) -> bool:
    return name is not None and name.lower() in {a.lower() for a in aliases}


def score(truth: dict[str, Any], answer: dict[str, Any] | None) -> dict[str, Any]:
    """One incident's scores; ``answer`` None means the diagnosis failed."""
    if answer is None:
        return {
            "ac1": 0,
            "ac3": 0,
            "abstained": False,
            "named": False,
            "conf": 0.0,
            "label": 0,
            "error": True,
            "deploy_ok": None,
            "onset_error_min": None,
        }
    conf = answer["confidence"]
    abstained = answer["named"] is None or conf < 0.5
    if truth["cause"] is None:
        ac1 = ac3 = int(abstained)
        label = 0
    else:
        ac1 = int(matches(answer["named"], truth["aliases"]))
        ac3 = int(any(matches(n, truth["aliases"]) for n in answer["ranked"][:3]))
        label = ac1
    deploy_ok = None
    if truth.get("deploy_id"):
        deploy_ok = int(answer["deploy_id"] == truth["deploy_id"])
    onset_error = None
    if truth.get("onset") and answer.get("onset"):
        onset_error = round(abs(_ns(answer["onset"]) - _ns(truth["onset"])) / 60e9, 1)
    return {
        "ac1": ac1,
        "ac3": ac3,
        "abstained": abstained,
        "named": answer["named"] is not None,
        "conf": conf,
        "label": label,
        "error": False,
        "deploy_ok": deploy_ok,
        "onset_error_min": onset_error,
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    if not n:
        return {"n": 0}
    named = [r for r in rows if r["named"]]
    scores = [r["conf"] for r in named]
    labels = [r["label"] for r in named]
    deploys = [r["deploy_ok"] for r in rows if r["deploy_ok"] is not None]
    onsets = sorted(r["onset_error_min"] for r in rows if r["onset_error_min"] is not None)
    return {
        "n": n,
        "ac1": sum(r["ac1"] for r in rows) / n,
        "ac3": sum(r["ac3"] for r in rows) / n,
        "abstain": sum(r["abstained"] for r in rows) / n,
        "auroc": auroc(scores, labels),
        "brier": brier(scores, labels),
        "wrong_above_0_9": sum(1 for r in named if not r["label"] and r["conf"] > 0.9),
        "mean_confidence": sum(r["conf"] for r in rows) / n,
        "deploy_at_1": sum(deploys) / len(deploys) if deploys else None,
        "errors": sum(r["error"] for r in rows),
        "median_onset_error_min": onsets[len(onsets) // 2] if onsets else None,
    }


# ---------------------------------------------------------------- running the Bridge


def _keel() -> list[str]:
    return [sys.executable, "-m", "keel"]


def _paths(dataset: Path, deploys: Path) -> list[str]:
    return [
        "--incidents",
        str(dataset / "incidents.json"),
        "--traces",
        str(dataset / "traces"),
        "--deploys",
        str(deploys),
    ]


def ingest(dataset: Path, data_dir: Path, deploys: Path) -> float:
    began = time.perf_counter()
    subprocess.run(
        [*_keel(), "bridge", "ingest", "--data-dir", str(data_dir), *_paths(dataset, deploys)],
        check=True,
    )
    return time.perf_counter() - began


def cli_runner(dataset: Path, data_dir: Path, deploys: Path) -> Callable[..., dict[str, Any]]:
    def run(incident_id: str, service: str | None) -> dict[str, Any]:
        cmd = [
            *_keel(),
            "bridge",
            "diagnose",
            incident_id,
            "--json",
            "--data-dir",
            str(data_dir),
            *_paths(dataset, deploys),
        ]
        if service:
            cmd += ["--service", service]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(done.stderr.strip() or f"exit status {done.returncode}")
        return dict(json.loads(done.stdout[done.stdout.index("{") :]))

    return run


def import_runner(dataset: Path, data_dir: Path, deploys: Path) -> Callable[..., dict[str, Any]]:
    from keel.bridge.core import open_bridge
    from keel.bridge.diagnosis import run_diagnosis
    from keel.bridge.settings import BridgeSettings

    settings = BridgeSettings(
        data_dir=data_dir,
        incidents=dataset / "incidents.json",
        traces=[dataset / "traces"],
        deploys=deploys,
        pace="fast",
    )
    bridge = open_bridge(settings, log=lambda *_: None)

    def run(incident_id: str, service: str | None) -> dict[str, Any]:
        return dict(run_diagnosis(bridge, incident_id, service))

    return run


def _deploys_file(dataset: Path, strip_bom: bool, tmp: Path) -> Path:
    for name in ("deploys.csv", "deploys.json"):
        path = dataset / name
        if path.exists():
            data = path.read_bytes()
            if strip_bom and data.startswith(b"\xef\xbb\xbf"):
                copy = tmp / name
                copy.write_bytes(data[3:])
                return copy
            return path
    raise SystemExit(f"{dataset}: no deploys.csv or deploys.json")


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    dataset: Path = args.dataset
    answers = json.loads((dataset / "answers.json").read_text(encoding="utf-8"))
    incidents = answers["incidents"]
    if args.limit:
        incidents = incidents[: args.limit]
    with tempfile.TemporaryDirectory(prefix="rca-eval-") as tmp:
        tmp_path = Path(tmp)
        data_dir = args.data_dir or tmp_path / "bridge"
        deploys = _deploys_file(dataset, args.strip_bom, tmp_path)
        ingest_s = ingest(dataset, data_dir, deploys)
        runner = (cli_runner if args.cli else import_runner)(dataset, data_dir, deploys)
        rows: list[dict[str, Any]] = []
        began = time.perf_counter()
        for truth in incidents:
            service = None if truth["service_named"] else truth["symptom_service"]
            try:
                result = runner(truth["id"], service)
                answer: dict[str, Any] | None = read_answer(result)
                error = None
            except Exception as exc:  # a failed diagnosis is scored, not fatal
                answer, error = None, f"{type(exc).__name__}: {exc}"
            row = {
                "id": truth["id"],
                "kind": truth["kind"],
                "variant": truth["variant"],
                "truth": truth["cause"],
                "asked_service": service,
                "answer": answer,
                "error_text": error,
                **score(truth, answer),
            }
            rows.append(row)
            if args.verbose:
                named = answer["named"] if answer else error
                print(
                    f"  {truth['id']} {truth['kind']:<22} truth={truth['cause']} "
                    f"named={named} conf={row['conf']:.2f} ac1={row['ac1']}",
                    flush=True,
                )
        diagnose_s = time.perf_counter() - began
    kinds = [k for k in KIND_ORDER if any(r["kind"] == k for r in rows)]
    per_kind = {k: summarize([r for r in rows if r["kind"] == k]) for k in kinds}
    causal = summarize([r for r in rows if r["truth"] is not None])
    overall = summarize(rows)
    return {
        "dataset": str(dataset),
        "seed": answers.get("seed"),
        "spans": answers.get("spans"),
        "quirks": answers.get("quirks"),
        "mode": "cli" if args.cli else "import",
        "workarounds": ["strip-bom"] if args.strip_bom else [],
        "ingest_seconds": round(ingest_s, 1),
        "diagnose_seconds": round(diagnose_s, 1),
        "per_kind": per_kind,
        "causal": causal,
        "overall": overall,
        "incidents": rows,
    }


def _fmt(value: Any, pct: bool = False) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value * 100:.0f}%" if pct else f"{value:.3f}"
    return str(value)


def _fmt_min(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_table(report: dict[str, Any]) -> None:
    head = (
        f"{'kind':<24}{'n':>4}{'AC@1':>7}{'AC@3':>7}{'abstain':>9}{'AUROC':>8}"
        f"{'Brier':>8}{'wrong>0.9':>11}{'conf':>7}{'deploy@1':>10}{'onset±min':>11}{'errors':>8}"
    )
    print(head)
    print("-" * len(head))
    lines = [
        *report["per_kind"].items(),
        ("causal (no noise)", report["causal"]),
        ("overall", report["overall"]),
    ]
    for name, s in lines:
        if not s.get("n"):
            continue
        print(
            f"{name:<24}{s['n']:>4}{_fmt(s['ac1'], True):>7}{_fmt(s['ac3'], True):>7}"
            f"{_fmt(s['abstain'], True):>9}{_fmt(s['auroc']):>8}{_fmt(s['brier']):>8}"
            f"{s['wrong_above_0_9']:>11}{_fmt(s['mean_confidence']):>7}"
            f"{_fmt(s['deploy_at_1'], True):>10}{_fmt_min(s['median_onset_error_min']):>11}"
            f"{s['errors']:>8}"
        )


# ---------------------------------------------------------------- self-check


def self_check() -> int:
    """The metrics on tiny hand-made inputs whose values are known."""
    checks: list[tuple[str, Any, Any]] = [
        ("auroc perfect", auroc([0.9, 0.8, 0.3, 0.1], [1, 1, 0, 0]), 1.0),
        ("auroc inverted", auroc([0.1, 0.2, 0.8, 0.9], [1, 1, 0, 0]), 0.0),
        ("auroc sklearn example", auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]), 0.75),
        ("auroc ties", auroc([0.5, 0.5, 0.5], [1, 0, 0]), 0.5),
        ("auroc one class", auroc([0.3, 0.9], [1, 1]), None),
        ("brier", brier([0.9, 0.2], [1, 0]), 0.025),
        ("brier worst", brier([1.0, 0.0], [0, 1]), 1.0),
        ("brier empty", brier([], []), None),
        ("alias match", matches("PG-Shipments", ["pg-shipments", "shipments"]), True),
        ("alias no match", matches("pg-billing", ["pg-shipments", "shipments"]), False),
    ]
    dep = {
        "root_cause": {"kind": "dependency", "service": "quote-api", "dependency": "shipments"},
        "confidence": 0.8,
        "hypotheses": [
            {"rank": 2, "service": "rate-engine"},
            {"rank": 1, "kind": "x", "service": "quote-api", "dependency": "shipments"},
        ],
    }
    ans = read_answer(dep)
    checks += [
        ("dependency named", ans["named"], "shipments"),
        ("ranked deduplicated", ans["ranked"], ["shipments", "rate-engine"]),
    ]
    none = read_answer({"root_cause": None, "confidence": 0.2, "hypotheses": []})
    noise = {"cause": None, "aliases": []}
    checks += [
        ("no clear cause", none["named"], None),
        ("noise abstention right", score(noise, none)["ac1"], 1),
        ("noise named wrong", score(noise, ans)["ac1"], 0),
    ]
    truth = {"cause": "pg-shipments", "aliases": ["pg-shipments", "shipments"], "deploy_id": None}
    rows = [
        score(truth, ans),
        score(truth, read_answer({"root_cause": {"service": "x"}, "confidence": 0.95})),
        score(truth, None),
    ]
    s = summarize(rows)
    checks += [
        ("summary ac1", s["ac1"], 1 / 3),
        ("summary wrong>0.9", s["wrong_above_0_9"], 1),
        ("summary auroc", s["auroc"], 0.0),
        ("summary errors", s["errors"], 1),
        ("summary brier", round(s["brier"], 6), round((0.2**2 + 0.95**2) / 2, 6)),
    ]
    timed = {"cause": "x", "aliases": ["x"], "onset": "2026-03-14T09:40:00Z"}
    late = read_answer({"root_cause": {"service": "x"}, "onset": "2026-03-14T09:43:30Z"})
    checks += [("onset error", score(timed, late)["onset_error_min"], 3.5)]
    failed = 0
    for name, got, want in checks:
        ok = (
            abs(got - want) < 1e-9
            if isinstance(got, float) and isinstance(want, float)
            else got == want
        )
        failed += not ok
        print(f"  [{'ok' if ok else 'FAIL'}] {name}: {got!r}" + ("" if ok else f" != {want!r}"))
    print(f"self-check: {len(checks) - failed} of {len(checks)} passed")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", type=Path, nargs="?")
    parser.add_argument("--self-check", action="store_true", help="check the metrics and exit")
    parser.add_argument("--cli", action="store_true", help="one `keel bridge diagnose` each")
    parser.add_argument(
        "--strip-bom", action="store_true", help="give the Bridge a BOM-free copy of a deploys CSV"
    )
    parser.add_argument("--data-dir", type=Path, help="keep the index here (default: temp)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N incidents")
    parser.add_argument("--out", type=Path, help="default bench/results/rca_eval_seed<N>.json")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.self_check:
        return self_check()
    if args.dataset is None:
        parser.error("a DATASET directory is required (or --self-check)")
    report = evaluate(args)
    print_table(report)
    out = (
        args.out
        or Path(__file__).resolve().parents[1]
        / "results"
        / f"rca_eval_seed{report['seed']}{'_cli' if args.cli else ''}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    report["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    report["python"] = sys.version.split()[0]
    report["cpus"] = os.cpu_count()
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(
        f"\ningest {report['ingest_seconds']} s, diagnoses {report['diagnose_seconds']} s "
        f"({report['mode']}); wrote {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
