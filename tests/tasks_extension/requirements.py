"""The requirements manifest of Keel's MCP tasks extension (SEP-2663, spec 2026-07-28).

Every MUST and SHOULD of part B (B1-B9) of ``shared/reference/mcp-tasks-spec.md``, those
of part A (the 2025-11-25 utility, ``A*``) that the dual stack honours, plus the MAYs Keel
chooses to honour and Keel's own commitments from issues 4 and 12 (``K*``). Each
entry has a stable id, the level, a one-line paraphrase, where it comes from, and either
nothing more (it is *tested*: at least one test names it with
``@pytest.mark.requirement("B3.2", ...)``) or a written ``deviation``: why no test
proves it (not ours to honour, not implemented, or documentation rather than behaviour).

``test_requirements_manifest.py`` keeps both directions complete: every tested id is
named by a test, and every test names known ids. A requirement whose only tests are
strict xfails (a known bug, reported to be fixed) says so in ``failing``. Ids are
stable: retire one by giving it a deviation, never by reusing its number.

Sources: ``[X]`` the ext-tasks spec, ``[SEP2663]``, ``[C26]`` core 2026-07-28,
``[CONF]`` the official conformance suite's checks (secondary), ``[I4]`` issue 4.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["ALL", "LEVELS", "PART_A", "REQUIREMENTS", "Requirement", "needing_tests"]

Level = Literal["MUST", "MUST NOT", "SHOULD", "SHOULD NOT", "MAY"]
LEVELS: tuple[Level, ...] = ("MUST", "MUST NOT", "SHOULD", "SHOULD NOT", "MAY")


@dataclass(frozen=True, slots=True)
class Requirement:
    """One requirement: ``deviation`` is None when a test proves it (or, with
    ``failing`` set, shows with a strict xfail that Keel does not honour it yet)."""

    id: str
    level: Level
    text: str
    source: str
    deviation: str | None = None
    failing: str | None = None
    """A known Keel bug: the tests that name this requirement are all strict xfails."""

    @property
    def tested(self) -> bool:
        return self.deviation is None


_HOST_TRUST = (
    "host side: keel.mcp.client hands each input request, as sent, to the application's "
    "on_input callback; showing it to the user with the consent and UX of a standalone "
    "elicitation is the host application's job, which no library test can prove."
)

_V1 = "the 2025-11-25 tasks utility [T1]"

PART_A: tuple[Requirement, ...] = (
    # --- A. The 2025-11-25 tasks utility on the same server (issue 12, keel.mcp.v2025) --
    Requirement(
        "A1.1",
        "MUST",
        "A 2025-11-25 initialize result declares capabilities.tasks: cancel and "
        "requests.tools.call.",
        f"A1 {_V1} §Capabilities",
    ),
    Requirement(
        "A1.2",
        "MUST",
        "tools/list at 2025-11-25 marks each task tool execution.taskSupport (optional or "
        "required); other tools carry none (forbidden).",
        f"A1 {_V1} §Tool-Level Negotiation",
    ),
    Requirement(
        "A1.3",
        "MUST",
        "A taskSupport 'required' tool called without params.task answers -32601.",
        f"A1 {_V1} §Tool-Level Negotiation",
    ),
    Requirement(
        "A1.4",
        "SHOULD",
        "A tool without taskSupport called with params.task answers -32601.",
        f"A1 {_V1} §Tool-Level Negotiation",
    ),
    Requirement(
        "A2.1",
        "MUST",
        "tools/call with params.task answers a CreateTaskResult {task} (no result in it), "
        "as soon as the task is committed.",
        f"A2 {_V1} §Creating Tasks",
    ),
    Requirement(
        "A3.1",
        "MUST",
        "Every Task carries taskId, status, createdAt, lastUpdatedAt (ISO 8601) and ttl "
        "(ms, or null); pollInterval in ms.",
        f"A3 {_V1} [S1 Task]",
    ),
    Requirement(
        "A4.1",
        "MUST",
        "tasks/result on a working or input_required task blocks until the task is terminal.",
        f"A4 {_V1} §Getting Task Results",
    ),
    Requirement(
        "A4.2",
        "MUST",
        "tasks/result on a terminal task answers exactly what tools/call would have: the "
        "CallToolResult (isError kept) or the JSON-RPC error.",
        f"A4 {_V1} §Getting Task Results",
    ),
    Requirement(
        "A4.3",
        "MUST",
        "tasks/list pages with an opaque cursor and includes nextCursor while more tasks remain.",
        f"A4 {_V1} §Listing Tasks",
    ),
    Requirement(
        "A4.4",
        "MUST",
        "A task retrievable through tasks/get by a requestor is listed by tasks/list for it.",
        f"A4 {_V1} §Listing Tasks",
    ),
    Requirement(
        "A4.5",
        "MAY",
        "notifications/tasks/status carries the full Task on each status change (sent while "
        "tasks/result waits; no related-task _meta, which it SHOULD NOT carry).",
        f"A4 {_V1} §Task Status Notification, A5",
    ),
    Requirement(
        "A4.6",
        "MAY",
        "A session that asked tasks/get for a task gets notifications/tasks/status (the "
        "full Task) on its own channel (the GET stream) on each committed change after "
        "that, until the task ends, without waiting in tasks/result.",
        f"A4 {_V1} §Task Status Notification; issue 16 item 2",
    ),
    Requirement(
        "A5.1",
        "MUST",
        "The tasks/result answer carries _meta io.modelcontextprotocol/related-task {taskId}.",
        f"A5 {_V1} §Related Task Metadata",
    ),
    Requirement(
        "A5.2",
        "MUST",
        "An elicitation/create a task sends carries the related-task _meta with its taskId.",
        f"A5 {_V1} §Associating Task-Related Messages",
    ),
    Requirement(
        "A6.1",
        "MUST",
        "A tool result with isError shows the task failed at 2025-11-25 (stored completed "
        "with isError, as 2026-07-28 shows it).",
        f"A6 {_V1} §Task Status Lifecycle",
    ),
    Requirement(
        "A7.1",
        "SHOULD",
        "A task's input requests reach the requestor as elicitation/create on the stream of "
        "the waiting tasks/result (the GET stream when the server answers in JSON).",
        f"A7 {_V1} §Input Required Status",
    ),
    Requirement(
        "A7.2",
        "SHOULD",
        "Once its input is received, the task leaves input_required and goes on.",
        f"A7 {_V1} §Input Required Status",
    ),
    Requirement(
        "A8.1",
        "MUST",
        "An unknown taskId on tasks/get, tasks/result or tasks/cancel answers -32602.",
        f"A8 {_V1} §Error Handling",
    ),
    Requirement(
        "A8.2",
        "MUST",
        "An invalid or unknown tasks/list cursor answers -32602.",
        f"A8 {_V1} §Error Handling",
    ),
    Requirement(
        "A8.3",
        "MUST",
        "tasks/cancel on a task in a terminal status answers -32602.",
        f"A8 {_V1} §Error Handling, A9",
    ),
    Requirement(
        "A9.2",
        "MUST",
        "tasks/cancel moves the task to cancelled before its answer (the cancelled Task) is sent.",
        f"A9 {_V1} §Task Cancellation",
    ),
    Requirement(
        "A10.1",
        "MUST",
        "tasks/get includes the actual ttl (the server's, null when kept for good).",
        f"A10 {_V1} §TTL and Resource Management",
    ),
    Requirement(
        "A11.1",
        "MUST",
        "With authentication, tasks/get, tasks/result and tasks/cancel refuse another "
        "principal's task (as unknown).",
        f"A11 {_V1} §Security Considerations",
    ),
    Requirement(
        "A11.2",
        "MUST",
        "With authentication, tasks/list shows only the caller's own tasks.",
        f"A11 {_V1} §Security Considerations",
    ),
    Requirement(
        "A11.4",
        "SHOULD NOT",
        "A server that cannot identify requestors does not declare tasks.list (and answers "
        "tasks/list -32601).",
        f"A11 {_V1} §Security Considerations",
    ),
    # --- Keel's own commitments for the 2025-11-25 flow (issue 12) ---------------------
    Requirement(
        "K20",
        "MUST",
        "A task that needs input from a 2025-11-25 client that cannot be asked (no form "
        "elicitation) answers -32021, not -32603, and is cancelled, the reason in its history.",
        "[I12] plain clients never strand a task",
    ),
    Requirement(
        "K21",
        "MUST",
        "A task created over 2025-11-25 survives a SIGKILL of keel serve and is finished "
        "through tasks/result after the restart.",
        "[I12] dual stack: same durability",
    ),
    Requirement(
        "K22",
        "MUST",
        "keel demo --protocol 2025-11-25 plays the incident end to end over that protocol.",
        "[I12] done when",
    ),
)

ALL: tuple[Requirement, ...] = (
    *PART_A,
    # --- B1. Capability negotiation -------------------------------------------------
    Requirement(
        "B1.1",
        "MUST",
        "The server advertises capabilities.extensions['io.modelcontextprotocol/tasks'] as "
        "an empty object (server/discover).",
        "B1 [X §Capability Negotiation]",
    ),
    Requirement(
        "B1.2",
        "MUST NOT",
        "No CreateTaskResult to a request that did not declare the extension in its own "
        "_meta clientCapabilities, whatever earlier requests declared.",
        "B1 [X], [C26] 'Servers MUST NOT infer capabilities from prior requests'",
    ),
    Requirement(
        "B1.3",
        "MUST",
        "A declaring client handles either a CallToolResult or a CreateTaskResult from "
        "tools/call (keel.mcp.client).",
        "B1 [X]",
    ),
    Requirement(
        "B1.4",
        "MUST",
        "A client treats a CreateTaskResult answering an unsupported request type (not "
        "tools/call) as an invalid response.",
        "B1 [X]",
    ),
    Requirement(
        "B1.5",
        "SHOULD",
        "Implementations are designed to accommodate more task-capable request types later.",
        "B1 [X]",
        deviation="design guidance, not observable behaviour: SEP-2663 defines tasks for "
        "tools/call only, which is all TasksExtension intercepts; nothing to execute.",
    ),
    Requirement(
        "B1.6",
        "MUST",
        "A request the server can only answer with a task, from a non-declaring client, "
        "gets -32021 with data.requiredCapabilities.extensions[tasks] = {}.",
        "B1 [X §Protocol Errors]",
    ),
    Requirement(
        "B1.7",
        "MUST",
        "tasks/get, tasks/update and tasks/cancel from a non-declaring client get -32021.",
        "B1 [X §Protocol Errors] (core PR #2756)",
    ),
    Requirement(
        "B1.8",
        "MUST",
        "Over HTTP, a -32021 error is sent with status 400 Bad Request.",
        "B1 [C26 schema.ts MissingRequiredClientCapabilityError]",
    ),
    # --- B2. Polymorphic result, CreateTaskResult -----------------------------------
    Requirement(
        "B2.1",
        "MUST",
        "A CreateTaskResult carries resultType 'task'.",
        "B2 [X §Polymorphic Results]",
    ),
    Requirement(
        "B2.2",
        "MUST NOT",
        "No other result (tasks/get, update/cancel acks, inline CallToolResult) uses "
        "resultType 'task'.",
        "B2 [X]",
    ),
    Requirement(
        "B2.3",
        "MUST",
        "CreateTaskResult is flat (Result & Task): taskId, status, createdAt, lastUpdatedAt, "
        "ttlMs at the top level, no nested 'task'.",
        "B2 [X schema.ts]",
    ),
    Requirement(
        "B2.4",
        "MUST",
        "CreateTaskResult is sent only once the task is durably created: a tasks/get right "
        "after it resolves, even after the server process dies.",
        "B2 [X §Task Creation]",
    ),
    Requirement(
        "B2.5",
        "SHOULD",
        "MRTR exchanges are resolved synchronously before a CreateTaskResult is returned.",
        "B2 [X]",
    ),
    Requirement(
        "B2.6",
        "MUST NOT",
        "CreateTaskResult and DetailedTask carry no requestState (and a CreateTaskResult "
        "after MRTR carries no inputRequests).",
        "B2 / part C [CONF request-state.ts, mrtr-composition]",
    ),
    Requirement(
        "B2.7",
        "MAY",
        "A client API that returns a fixed CallToolResult drives the polling internally "
        "and surfaces only the final result (keel.mcp.client).",
        "B2 [SEP2663 §Polymorphic Results]",
    ),
    # --- B3. Task object, DetailedTask ------------------------------------------------
    Requirement(
        "B3.1",
        "MUST",
        "Every task on the wire has taskId, a valid status, ISO 8601 createdAt and "
        "lastUpdatedAt, ttlMs (integer ms or null) and integer pollIntervalMs.",
        "B3 [X schema.json]",
    ),
    Requirement(
        "B3.2",
        "MUST NOT",
        "The V1 names ttl and pollInterval never appear.",
        "B3 / B7 [CONF wire-fields.ts]",
    ),
    Requirement(
        "B3.3",
        "MUST",
        "A tool result with isError: true ends the task 'completed' with that result.",
        "B3 [X §Task Status]",
    ),
    Requirement(
        "B3.4",
        "MUST NOT",
        "'failed' is never used for a non-JSON-RPC error (a tool error is not a failure).",
        "B3 [X §Task Status]",
    ),
    Requirement(
        "B3.5",
        "MUST",
        "A client inspects inputRequests of an input_required task (and SHOULD answer them "
        "with tasks/update): keel.mcp.client hands them to its on_input callback.",
        "B3 [X §Task Status]",
    ),
    Requirement(
        "B3.6",
        "MUST",
        "Terminal statuses (completed, failed, cancelled) never change again.",
        "B3 [X state diagram; XO]",
    ),
    # --- B4. Methods -------------------------------------------------------------------
    Requirement(
        "B4.1",
        "SHOULD",
        "Clients respect pollIntervalMs between polls (keel.mcp.client).",
        "B4 tasks/get [X §Task Polling]",
    ),
    Requirement(
        "B4.2",
        "MAY",
        "Servers may rate-limit clients polling faster than pollIntervalMs (Keel: opt-in, "
        "rate_limit_polls).",
        "B4 tasks/get [X §Task Polling]",
    ),
    Requirement(
        "B4.3",
        "SHOULD",
        "Clients poll until a terminal status (or until they cancel) (keel.mcp.client).",
        "B4 tasks/get [X]",
    ),
    Requirement(
        "B4.4",
        "SHOULD",
        "Task ids are all a client must persist: polling resumes from the id alone after a "
        "client (or server) restart.",
        "B4 tasks/get [X]; B8 durability",
    ),
    Requirement(
        "B4.5",
        "MUST",
        "tasks/get answers the variant of the status: input_required with every outstanding "
        "inputRequest, completed with result, failed with error.",
        "B4 tasks/get [X]",
    ),
    Requirement(
        "B4.6",
        "MUST",
        "The tasks/get result has resultType 'complete'.",
        "B4 tasks/get [X schema]; B6 erratum",
    ),
    Requirement(
        "B4.7",
        "MUST",
        "Each inputRequests key is unique over the task's life: never reused after its "
        "answer, never used for two distinct requests.",
        "B4 tasks/update [X §Task Update Requests]",
    ),
    Requirement(
        "B4.8",
        "MUST",
        "Clients treat each inputRequests entry like the equivalent standalone request "
        "(same trust model and UX).",
        "B4 tasks/update [X]",
        deviation=_HOST_TRUST,
    ),
    Requirement(
        "B4.9",
        "SHOULD",
        "Clients deduplicate inputRequests keys across polls and track answered keys "
        "(keel.mcp.client asks its callback once per request).",
        "B4 tasks/update [X]",
    ),
    Requirement(
        "B4.10",
        "MUST",
        "A successful tasks/update answers an empty ack: resultType 'complete', no task fields.",
        "B4 tasks/update [X]",
    ),
    Requirement(
        "B4.11",
        "SHOULD",
        "inputResponses for keys that are not outstanding (never issued, already answered) "
        "are ignored.",
        "B4 tasks/update [X]",
    ),
    Requirement(
        "B4.12",
        "MAY",
        "A partial set of responses is accepted; the task stays input_required with the "
        "rest outstanding.",
        "B4 tasks/update [X]",
    ),
    Requirement(
        "B4.13",
        "MUST NOT",
        "notifications/cancelled is not used for task cancellation: it neither cancels a "
        "task on the server nor is sent by keel.mcp.client.",
        "B4 tasks/cancel [X §Task Cancellation]",
    ),
    Requirement(
        "B4.14",
        "MUST",
        "tasks/cancel answers an empty ack (resultType 'complete', no task fields).",
        "B4 tasks/cancel [X]",
    ),
    Requirement(
        "B4.15",
        "MUST",
        "tasks/cancel on a terminal task answers the same empty ack and changes nothing.",
        "B4 tasks/cancel [CONF lifecycle.ts tasks-cancel-terminal-idempotent-ack]",
    ),
    Requirement(
        "B4.16",
        "MAY",
        "Cancellation reaches a running task: it settles to 'cancelled' (cooperative "
        "cancellation, which Keel honours).",
        "B4 tasks/cancel [X]",
    ),
    Requirement(
        "B4.17",
        "MAY",
        "Servers push notifications/tasks (a full DetailedTask) on a subscriptions/listen "
        "stream that names the task in notifications.taskIds (keel.mcp.push).",
        "B4 notifications [X §Task Status Notifications]",
    ),
    Requirement(
        "B4.18",
        "MUST",
        "subscriptions/listen asking for task notifications without the extension gets -32021.",
        "B4 notifications [X]",
    ),
    Requirement(
        "B4.19",
        "MUST NOT",
        "No notifications/progress or notifications/message are sent for a task.",
        "B4 notifications [X]",
    ),
    Requirement(
        "B4.20",
        "MUST",
        "On HTTP, clients send Mcp-Method and Mcp-Name = params.taskId on tasks/get, "
        "tasks/update and tasks/cancel (keel.mcp.client's request models).",
        "B4 routing [X §Streamable HTTP: Routing Headers]",
    ),
    Requirement(
        "B4.21",
        "MUST",
        "An Mcp-Method or Mcp-Name header that disagrees with the body is refused with "
        "-32020 and HTTP 400; a missing Mcp-Name on tasks/* is accepted.",
        "B4 routing [CONF tasks-request-headers; SEP-2243]",
    ),
    Requirement(
        "B4.22",
        "MUST",
        "Each notifications/tasks carries the complete DetailedTask, identical to what "
        "tasks/get answers at that moment (inputRequests, statusMessage, result or error).",
        "B4 notifications [X §Task Status Notifications]",
    ),
    Requirement(
        "B4.23",
        "MUST",
        "The acknowledgement's notifications.taskIds confirms exactly the ids honoured: the "
        "caller's own tasks; an unknown id and another principal's are left out alike.",
        "B4 notifications [X]; B8 principals",
    ),
    Requirement(
        "B4.24",
        "MUST",
        "Every frame of a listen stream (the ack, each notifications/tasks, core events) "
        "carries _meta io.modelcontextprotocol/subscriptionId = the listen request's id.",
        "B4 notifications [C26 SEP-2575 subscriptions/listen]",
    ),
    Requirement(
        "B4.25",
        "MUST",
        "notifications/subscriptions/acknowledged is the first frame of the stream.",
        "B4 notifications [C26 SEP-2575]",
    ),
    Requirement(
        "B4.26",
        "MUST NOT",
        "A stream carries only what it asked for: no core event it did not request, no "
        "notification of a task it does not listen to.",
        "B4 notifications [C26 SubscriptionFilter]",
    ),
    Requirement(
        "B4.27",
        "SHOULD",
        "A graceful server stop (SIGTERM) ends each open listen stream with the listen's "
        "result, stamped with the subscription id, as its last frame.",
        "B4 notifications [C26 SEP-2575 graceful closure]",
    ),
    Requirement(
        "B4.28",
        "MAY",
        "Clients rely on notifications instead of polling: keel.mcp.client listens to the "
        "task it resolves when the server offers it, polls when it does not or the stream "
        "ends, and returns the task's own terminal state either way.",
        "B4 notifications [X]",
    ),
    # --- B5. input_required ------------------------------------------------------------
    Requirement(
        "B5.1",
        "MUST NOT",
        "A task asks for input only through inputRequests: the server never sends a "
        "server-to-client request (elicitation/create, sampling) for it.",
        "B5 [SEP2663; SEP-2260]",
    ),
    Requirement(
        "B5.2",
        "SHOULD",
        "Once all outstanding input is answered the task leaves input_required (back to "
        "working, or terminal).",
        "B5; A7 [T1]",
    ),
    # --- B6. Errors --------------------------------------------------------------------
    Requirement(
        "B6.1",
        "MUST",
        "tasks/get for an invalid or unknown taskId answers -32602.",
        "B6 [X §Error Handling]",
    ),
    Requirement(
        "B6.2",
        "SHOULD",
        "tasks/update and tasks/cancel for an unknown taskId answer a JSON-RPC error (-32602).",
        "B6 [X]",
    ),
    Requirement(
        "B6.3",
        "MUST",
        "Internal errors answer -32603 (without internal details).",
        "B6 [X]",
    ),
    Requirement(
        "B6.4",
        "MUST",
        "tasks/result answers -32601 at 2026-07-28.",
        "B6 / B9 [SEP2663 §Backward Compatibility]",
    ),
    Requirement(
        "B6.5",
        "MUST",
        "tasks/list answers -32601 at 2026-07-28.",
        "B6 [CONF]",
    ),
    Requirement(
        "B6.6",
        "MUST",
        "A JSON-RPC error during execution ends the task 'failed' with error {code, message}.",
        "B6 [X]",
    ),
    Requirement(
        "B6.7",
        "SHOULD",
        "A failed task carries a statusMessage.",
        "B6 [X]",
    ),
    Requirement(
        "B6.8",
        "MAY",
        "A purged expired task is answered as not found.",
        "B6 [X]",
    ),
    # --- B7. TTL ------------------------------------------------------------------------
    Requirement(
        "B7.1",
        "MUST",
        "ttlMs counts integer milliseconds from createdAt; null means unlimited.",
        "B7 [X §Task Polling]",
    ),
    Requirement(
        "B7.2",
        "MUST",
        "A task stays readable through tasks/get for its whole ttlMs.",
        "B7 [CONF wire-fields.ts]",
    ),
    Requirement(
        "B7.3",
        "MAY",
        "After its TTL a finished task may be deleted (Keel purges finished tasks past their "
        "TTL, never a live one).",
        "B7 [X]",
    ),
    # --- B8. Security, durability -----------------------------------------------------
    Requirement(
        "B8.1",
        "MUST",
        "Task ids carry enough entropy that a third party cannot guess them (>= 128 random bits).",
        "B8 [X §Security Considerations]",
    ),
    Requirement(
        "B8.2",
        "MUST",
        "Every task request is authorised: a task is bound to the authenticated principal "
        "that created it, and no other principal can read, answer or cancel it.",
        "B8 [X] (ext-tasks PR #9)",
    ),
    Requirement(
        "B8.3",
        "MUST",
        "Hosts apply the standard elicitation/sampling trust model to inputRequests payloads "
        "(a task is not a higher-trust channel).",
        "B8 [X]",
        deviation=_HOST_TRUST,
    ),
    Requirement(
        "B8.4",
        "SHOULD",
        "tasks/get is a pure, idempotent read: reading changes nothing and repeats the same "
        "answer.",
        "B8 [SEP2663 §Rationale]",
    ),
    Requirement(
        "B8.5",
        "SHOULD",
        "Task state is durable: tasks/get keeps answering after the worker or the server "
        "process dies and restarts.",
        "B8 [XO 'Task Store']",
    ),
    # --- B9. Fallback ------------------------------------------------------------------
    Requirement(
        "B9.1",
        "MUST",
        "A non-declaring client gets core behaviour (a plain CallToolResult) or an error, "
        "never a task.",
        "B9 [C26 versioning.mdx; X]",
    ),
    Requirement(
        "B9.2",
        "MUST NOT",
        "At protocol 2025-11-25 a declared extension enables nothing of it: no flat "
        "CreateTaskResult, no tasks/update; only the 2025 flow (params.task) makes tasks there.",
        "B9 [SEP2663 §Backward Compatibility]",
    ),
    Requirement(
        "B9.3",
        "MUST",
        "At 2026-07-28 a client declaring only the legacy capabilities.tasks is non-declaring.",
        "B9 [SEP2663]",
    ),
    Requirement(
        "B9.4",
        "SHOULD",
        "Dual-stack servers keep serving tasks/get and tasks/cancel for tasks created under "
        "the legacy (2025-11-25) flow.",
        "B9 [SEP2663]",
    ),
    Requirement(
        "B9.5",
        "MUST",
        "A 'task' param on tools/call is ignored (an unknown field, not an opt-in).",
        "B9 [SEP2663]",
    ),
    Requirement(
        "B9.6",
        "MUST NOT",
        "Legacy tasks.* capabilities are never advertised under a version that has the "
        "extension (server/discover); only a 2025-11-25 initialize result has them.",
        "B9 [SEP2663]",
    ),
    Requirement(
        "B9.7",
        "SHOULD",
        "Extensions document their fallback behaviour.",
        "B9 [C26 versioning.mdx]",
        deviation="documentation, not behaviour: keel.mcp.server's module docstring and the "
        "README state it (inline answers for optional tasks, -32021 for required ones).",
    ),
    # --- K. Keel's own commitments (issue 4) -------------------------------------------
    Requirement(
        "K1",
        "MUST",
        "Unknown, expired-and-purged and another principal's task ids answer tasks/get, "
        "tasks/update and tasks/cancel identically: -32602, same message, same HTTP status.",
        "[I4] item 4",
    ),
    Requirement(
        "K2",
        "MUST",
        "Invalid tool arguments answer -32602 naming the field; no task is created.",
        "[I4] item 4",
    ),
    Requirement(
        "K3",
        "MUST",
        "Arguments over the size limit answer -32602 naming the limit; the store is unchanged.",
        "[I4] item 5",
    ),
    Requirement(
        "K4",
        "MUST",
        "Input responses over the size limit answer -32602 naming the limit; the request "
        "stays outstanding.",
        "[I4] item 5",
    ),
    Requirement(
        "K5",
        "MUST",
        "Input that violates the requested schema answers -32602 naming the field; the "
        "request stays outstanding.",
        "[I4] items 1 and 5",
    ),
    Requirement(
        "K6",
        "MUST",
        "The full flow (create, input_required, tasks/update, completed; cancel) works over "
        "stdio with `keel serve --transport stdio`.",
        "[I4] item 6",
    ),
    Requirement(
        "K7",
        "MUST",
        "Several server processes on one store answer for each other's tasks.",
        "[I4] item 6",
    ),
    Requirement(
        "K8",
        "MUST",
        "A change committed by a worker in another process (SQLite file, PostgreSQL) reaches "
        "a front end's listen stream; a worker SIGKILLed mid-task and the task finished by "
        "another still delivers the terminal state to the listener.",
        "issue 16 item 3",
    ),
)

REQUIREMENTS: dict[str, Requirement] = {r.id: r for r in ALL}
"""Every requirement, by id, in manifest order."""


def needing_tests() -> set[str]:
    """The ids a test must name (those without a deviation)."""
    return {r.id for r in ALL if r.tested}
