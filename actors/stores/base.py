"""What the store actor needs of a session store, whichever database holds it: the protocol,
its errors and its records.

:class:`StoreBackend` is the protocol both stores implement: the SQLite file in ``home``
(:class:`~actors.stores.sqlite.SessionStore`, the default) and PostgreSQL
(:class:`~actors.stores.postgres.PgSessionStore`, chosen by ``[store] url``). The ``*_in``
methods run inside a transaction that :meth:`StoreBackend.run_batch` opened; their ``cur`` is that
backend's own cursor, opaque to everyone else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import msgspec

from messages.approvals import StoredApproval
from messages.background import BackgroundRow
from messages.chat import Baseline, ChatMessage
from messages.remote import RemoteTaskRow
from messages.runtime import SessionRecord

__all__ = [
    "Exists",
    "SessionExists",
    "SessionInfo",
    "SessionNotFound",
    "SessionTaken",
    "StoreBackend",
    "StoreError",
    "StoreFileReplaced",
    "StoredMessage",
]

_T = TypeVar("_T")


class StoreBackend(Protocol):
    """A session store: one transaction per batch of jobs, durable when a batch returns."""

    def run_batch(self, jobs: Sequence[tuple[str, Callable[[Any], _T]]]) -> list[_T | Exception]:
        """Run ``(session, job)`` pairs in one transaction; each result or error, in order."""
        ...

    def create_in(
        self, cur: Any, id: str, baseline: Baseline, slot: int, *, agent: str = "default"
    ) -> SessionRecord:
        """Store a new session of profile ``agent``; ``SessionExists`` for a stored id."""
        ...

    def create_child_in(
        self,
        cur: Any,
        id: str,
        parent: str,
        baseline: Baseline,
        slot: int,
        *,
        untrusted: bool,
        first: ChatMessage,
        agent: str = "default",
        more: Sequence[ChatMessage] = (),
        next_call_id: int = 1,
        running: bool = True,
    ) -> tuple[SessionRecord, bool]:
        """Create (or reopen) child ``id`` of ``parent``, with ``first`` and then ``more`` as
        its messages, its turn stored as ``running``; True if it is new."""
        ...

    def open_in(self, cur: Any, id: str) -> SessionRecord:
        """Read a stored session back; ``SessionNotFound`` if it is not stored."""
        ...

    def open_or_create_in(
        self,
        cur: Any,
        id: str,
        baseline: Baseline,
        slot: int,
        *,
        agent: str = "default",
        first: ChatMessage | None = None,
    ) -> tuple[SessionRecord, bool]:
        """Open ``id`` or create it (with profile ``agent``, and ``first`` as its first message
        and first turn); True when it was created."""
        ...

    def append_in(
        self,
        cur: Any,
        id: str,
        messages: Sequence[ChatMessage],
        *,
        turns: int,
        next_call_id: int,
        untrusted: bool,
        reports: Sequence[str] = (),
        running: bool | None = None,
    ) -> None:
        """Append messages and save the counters of ``id``; drop the background rows of
        ``reports`` (delivered by these messages); mark its turn running or ended."""
        ...

    def save_background_in(self, cur: Any, row: BackgroundRow) -> None:
        """Store a background child's row (insert, or replace it)."""
        ...

    def drop_background_in(self, cur: Any, child: str) -> None:
        """Forget a background child's row."""
        ...

    def load_background_in(self, cur: Any) -> tuple[BackgroundRow, ...]:
        """Every background row, oldest first (by the time it was last stored)."""
        ...

    def save_remote_in(self, cur: Any, row: RemoteTaskRow) -> None:
        """Store a remote child's row (insert, or replace its task id)."""
        ...

    def drop_remote_in(self, cur: Any, child: str) -> None:
        """Forget a remote child's row."""
        ...

    def remote_tasks(self) -> tuple[RemoteTaskRow, ...]:
        """Every remote child's row (read at the start: children a crash cut off)."""
        ...

    def compact_in(self, cur: Any, id: str, summary: ChatMessage) -> None:
        """Replace ``id``'s live history by ``summary``."""
        ...

    def open(self, id: str) -> SessionRecord:
        """Read ``id`` back (for a reader: the CLI, the REPL); ``SessionNotFound`` if unknown."""
        ...

    def list_sessions(self) -> list[SessionInfo]:
        """Every stored session's counters, sorted by id."""
        ...

    def history(self, id: str) -> list[StoredMessage]:
        """Every stored message of ``id`` in order, compacted ones included."""
        ...

    def children(self, id: str) -> list[str]:
        """The stored direct children of ``id``, by call id."""
        ...

    def release(self, id: str) -> None:
        """This process no longer runs ``id``: let another one take it (a no-op for SQLite)."""
        ...

    def add_approval_in(self, cur: Any, entry: StoredApproval) -> None:
        """Store a call that waits for a person."""
        ...

    def settle_approval_in(
        self, cur: Any, session: str, call_id: int, approved: bool, reason: str = ""
    ) -> bool:
        """Record a decision for a waiting call; False if it is not waiting."""
        ...

    def mark_ran_in(self, cur: Any, session: str, call_ids: Sequence[int]) -> None:
        """Mark decided rows of ``session`` as carried out (their work begins now)."""
        ...

    def drop_approvals_in(self, cur: Any, session: str, call_ids: Sequence[int]) -> None:
        """Forget stored approvals of ``session`` (answered, or cancelled)."""
        ...

    def record_spent_in(self, cur: Any, session: str, call_ids: Sequence[int], spent: int) -> None:
        """Keep what a family has spent with ``session``'s rows for ``call_ids`` that wait."""
        ...

    def approvals(self, *, ours: bool = False) -> list[StoredApproval]:
        """Every stored approval, oldest first; with ``ours``, only those of families no other
        live process runs."""
        ...

    def interrupted(self) -> list[SessionRecord]:
        """Every session stored with a turn running that this process may take over."""
        ...

    def settle_approval(self, session: str, call_id: int, approved: bool, reason: str = "") -> bool:
        """Record a decision in a transaction of its own; False if the call is not waiting."""
        ...

    def close(self) -> None:
        """Close the store; later calls raise ``StoreError``."""
        ...


