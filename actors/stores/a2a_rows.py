"""The A2A endpoint's task rows of a SQL session store (``[a2a] serve``).

One row per A2A task: its id, its context (the session whose turn it is), its state as the
SDK names it (``TASK_STATE_WORKING``...) and ``body``, the SDK's JSON of the task as last stored.
The store only keeps the text: it never reads inside ``body``. Mixed into
:class:`~actors.stores.sql.SqlSessionStore`; the table is the dialect's.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import msgspec

from actors.stores.dialect import Dialect

__all__ = ["A2aTaskRow", "A2aTaskRows"]


class A2aTaskRow(msgspec.Struct, frozen=True):
    """One stored A2A task: ``body`` is the SDK's JSON of the task."""

    id: str
    context: str
    state: str
    body: bytes


class A2aTaskRows:
    """Store and read A2A task rows, each call its own transaction of the store's."""

    dialect: Dialect

    def _transaction(
        self, session: str, action: str, *, write: bool
    ) -> AbstractContextManager[Any]:
        raise NotImplementedError  # SqlSessionStore's

    @staticmethod
    def _now() -> str:
        raise NotImplementedError  # SqlSessionStore's: the time text of every row

    def save_a2a_task(self, row: A2aTaskRow) -> None:
        """Store ``row`` (insert, or replace the task's row), durably."""
        sql = self.dialect.sql(
            "INSERT INTO {t}a2a_tasks (id, context, state, body, at) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (id) DO UPDATE SET context = excluded.context,"
            " state = excluded.state, body = excluded.body, at = excluded.at"
        )
        with self._transaction(row.context, "store an A2A task", write=True) as cur:
            cur.execute(sql, (row.id, row.context, row.state, row.body, self._now()))

    def a2a_task(self, task_id: str) -> A2aTaskRow | None:
        """The row of task ``task_id``, or None."""
        sql = self.dialect.sql("SELECT id, context, state, body FROM {t}a2a_tasks WHERE id = ?")
        with self._transaction("*", "read an A2A task", write=False) as cur:
            found = cur.execute(sql, (task_id,)).fetchone()
        return None if found is None else _row(found)

    def a2a_tasks(self, context: str | None = None) -> list[A2aTaskRow]:
        """Every task row (only ``context``'s if given), oldest stored first."""
        where, args = ("", ()) if context is None else (" WHERE context = ?", (context,))
        sql = self.dialect.sql(
            "SELECT id, context, state, body FROM {t}a2a_tasks" + where + " ORDER BY at, id"
        )
        with self._transaction("*", "read the A2A tasks", write=False) as cur:
            return [_row(found) for found in cur.execute(sql, args).fetchall()]

    def drop_a2a_task(self, task_id: str) -> None:
        """Forget task ``task_id`` (nothing if it is not stored)."""
        sql = self.dialect.sql("DELETE FROM {t}a2a_tasks WHERE id = ?")
        with self._transaction("*", "drop an A2A task", write=True) as cur:
            cur.execute(sql, (task_id,))


def _row(found: Any) -> A2aTaskRow:
    task_id, context, state, body = found
    return A2aTaskRow(str(task_id), str(context), str(state), bytes(body))
