"""What the store actor needs of a session store, whichever database holds it.

:class:`StoreBackend` is the protocol both stores implement: the SQLite file in ``home``
(:class:`~actors.stores.sqlite.SessionStore`, the default) and PostgreSQL
(:class:`~actors.stores.postgres.PgSessionStore`, chosen by ``[store] url``). The ``*_in`` methods run
inside a transaction that :meth:`StoreBackend.run_batch` opened; their ``cur`` is that
backend's own cursor, opaque to everyone else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from messages.chat import Baseline, ChatMessage
from messages.runtime import SessionRecord

if TYPE_CHECKING:
    from actors.core.config import Config
    from actors.stores.postgres import PgMemory, PgSchedulerState
    from actors.stores.sqlite import SessionInfo, StoredMessage

__all__ = ["StoreBackend", "open_store", "shared_memory", "shared_schedule"]

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
    ) -> tuple[SessionRecord, bool]:
        """Create (or reopen) child ``id`` of ``parent``, with ``first`` and then ``more`` as
        its messages; True if it is new."""
        ...

    def open_in(self, cur: Any, id: str) -> SessionRecord:
        """Read a stored session back; ``SessionNotFound`` if it is not stored."""
        ...

    def open_or_create_in(
        self, cur: Any, id: str, baseline: Baseline, slot: int, *, agent: str = "default"
    ) -> tuple[SessionRecord, bool]:
        """Open ``id`` or create it (with profile ``agent``); True when it was created."""
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
    ) -> None:
        """Append messages and save the counters of ``id``."""
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

    def close(self) -> None:
        """Close the store; later calls raise ``StoreError``."""
        ...


def open_store(config: Config) -> StoreBackend:
    """The store ``config`` names: PostgreSQL at ``[store] url``, or ``<home>/loopd.db``.

    Raises :class:`~actors.stores.sqlite.StoreError` if it cannot be opened.
    """
    if config.store.url is not None:
        try:
            from actors.stores.postgres import PgSessionStore
        except ImportError as exc:
            from actors.stores.sqlite import StoreError

            raise StoreError(
                None,
                f"[store] url names PostgreSQL but psycopg is missing ({exc}): "
                "pip install 'loopd[postgres]'",
            ) from exc

        return PgSessionStore(config.store.url, connect_timeout_s=config.store.connect_timeout_s)
    from actors.stores.sqlite import DB_NAME, SessionStore

    return SessionStore(config.home_path / DB_NAME)


def shared_memory(config: Config) -> PgMemory | None:
    """The memory source of a PostgreSQL store (entries shared by every process), else None."""
    if config.store.url is None:
        return None
    from actors.stores.postgres import PgMemory

    return PgMemory(
        config.store.url,
        connect_timeout_s=config.store.connect_timeout_s,
        max_chars=config.memory.max_chars,
        max_entry_chars=config.memory.max_entry_chars,
    )


def shared_schedule(config: Config) -> PgSchedulerState | None:
    """The scheduler's state store of a PostgreSQL store (shared by a cluster), else None."""
    if config.store.url is None:
        return None
    from actors.stores.postgres import PgSchedulerState

    return PgSchedulerState(config.store.url, connect_timeout_s=config.store.connect_timeout_s)
