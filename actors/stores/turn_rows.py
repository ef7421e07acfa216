"""The running turns of a SQL session store: which sessions a crash cut off mid-turn.

A session's ``running`` flag is set by its turn's first write (a child's creation included)
and cleared by the write that ends the turn, each in the transaction of the messages it
stores. A flag still set when a runtime starts names a turn that no process ended: the start
answers its open calls and ends it (``actors.runtime.interrupted``). Mixed into
:class:`~actors.stores.sql.SqlSessionStore`; the statements are the dialect's.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import Any

from actors.stores.base import StoreError
from actors.stores.dialect import Dialect
from messages.runtime import SessionRecord

__all__ = ["TurnRows"]


class TurnRows:
    """Read the sessions whose stored turn is still running."""

    dialect: Dialect
    _lock: threading.RLock

    def _transaction(
        self, session: str, action: str, *, write: bool
    ) -> AbstractContextManager[Any]:
        raise NotImplementedError  # SqlSessionStore's

    def _hold(self, cur: Any, id: str) -> None:
        raise NotImplementedError  # SqlSessionStore's: this process runs ``id`` from now on

    def _record(self, cur: Any, id: str) -> SessionRecord:
        raise NotImplementedError  # SqlSessionStore's

    def held_elsewhere_in(self, cur: Any, session: str) -> bool:
        raise NotImplementedError  # ApprovalRows's (PostgreSQL's: the session or its root)

    def interrupted(self) -> list[SessionRecord]:
        """Every session stored with a running turn that this process may take over, in id
        order (a parent before its children). On a shared store a session whose family
        another live process runs is left out (its own lock or its top-level session's): its
        turn still runs there (a child's record is stored running before its actor opens it)."""
        with self._transaction("*", "read the running turns", write=True) as cur:
            ids = [row[0] for row in cur.execute(self.dialect.q.interrupted).fetchall()]
            records = []
            for id in ids:
                if self.held_elsewhere_in(cur, id):
                    continue
                try:
                    self._hold(cur, id)
                except StoreError as exc:
                    if exc.held_elsewhere:
                        continue
                    raise
                records.append(self._record(cur, id))
            return records
