"""A cluster shard's outbox: the events it told that its driver has not yet acknowledged.

A shard (``actors.cluster.shard``) numbers its events and hands them to the driver only once
they are stored here, in PostgreSQL's ``loopd_outbox`` (schema version 5), one row per event,
keyed by the shard's owner name and number. The driver acknowledges what it has by the number
it asks after; acknowledged rows are deleted. When a shard's process dies, the rows it left are
what its driver was never handed: the shard's next process reads them at its start and hands
them over first, numbering on after them. Mixed into
:class:`~actors.stores.postgres.PgSessionStore`.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

__all__ = ["OUTBOX_TABLE", "OutboxRows"]

OUTBOX_TABLE = """CREATE TABLE IF NOT EXISTS loopd_outbox (
    owner TEXT NOT NULL,
    seq   BIGINT NOT NULL,
    event BYTEA NOT NULL,
    PRIMARY KEY (owner, seq))"""
"""One row per event not yet acknowledged: ``owner`` is the shard (its home), ``seq`` the event's
number from 1, ``event`` its msgpack bytes."""


class OutboxRows:
    """Store, read and acknowledge a shard's outbox rows, each call one transaction."""

    def _transaction(
        self, session: str, action: str, *, write: bool
    ) -> AbstractContextManager[Any]:
        raise NotImplementedError  # SqlSessionStore's

    def outbox(self, owner: str, kept: int) -> list[tuple[int, bytes]]:
        """``owner``'s rows, oldest first: at most the newest ``kept``."""
        with self._transaction("*", "read the outbox", write=False) as cur:
            rows = cur.execute(
                "SELECT seq, event FROM loopd_outbox WHERE owner = %s ORDER BY seq DESC LIMIT %s",
                (owner, kept),
            ).fetchall()
        return [(int(seq), bytes(event)) for seq, event in reversed(rows)]

    def save_outbox(
        self, owner: str, rows: Sequence[tuple[int, bytes]], acknowledged: int, kept: int
    ) -> None:
        """Store ``rows`` (numbered events) of ``owner``, and in the same transaction delete its
        rows up to ``acknowledged`` and all but the newest ``kept``."""
        with self._transaction("*", "store events in the outbox", write=True) as cur:
            # The outbox is for a shard that dies, not a server that does: a commit that
            # does not wait for the server's disk survives the first (and costs no fsync).
            cur.execute("SET LOCAL synchronous_commit TO OFF")
            if rows:
                cur.executemany(
                    "INSERT INTO loopd_outbox (owner, seq, event) VALUES (%s, %s, %s)"
                    " ON CONFLICT (owner, seq) DO UPDATE SET event = excluded.event",
                    [(owner, seq, event) for seq, event in rows],
                )
            newest = rows[-1][0] if rows else 0
            cur.execute(
                "DELETE FROM loopd_outbox WHERE owner = %s AND (seq <= %s OR seq <= %s)",
                (owner, acknowledged, newest - kept),
            )
