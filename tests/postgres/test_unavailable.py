"""A PostgreSQL server that cannot take writes for now answers as what it is: a read-only
server (SQLSTATE 25006) is StoreUnavailable naming it, the store by its URL without the
password; reads still work and nothing is written."""

from __future__ import annotations

import pytest

from keel import StoreUnavailable
from keel.store import PostgresStore

from .pg import store_url

pytestmark = [pytest.mark.postgres, pytest.mark.anyio]


async def test_a_read_only_server_is_unavailable_and_named_read_only(schema: str) -> None:
    """Every transaction read-only (as on a hot standby): a write is refused at once,
    not retried, as "read-only"; a read still answers."""
    writable = PostgresStore(store_url(schema))
    task = await writable.create(name="job")
    await writable.close()
    url = store_url(schema, options="-c default_transaction_read_only=on")
    store = PostgresStore(url)
    try:
        with pytest.raises(StoreUnavailable) as info:
            await store.create(name="job")
        error = info.value
        assert str(error).startswith(f"store {url} is unavailable: the server is read-only")
        assert "[SQLSTATE 25006]" in str(error)
        assert error.retry_after > 0
        assert [t.task_id for t in await store.list()] == [task.task_id]
    finally:
        await store.close()
