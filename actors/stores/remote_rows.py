"""The remote children's rows of a SQL session store (A2A ``[agents.NAME] a2a_url``).

One row per remote child while its remote task may run: stored before the task's message is
sent (with the A2A ``contextId`` it is sent in), updated with the remote task's id once the
remote gives one, deleted when the child ends. A row left at the next start is a child a crash
cut off: its remote task is cancelled and the row dropped. Mixed into
:class:`~actors.stores.sql.SqlSessionStore`; SQLite schema version 6, PostgreSQL's 4.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import Any

from actors.stores.dialect import Dialect
from messages.remote import RemoteTaskRow

__all__ = ["RemoteRows", "remote_table"]

_REMOTE = """CREATE TABLE IF NOT EXISTS {t}remote_tasks (
    child      TEXT PRIMARY KEY NOT NULL,
    parent     TEXT NOT NULL,
    url        TEXT NOT NULL,
    context_id TEXT NOT NULL,
    task_id    TEXT NOT NULL DEFAULT '',
    at         TEXT NOT NULL
)"""


def remote_table(dialect: Dialect) -> str:
    """The ``CREATE TABLE`` of the remote children's rows in ``dialect``."""
    return _REMOTE.replace("{t}", dialect.prefix)


class RemoteRows:
    """Store, drop and read remote children's rows, inside a transaction of the store's."""

    dialect: Dialect
    _lock: threading.RLock

    def _transaction(
        self, session: str, action: str, *, write: bool
    ) -> AbstractContextManager[Any]:
        raise NotImplementedError  # SqlSessionStore's

    @staticmethod
    def _now() -> str:
        raise NotImplementedError  # SqlSessionStore's: the time text of every row

    def save_remote_in(self, cur: Any, row: RemoteTaskRow) -> None:
        """Store remote child ``row.child``'s row (insert, or replace its task id)."""
        cur.execute(
            self.dialect.sql(
                "INSERT INTO {t}remote_tasks (child, parent, url, context_id, task_id, at)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (child) DO UPDATE SET"
                " task_id = excluded.task_id, at = excluded.at"
            ),
            (row.child, row.parent, row.url, row.context_id, row.task_id, self._now()),
        )

    def drop_remote_in(self, cur: Any, child: str) -> None:
        """Forget remote child ``child``'s row."""
        cur.execute(self.dialect.sql("DELETE FROM {t}remote_tasks WHERE child = ?"), (child,))

    def load_remote_in(self, cur: Any) -> tuple[RemoteTaskRow, ...]:
        """Every remote child's row, oldest first."""
        rows = cur.execute(
            self.dialect.sql(
                "SELECT child, parent, url, context_id, task_id FROM {t}remote_tasks"
                " ORDER BY at, child"
            )
        ).fetchall()
        return tuple(RemoteTaskRow(*row) for row in rows)

    def remote_tasks(self) -> tuple[RemoteTaskRow, ...]:
        """Every remote child's row (at the start; for a reader: a test)."""
        with self._transaction("*", "read remote tasks", write=False) as cur:
            return self.load_remote_in(cur)
