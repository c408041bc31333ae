"""Tasks are bound to the authenticated principal (spec B8, issue 4 items 4 and 5).

A real auth-enabled server (the SDK's bearer-token middleware and a token verifier with
two principals) over real HTTP: principal B gets, for A's task, exactly what it gets for
an id that does not exist, on tasks/get, tasks/update and tasks/cancel, and A's task is
untouched. Task ids themselves are unguessable.
"""

from __future__ import annotations

import math
import string
from pathlib import Path
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from keel.runtime import Keel
from keel.store import SqliteStore
from tasks_extension.support import (
    NOT_FOUND,
    Answer,
    build_app,
    build_server,
    cancel,
    client_as,
    get,
    poll,
    post,
    serve_http,
    update,
    wait_for,
)

pytestmark = pytest.mark.anyio
ALICE, BOB = "tok-alice", "tok-bob"
URLSAFE = set(string.ascii_letters + string.digits + "-_")


def observed(answer: Answer) -> tuple[int, int, str, Any]:
    return answer.status, answer.error["code"], answer.error["message"], answer.error.get("data")


def accept(**content: Any) -> dict[str, Any]:
    return {"action": "accept", "content": content}


@pytest.mark.requirement("B8.2", "K1")
@pytest.mark.slow
async def test_another_principals_task_is_indistinguishable_from_an_unknown_one(
    tmp_path: Path,
) -> None:
    """Bob's tasks/get, tasks/update and tasks/cancel on Alice's task answer exactly as on
    an unknown id (HTTP 400, -32602, same message), through raw HTTP and the official
    client; Alice's task is unchanged (status, input, history) and she can finish it."""
    app = build_app(Keel(SqliteStore(tmp_path / "keel.db")))
    async with serve_http(build_server(app, auth=True)) as url:
        unauthenticated = await post(url, "tasks/get", {"taskId": "anything"})
        assert unauthenticated.status == 401

        async with client_as(url, ALICE) as alice:
            created = await alice.session.call_tool(
                "ask", {"incident_id": "INC-1"}, allow_claimed=True
            )
            task_id = created.task_id
            waiting = await wait_for(alice, task_id, "input_required")
        stored = await app.store.get(task_id)
        history = await app.store.history(task_id)
        assert stored.owner  # bound to Alice's principal, not the unauthenticated ""

        answer = {"service": accept(service="hijacked")}
        for method, params in [
            ("tasks/get", {"taskId": task_id}),
            ("tasks/update", {"taskId": task_id, "inputResponses": answer}),
            ("tasks/cancel", {"taskId": task_id}),
        ]:
            foreign = await post(url, method, params, token=BOB)
            unknown = await post(url, method, {**params, "taskId": "no-such-task"}, token=BOB)
            assert observed(foreign) == observed(unknown) == (400, -32602, NOT_FOUND, None)

        async with client_as(url, BOB) as bob:
            for attempt in (
                get(bob, task_id),
                update(bob, task_id, answer),
                cancel(bob, task_id),
            ):
                with pytest.raises(MCPError) as info:
                    await attempt
                assert (info.value.code, info.value.message) == (-32602, NOT_FOUND)

        assert await app.store.get(task_id) == stored
        assert await app.store.history(task_id) == history
        async with client_as(url, ALICE) as alice:
            assert await get(alice, task_id) == waiting
            await update(alice, task_id, {"service": accept(service="payments")})
            done = await wait_for(alice, task_id, "completed")
    assert done["result"]["structuredContent"] == {"incident": "INC-1", "service": "payments"}


@pytest.mark.requirement("B8.2")
async def test_each_principal_reads_its_own_tasks(tmp_path: Path) -> None:
    """Two principals each create a task: each reads and cancels its own, and neither
    can see the other's."""
    app = build_app(Keel(SqliteStore(tmp_path / "keel.db")))
    async with serve_http(build_server(app, auth=True)) as url:
        mine = {}
        for token in (ALICE, BOB):
            created = await post(url, "tools/call", {"name": "slow", "arguments": {}}, token=token)
            mine[token] = created.result["taskId"]
        for token, other in [(ALICE, BOB), (BOB, ALICE)]:
            assert (await poll(url, mine[token], "working", token=token))["taskId"] == mine[token]
            refused = await post(url, "tasks/get", {"taskId": mine[other]}, token=token)
            assert observed(refused) == (400, -32602, NOT_FOUND, None)
        for token in (ALICE, BOB):
            await post(url, "tasks/cancel", {"taskId": mine[token]}, token=token)
            assert (await poll(url, mine[token], "cancelled", token=token))["status"] == "cancelled"
    owners = {task.owner for task in await app.store.list()}
    assert len(owners) == 2
    assert "" not in owners


@pytest.mark.requirement("B8.1")
@pytest.mark.slow
async def test_task_ids_carry_at_least_128_random_bits(mcp_server: Any, keel_app: Keel) -> None:
    """Ids of tasks created back to back differ in a part drawn from the URL-safe base64
    alphabet that is long enough for 128 bits, and every position of it varies."""
    async with serve_http(mcp_server) as url:
        ids = [
            (await post(url, "tools/call", {"name": "slow", "arguments": {}})).result["taskId"]
            for _ in range(40)
        ]
        for task_id in ids:
            await post(url, "tasks/cancel", {"taskId": task_id})
    assert len(set(ids)) == len(ids)
    # Strip the common prefix (a creation timestamp, guessable by design).
    prefix = 0
    while len({task_id[prefix] for task_id in ids}) == 1:
        prefix += 1
    tails = [task_id[prefix:] for task_id in ids]
    length = min(len(tail) for tail in tails)
    assert all(set(tail) <= URLSAFE for tail in tails)
    random_part = length - 2  # the last of the timestamp digits may still differ
    assert random_part * math.log2(len(URLSAFE)) >= 128
    varying = [len({tail[-i] for tail in tails}) > 1 for i in range(1, random_part + 1)]
    assert all(varying)