class StoreError(Exception):
    """A store operation failed; the message names the session (when there is one) and why.

    ``session`` is the session concerned (or None for the store as a whole) and ``detail`` what
    went wrong.
    """

    held_elsewhere = False
    """True for a session another process runs (a shared store's per-session lock)."""

    def __init__(self, session: str | None, detail: str) -> None:
        # Both go into args so the exception pickles and copies with the same text.
        super().__init__(session, detail)
        self.session = session
        self.detail = detail

    def __str__(self) -> str:
        if self.session is None:
            return self.detail
        return f"session {self.session!r}: {self.detail}"


class SessionExists(StoreError):
    """``create`` was asked for a session id that is already stored."""

    def __init__(self, session: str, detail: str = "already exists") -> None:
        super().__init__(session, detail)


Exists = SessionExists
"""SPEC 7's name for the error of ``create`` on a known id."""


class SessionNotFound(StoreError):
    """The session id is not stored."""

    def __init__(self, session: str, detail: str = "is not stored") -> None:
        super().__init__(session, detail)


class SessionTaken(StoreError):
    """A child's id holds a record that its parent's spawn did not create.

    Such a record (a top-level session on a child-shaped id, or a child of another parent) is
    never opened as the child: the spawn fails and nothing of the record is used.
    """

    def __init__(self, session: str, parent: str) -> None:
        super().__init__(
            session,
            f"the id is taken: its stored record was not created by a spawn of {parent!r}, and "
            "a child is opened only by its parent (see docs/runbook.md#child-id-taken)",
        )


class StoreFileReplaced(StoreError):
    """The store's file was removed or replaced while the store had it open.

    Writing on would go to a file nobody can open again, so every later request fails with this.
    """

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(
            None,
            f"the store file {path} was removed or replaced while the runtime ran ({detail}); "
            "nothing more is written to it (see docs/runbook.md#store-file-replaced)",
        )


class SessionInfo(msgspec.Struct, frozen=True):
    """One line of :meth:`SessionStore.list_sessions`: a session's counters, not its messages.

    ``messages`` counts every stored message of the session, compacted ones included.
    """

    id: str
    slot: int
    turns: int
    untrusted: bool
    messages: int
    created_at: str
    updated_at: str
    parent: str | None = None
    agent: str = "default"


class StoredMessage(msgspec.Struct, frozen=True):
    """One stored message of :meth:`SessionStore.history`, with its sequence number and time.

    ``compacted`` is True for a message that a compaction summary has replaced.
    """

    seq: int
    message: ChatMessage
    compacted: bool
    at: str
