"""How the interop matrix judges what a client reported (``interop/cells.py``), and how
it rewrites its block of ``docs/interop.md`` (``run_matrix.write_doc``)."""

from __future__ import annotations

from pathlib import Path

from cells import NOT_DECLARED, OTHER_SIDE, conformance_plan, judge, restart_plan
from run_matrix import write_doc

PLAN = conformance_plan()
ROW = "python-ext · http · conformance"


def result(text: str, is_error: bool = False) -> dict[str, object]:
    return {"result": {"isError": is_error, "text": text}}


def test_a_matching_result_passes_and_a_different_one_names_both() -> None:
    assert judge("plain", PLAN["plain"], result("Hello, interop!"), ROW) == "pass"
    cell = judge("plain", PLAN["plain"], result("Hello, nobody!"), ROW)
    assert cell.startswith("FAIL: want result with 'Hello, interop!'")
    assert "'Hello, nobody!'" in cell


def test_is_error_must_match_both_ways() -> None:
    tool_error = "the job failed: simulated tool error"
    assert judge("isError", PLAN["isError"], result(tool_error, is_error=True), ROW) == "pass"
    assert judge("isError", PLAN["isError"], result(tool_error), ROW).startswith("FAIL")


def test_a_failed_task_passes_as_an_error_or_an_error_result() -> None:
    error = {"error": {"code": -32603, "message": "simulated protocol error"}}
    assert judge("failed", PLAN["failed"], error, ROW) == "pass"
    as_result = result("task x failed: simulated protocol error", is_error=True)
    assert judge("failed", PLAN["failed"], as_result, ROW) == "pass"
    assert judge("failed", PLAN["failed"], result("fine"), ROW).startswith("FAIL")


def test_minus_32021_passes_only_for_a_required_task() -> None:
    refused = {"error": {"code": NOT_DECLARED, "message": "did not declare"}}
    assert judge("isError", PLAN["isError"], refused, ROW).startswith("pass (-32021")
    assert judge("task", PLAN["task"], refused, ROW).startswith("FAIL")


def test_na_is_reported_as_the_client_said_it() -> None:
    cell = judge("cancel", PLAN["cancel"], {"na": "no task handle"}, ROW)
    assert cell == "n/a: no task handle"


def test_a_documented_defect_of_the_other_side_replaces_fail_for_that_client_only() -> None:
    hung = {"error": {"code": None, "message": "the CLI printed nothing and was stopped"}}
    _, note = OTHER_SIDE[("inspector", "input")]
    row = "inspector · stdio · conformance"
    assert judge("input", PLAN["input"], hung, row) == f"other side: {note}"
    assert judge("input", PLAN["input"], hung, ROW).startswith("FAIL")


def test_a_known_client_with_another_failure_still_fails() -> None:
    failed = {"error": {"code": -32603, "message": "MCP error -32603: Task 01abc failed"}}
    row = "ts-sdk1 · http · conformance"
    assert judge("failed", PLAN["failed"], failed, row).startswith("other side: sdk 1.32.2")
    other = {"error": {"code": -32601, "message": "Method not found"}}
    assert judge("failed", PLAN["failed"], other, row).startswith("FAIL")


def test_a_restart_passes_only_if_the_store_saw_the_kill_hit_both_tasks() -> None:
    expect = restart_plan()
    ended = {
        "running": result("long_step done after 2s"),
        "waiting": result("ask answered confirm=True"),
    }
    seen = {"running_at_kill": "working", "waiting_at_kill": "input_required"}
    assert judge("restart", expect, {**ended, "store": {**seen, "running_attempt": 2}}, ROW) == (
        "pass"
    )
    not_rerun = judge("restart", expect, {**ended, "store": {**seen, "running_attempt": 1}}, ROW)
    assert "was not run again" in not_rerun
    early = {**seen, "waiting_at_kill": "completed", "running_attempt": 2}
    assert "waiting was completed at the kill" in judge(
        "restart", expect, {**ended, "store": early}, ROW
    )


def test_write_doc_replaces_only_its_block(tmp_path: Path) -> None:
    doc = tmp_path / "interop.md"
    doc.write_text("# Title\n\n<!-- matrix:begin -->\nold\n<!-- matrix:end -->\n\n## After\n")
    write_doc(doc, "| new |\n")
    assert doc.read_text() == (
        "# Title\n\n<!-- matrix:begin -->\n| new |\n<!-- matrix:end -->\n\n## After\n"
    )
