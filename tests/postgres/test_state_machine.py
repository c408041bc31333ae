"""The store's property-based state machine (tests/contract/test_state_machine.py), run
unchanged on PostgreSQL: a fresh schema per example, dropped when it ends."""

from __future__ import annotations

import pytest
from hypothesis import settings

from contract.test_state_machine import COMMON, StoreMachine
from keel.store import PostgresStore, Store

from .pg import drop_schema, new_schema, require_postgres, store_url

# slow: a Hypothesis state machine, over ten seconds
pytestmark = [pytest.mark.postgres, pytest.mark.slow]


class PostgresMachine(StoreMachine):
    """The machine on the PostgreSQL adapter (a fresh schema per run)."""

    def open_store(self) -> Store:
        require_postgres()
        self.schema = new_schema()
        return PostgresStore(store_url(self.schema), clock=self.clock)

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            drop_schema(self.schema)


PostgresMachine.TestCase.settings = settings(max_examples=25, **COMMON)
TestPostgresStateMachine = PostgresMachine.TestCase
