"""Opening the store a config names: the one module that picks a dialect."""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors.core.config import Config
from actors.stores.base import StoreBackend, StoreError

if TYPE_CHECKING:
    from actors.stores.postgres import PgMemory, PgSchedulerState

__all__ = ["open_store", "shared_memory", "shared_schedule"]


def open_store(config: Config) -> StoreBackend:
    """The store ``config`` names: PostgreSQL at ``[store] url``, or ``<home>/loopd.db``.

    Raises :class:`~actors.stores.base.StoreError` if it cannot be opened.
    """
    if config.store.url is not None:
        try:
            from actors.stores.postgres import PgSessionStore
        except ImportError as exc:
            raise StoreError(
                None,
                f"[store] url names PostgreSQL but psycopg is missing ({exc}): "
                "pip install '.[postgres]' in loopd's checkout",
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
