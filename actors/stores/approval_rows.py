"""The approvals table of both SQL stores: the calls waiting for a person (schema 4).

A call that waits is stored before anyone is told of it (:meth:`ApprovalRows.add_approval_in`),
so a stop or a crash loses no request: the next ``Runtime.start`` reads them all back
(:meth:`ApprovalRows.approvals`). A decision recorded here (:meth:`ApprovalRows.settle_approval`,
what the CLI does on a home no runtime holds) is applied once: the row is updated only while it
is undecided, inside a writing transaction, so of two decisions at once exactly one succeeds; on
PostgreSQL it is refused while another process runs the session (it holds its advisory lock).
A decision the runtime carries out is marked ``ran`` first (:meth:`ApprovalRows.mark_ran_in`),
so a start after a crash never runs its call again. A row goes in the transaction that stores
its call's result with the decision (:meth:`ApprovalRows.answered_in`), or when the call is
dropped (:meth:`ApprovalRows.drop_approvals_in`): a decision told is in the transcript or still
here, never neither. A session read back carries the decisions of its calls still without a
result (:meth:`ApprovalRows.decided_in`), for the turn that answers them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import msgspec

from actors.stores.dialect import Dialect
from messages import ChatMessage, StoredApproval

__all__ = ["ApprovalRows"]

_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(StoredApproval)


def _time(entry: StoredApproval) -> tuple[str, str]:
    return entry.request.at.isoformat(), entry.deadline.isoformat()


class ApprovalRows:
    """The approval methods of :class:`~actors.stores.sql.SqlSessionStore` (a mixin)."""

    dialect: Dialect

    def _transaction(
        self, session: str, action: str, *, write: bool
    ) -> AbstractContextManager[Any]:  # provided by SqlSessionStore
        raise NotImplementedError

    def refuse_if_run_elsewhere(self, cur: Any, session: str) -> None:
        """Raise ``SessionHeldElsewhere`` if another process runs ``session`` now, so a
        decision from outside would go behind its runtime's back (nothing here: one process
        runs a SQLite home, whose lock the CLI takes; PostgreSQL's store overrides it)."""

    def held_elsewhere_in(self, cur: Any, session: str) -> bool:
        """Whether another live process runs ``session`` or its family now (never, here: one
        process runs a SQLite home; PostgreSQL's store overrides it)."""
        return False

    def add_approval_in(self, cur: Any, entry: StoredApproval) -> None:
        """Store ``entry``, a call that waits (a second store of the same call keeps the first)."""
        request = entry.request
        at, deadline = _time(entry)
        body = _ENCODER.encode(entry)
        cur.execute(self.dialect.q.approval, (request.session, request.call_id, body, at, deadline))

    def settle_approval_in(
        self, cur: Any, session: str, call_id: int, approved: bool, reason: str = ""
    ) -> bool:
        """Record a decision for a call that waits; False if it is not waiting (unknown, or
        decided already). A session another live process runs is refused
        (``SessionHeldElsewhere``): that process's runtime decides its calls, and a decision
        stored behind its back would never reach its turn."""
        self.refuse_if_run_elsewhere(cur, session)
        q = self.dialect.q
        row = cur.execute(q.approval_body, (session, call_id)).fetchone()
        if row is None:
            return False
        entry = msgspec.structs.replace(
            _DECODER.decode(bytes(row[0])), approved=approved, reason=reason
        )
        cur.execute(q.settle, (_ENCODER.encode(entry), session, call_id))
        return bool(cur.rowcount == 1)

    def settle_approval(self, session: str, call_id: int, approved: bool, reason: str = "") -> bool:
        """:meth:`settle_approval_in` in a transaction of its own, for a decision from outside
        any runtime (the CLI). On a store another process may run the session from
        (PostgreSQL's advisory locks), a session that process runs now is refused
        (``SessionHeldElsewhere``): its runtime decides its calls itself."""
        with self._transaction(session, "settle an approval", write=True) as cur:
            done: bool = self.settle_approval_in(cur, session, call_id, approved, reason)
            return done

    def record_spent_in(self, cur: Any, session: str, call_ids: Sequence[int], spent: int) -> None:
        """Keep ``spent`` (the family's tokens so far) with ``session``'s rows for ``call_ids``
        that still wait (a decided row keeps what it has)."""
        q = self.dialect.q
        for call_id in call_ids:
            row = cur.execute(q.approval_body, (session, call_id)).fetchone()
            if row is not None:
                entry = msgspec.structs.replace(_DECODER.decode(bytes(row[0])), spent=spent)
                cur.execute(q.respend, (_ENCODER.encode(entry), session, call_id))

    def mark_ran_in(self, cur: Any, session: str, call_ids: Sequence[int]) -> None:
        """Mark ``session``'s decided rows for ``call_ids`` as carried out (``ran``): the
        runtime begins their work, so a start after a crash answers them as interrupted
        instead of running them again (an undecided or missing row is left alone)."""
        q = self.dialect.q
        for call_id in call_ids:
            row = cur.execute(q.decided_body, (session, call_id)).fetchone()
            if row is not None:
                entry = msgspec.structs.replace(_DECODER.decode(bytes(row[0])), ran=True)
                cur.execute(q.mark_ran, (_ENCODER.encode(entry), session, call_id))

    def drop_approvals_in(self, cur: Any, session: str, call_ids: Sequence[int]) -> None:
        """Forget ``session``'s rows for ``call_ids`` (answered, or cancelled)."""
        for call_id in call_ids:
            cur.execute(self.dialect.q.drop_approval, (session, call_id))

    def answered_in(self, cur: Any, session: str, messages: Sequence[ChatMessage]) -> None:
        """Forget the rows of the calls ``messages`` answer as a person decided (the results
        that carry their ``decision``): the decision is stored with the result now."""
        for m in messages:
            if m.decision is not None and m.tool_call_id is not None:
                cur.execute(self.dialect.q.drop_approval, (session, m.tool_call_id))

    def decided_in(
        self, cur: Any, session: str, transcript: Sequence[ChatMessage]
    ) -> tuple[StoredApproval, ...]:
        """The decided rows of ``session`` whose call ``transcript`` leaves without a result
        (read only when it ends in calls: one query on the rare record that does)."""
        if not transcript or transcript[-1].role not in ("assistant", "tool"):
            return ()
        if transcript[-1].role == "assistant" and not transcript[-1].tool_calls:
            return ()
        answered = {m.tool_call_id for m in transcript if m.role == "tool"}
        rows = cur.execute(self.dialect.q.decided_of, (session,)).fetchall()
        return tuple(e for e in _entries(rows) if e.request.call_id not in answered)

    def drop_approvals(self, session: str, call_ids: Sequence[int]) -> None:
        """:meth:`drop_approvals_in` in a transaction of its own."""
        with self._transaction(session, "drop approvals", write=True) as cur:
            self.drop_approvals_in(cur, session, call_ids)

    def approvals(self, *, ours: bool = False) -> list[StoredApproval]:
        """Every stored approval, decided or not, oldest first. With ``ours``, only those of
        families no other live process runs (what a start may take up: the others are that
        process's to decide and carry out)."""
        with self._transaction("-", "list approvals", write=False) as cur:
            rows = cur.execute(self.dialect.q.approvals).fetchall()
            entries = list(_entries(rows))
            if ours:
                entries = [e for e in entries if not self.held_elsewhere_in(cur, e.request.session)]
        return entries


def _entries(rows: Sequence[Any]) -> Iterator[StoredApproval]:
    for (body,) in rows:
        yield _DECODER.decode(bytes(body))
