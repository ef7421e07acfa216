"""The background children's rows of a SQL session store (``[subagents] background``).

One row per background child: while it runs (``report`` NULL), then while its report waits
for the parent's transcript. The row of a delivered report is deleted by the ``append_in``
that stores it (``reports``), in the same transaction. Mixed into
:class:`~actors.stores.sql.SqlSessionStore`; the statements are the dialect's.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import Any

from actors.stores.dialect import Dialect
from messages.background import BackgroundRow

__all__ = ["BackgroundRows"]


class BackgroundRows:
    """Store, drop and read background rows, inside a transaction of the store's."""

    dialect: Dialect
    _lock: threading.RLock

    def _transaction(
        self, session: str, action: str, *, write: bool
    ) -> AbstractContextManager[Any]:
        raise NotImplementedError  # SqlSessionStore's

    @staticmethod
    def _now() -> str:
        raise NotImplementedError  # SqlSessionStore's: the time text of every row

    def save_background_in(self, cur: Any, row: BackgroundRow) -> None:
        """Store background child ``row.child``'s row (insert, or replace its report)."""
        cur.execute(
            self.dialect.q.save_background,
            (row.child, row.parent, row.call_id, row.report, bool(row.untrusted), self._now()),
        )

    def drop_background_in(self, cur: Any, child: str) -> None:
        """Forget background child ``child``'s row (it was cancelled)."""
        cur.execute(self.dialect.q.drop_background, (child,))

    def load_background_in(self, cur: Any) -> tuple[BackgroundRow, ...]:
        """Every background row, oldest first (by the time it was last stored)."""
        rows = cur.execute(self.dialect.q.load_background).fetchall()
        return tuple(
            BackgroundRow(child, parent, call_id, report, bool(untrusted))
            for child, parent, call_id, report, untrusted in rows
        )

    def background(self) -> tuple[BackgroundRow, ...]:
        """Every background row (for a reader: the CLI, a test)."""
        with self._transaction("*", "read background children", write=False) as cur:
            return self.load_background_in(cur)
