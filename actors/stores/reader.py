"""A read-only view of a session store, for commands that only read (``loopd sessions``).

It opens the SQLite file with ``mode=ro``, so it works on a home the user may not write to and
can never change the store, and it never creates a store where there is none.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from urllib.parse import quote

from actors.stores.base import StoreError
from actors.stores.sqlite import SCHEMA_VERSION, SessionStore

__all__ = ["StoreReader"]

_BUSY_TIMEOUT_MS = 5000


class StoreReader(SessionStore):
    """A :class:`~actors.stores.sqlite.SessionStore` opened read-only: its reading methods work (
    ``open``, ``history``, ``children``, ``list_sessions``), a write fails with
    :class:`~actors.stores.base.StoreError`.

    Raises :class:`~actors.stores.base.StoreError` if ``path`` is not a regular file or not a loopd
    store of this schema version.
    """

    def __init__(self, path: str | Path) -> None:
        """Open the store at ``path`` (the database file) for reading only."""
        self.path = Path(path)
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        if not self.path.is_file():
            raise StoreError(None, f"cannot open the store at {self.path}: not a file")
        uri = f"file:{quote(str(self.path.resolve()))}?mode=ro"
        try:
            conn = self._connect(uri)
        except sqlite3.Error:
            # A WAL store in a folder we may not write to, with no -shm file left by a writer:
            # SQLite can read it only as immutable. No writer can be at work there either.
            try:
                conn = self._connect(uri + "&immutable=1")
            except sqlite3.Error as exc:
                raise StoreError(None, f"cannot open the store at {self.path}: {exc}") from exc
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        if version != SCHEMA_VERSION:
            conn.close()
            what = "is not a loopd store" if version == 0 else f"has schema version {version}"
            raise StoreError(
                None,
                f"{self.path} {what}; this loopd reads version {SCHEMA_VERSION} "
                "(a runtime started on this home migrates an older store)",
            )
        self._conn = conn

    @staticmethod
    def _connect(uri: str) -> sqlite3.Connection:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except BaseException:
            conn.close()
            raise
        return conn
