"""How the interop matrix judges what a client reported (``interop/cells.py``), and how
it rewrites its block of ``docs/interop.md`` (``run_matrix.write_doc``)."""

from __future__ import annotations

from pathlib import Path

from cells import NOT_DECLARED, OTHER_SIDE, conformance_plan, judge, push_plan, restart_plan
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


def pushed(**change: object) -> dict[str, object]:
    """What ``ts_v2.mjs`` reports for a push cell that went right, with ``change``."""
    frame = {"taskId": "t1", "subscriptionId": "listen:0"}
    push = {
        "taskId": "t1",
        "ack": {"subscriptionId": "listen:0", "taskIds": ["t1"]},
        "received": [{**frame, "status": "working"}, {**frame, "status": "completed"}],
        "listenId": "listen:0",
        "polls": 0,
        "closed": "graceful",
        **result("pushed done after 2 steps"),
    }
    return {"push": {**push, **change}}


def test_a_push_passes_when_notifications_reached_the_terminal_state_without_polls() -> None:
    """The pass names what was received, in order."""
    cell = judge("push", push_plan(), pushed(), ROW)
    assert cell == "pass (2 notifications/tasks: working → completed; 0 tasks/get)"


def test_a_push_fails_when_the_client_only_polled() -> None:
    """The same final result reached by tasks/get alone is a FAIL that says so."""
    cell = judge("push", push_plan(), pushed(received=[], polls=7), ROW)
    assert cell.startswith("FAIL: no terminal notifications/tasks (received: none)")
    assert "it only polled (7 tasks/get)" in cell


def test_a_push_fails_on_polls_a_missing_ack_or_a_foreign_subscription_id() -> None:
    """Each part of what the client received is checked, not only the result."""
    assert "it polled too: 2 tasks/get" in judge("push", push_plan(), pushed(polls=2), ROW)
    unconfirmed = pushed(ack={"subscriptionId": "listen:0", "taskIds": []})
    assert "the listen ack did not confirm the task" in judge("push", push_plan(), unconfirmed, ROW)
    stray = {"taskId": "t1", "subscriptionId": "other", "status": "completed"}
    assert "a frame without subscriptionId 'listen:0'" in judge(
        "push", push_plan(), pushed(received=[stray]), ROW
    )
    cut = pushed(received=[{"taskId": "t1", "subscriptionId": "listen:0", "status": "working"}])
    assert "received: working" in judge("push", push_plan(), cut, ROW)


def test_a_push_the_client_could_not_run_is_a_fail_naming_its_error() -> None:
    """A client error (a timed-out settle, no push outcome at all) stays a FAIL."""
    cell = judge("push", push_plan(), {"error": {"code": None, "message": "timed out"}}, ROW)
    assert cell == "FAIL: got error 'timed out'"


def test_write_doc_replaces_only_its_block(tmp_path: Path) -> None:
    doc = tmp_path / "interop.md"
    doc.write_text("# Title\n\n<!-- matrix:begin -->\nold\n<!-- matrix:end -->\n\n## After\n")
    write_doc(doc, "| new |\n")
    assert doc.read_text() == (
        "# Title\n\n<!-- matrix:begin -->\n| new |\n<!-- matrix:end -->\n\n## After\n"
    )
