"""The session store in one SQLite file: every session's baseline, transcript and counters.

:class:`SessionStore` is the session logic of :class:`~actors.stores.sql.SqlSessionStore` over
stdlib ``sqlite3``; this module adds what is SQLite's own: the file (created with its folder),
WAL and ``synchronous=FULL``, the schema in ``PRAGMA user_version`` and its migrations, and the
check before every write that the path still names the file it opened. The store actor
(:class:`~actors.services.store.StoreActor`) owns one and does all of its disk work.

Durability: the database runs in WAL mode with ``synchronous=FULL``, so every commit is on disk
when the call returns. A session actor sends its next model request only after the store has
answered ``Appended``, so a crash loses at most the request in flight (SPEC 7).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from pathlib import Path

from actors.stores.base import StoreError, StoreFileReplaced
from actors.stores.remote_rows import remote_table
from actors.stores.sql import Dialect, SqlSessionStore, baseline_hash

__all__ = ["DB_NAME", "SCHEMA_VERSION", "SQLITE", "SessionStore", "baseline_hash"]

log = logging.getLogger(__name__)

DB_NAME = "loopd.db"
"""The store's file name under ``home``: ``<home>/loopd.db``."""

SCHEMA_VERSION = 6
"""The schema this module writes, kept in ``PRAGMA user_version``. Version 1 (baselines inline
in ``sessions``, no ``parent``), version 2 (no ``agent``), version 3 (no ``background`` and
no ``approvals`` table), version 4 (no ``running`` flag on sessions, no ``a2a_tasks`` table)
and version 5 (no ``remote_tasks`` table) are migrated when a store is opened; a session stored
before version 3 runs the ``default`` agent."""

BUSY_TIMEOUT_MS = 10_000
"""How long a statement waits for another process's lock (a CLI reader, say) before failing."""


def _failure(session: str | None, action: str, exc: Exception) -> StoreError:
    return StoreError(session, f"cannot {action}: {exc}")


SQLITE = Dialect(
    name="SQLite",
    placeholder="?",
    prefix="",
    # Writes take the write lock up front, so a read-then-write cannot race another process.
    begin_write="BEGIN IMMEDIATE",
    for_update="",
    blob="BLOB",
    bigint="INTEGER",
    flag="INTEGER",
    flag_check=True,
    if_not_exists=False,
    error=sqlite3.Error,
    in_transaction=lambda conn: bool(conn.in_transaction),
    failure=_failure,
)
"""SQLite's dialect: ``?``, no table prefix, ``BEGIN IMMEDIATE``, flags as 0/1 integers."""

_BASELINES, _SESSIONS, _MESSAGES, _APPROVALS = SQLITE.tables


class SessionStore(SqlSessionStore):
    """Sessions in one SQLite file: create, open, append, compact, list, read back.

    Every method runs in one transaction and commits durably before it returns;
    :meth:`run_batch` runs many operations in one (see
    :class:`~actors.stores.sql.SqlSessionStore`). The connection is opened with
    ``check_same_thread=False`` so the store may be built on one thread and used on another, but
    one thread owns the writes: the :class:`StoreActor`'s. A lock still serialises calls, so an
    occasional read from another thread (a REPL) cannot interleave with a write's transaction.
    Other processes (``loopd sessions``) should open their own store; WAL lets them read while
    the runtime writes.

    Before every write the store checks that its path still names the file it opened: a file
    removed or replaced under it raises :class:`StoreFileReplaced` instead of writing to a file
    nobody will read again.
    """

    dialect = SQLITE

    # A class default, so a subclass that opens its connection its own way (a read-only view)
    # still has it: the file's identity, checked before writes.
    _identity: tuple[int, int] | None = None

    def __init__(self, path: str | Path) -> None:
        """Open (and if need be create) the store at ``path``, the database file itself.

        Creates missing parent directories and migrates a version 1 store. Raises
        :class:`StoreError` if the file is not a loopd store or was written by a newer schema.
        """
        self.path = Path(path)
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: the module opens no implicit transactions; each method
            # states its own BEGIN/COMMIT so a transaction is exactly one method call.
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(None, f"cannot open the store at {self.path}: {exc}") from exc
        try:
            self._configure(conn)
            self._migrate(conn)
            # Foreign keys only after the migration, which rebuilds a referenced table.
            conn.execute("PRAGMA foreign_keys = ON")
            self._identity = self._stat()
        except BaseException as exc:
            conn.close()
            if isinstance(exc, sqlite3.Error | OSError):
                raise StoreError(None, f"cannot open the store at {self.path}: {exc}") from exc
            raise
        self._conn = conn

    def _stat(self) -> tuple[int, int]:
        st = os.stat(self.path)
        return (st.st_dev, st.st_ino)

    def check_file(self) -> None:
        """Raise :class:`StoreFileReplaced` if the path no longer names the file we opened."""
        try:
            now = self._stat()
        except FileNotFoundError:
            raise StoreFileReplaced(self.path, "it no longer exists") from None
        except OSError as exc:
            raise StoreFileReplaced(self.path, f"it cannot be checked: {exc}") from exc
        if self._identity is not None and now != self._identity:
            raise StoreFileReplaced(self.path, "another file now has its name")

    _before_write = check_file

    def _configure(self, conn: sqlite3.Connection) -> None:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
        if str(mode).lower() != "wal":
            # Some file systems (network mounts) refuse WAL; the store still works, slower.
            log.warning("store %s: journal_mode is %s, not wal", self.path, mode)
        # FULL: a commit is fsynced before it returns, so "appended" means durable.
        conn.execute("PRAGMA synchronous = FULL")

    def _migrate(self, conn: sqlite3.Connection) -> None:
        # IMMEDIATE: two processes opening a fresh file cannot both create the schema.
        conn.execute("BEGIN IMMEDIATE")
        try:
            (version,) = conn.execute("PRAGMA user_version").fetchone()
            if version > SCHEMA_VERSION:
                raise StoreError(
                    None,
                    f"the store at {self.path} has schema version {version}; this loopd "
                    f"reads version {SCHEMA_VERSION} (upgrade loopd)",
                )
            if version == 0:
                known = conn.execute(
                    "SELECT name FROM sqlite_master WHERE name IN"
                    " ('sessions', 'messages', 'baselines', 'background', 'approvals', 'a2a_tasks')"
                ).fetchall()
                if known:
                    raise StoreError(
                        None, f"{self.path} holds tables that are not a loopd store: {known}"
                    )
                conn.execute(_BASELINES)
                conn.execute(_SESSIONS.format(sessions="sessions"))
                conn.execute(_MESSAGES)
                conn.execute(_APPROVALS)
            elif version == 1:
                self._migrate_from_1(conn)  # builds the version 3 table
            elif version == 2:
                log.info("store %s: migrating schema version 2 to %d", self.path, SCHEMA_VERSION)
                conn.execute(
                    "ALTER TABLE sessions ADD COLUMN agent TEXT NOT NULL DEFAULT 'default'"
                )
            if version < 4:  # version 4: background children and their reports
                conn.execute(SQLITE.background_table)
            if 1 <= version < 4:  # version 4 also keeps the calls that wait for a person
                log.info("store %s: adding the approvals table (schema 4)", self.path)
                conn.execute(_APPROVALS)
            if 2 <= version < 5:  # version 5: which sessions run a turn (1 rebuilt the table)
                log.info("store %s: adding the running flag (schema 5)", self.path)
                conn.execute(
                    "ALTER TABLE sessions ADD COLUMN running INTEGER NOT NULL DEFAULT 0"
                    " CHECK (running IN (0, 1))"
                )
            if version < 5:  # version 5: the A2A endpoint's tasks
                conn.execute(SQLITE.a2a_table)
            if version < 6:  # version 6: the remote children's rows (A2A calling out)
                conn.execute(remote_table(SQLITE))
            if version < SCHEMA_VERSION:
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _migrate_from_1(self, conn: sqlite3.Connection) -> None:
        """Version 1 kept each baseline inline and had no parent: move baselines to their own
        table (one row per distinct baseline) and rebuild ``sessions`` with a reference.

        A version 1 record gets no parent, so no spawn will take it for its child: its ids were
        never checked against forgery, so none is trusted to be one.
        """
        log.info("store %s: migrating schema version 1 to %d", self.path, SCHEMA_VERSION)

        def sha256(body: bytes) -> str:
            return baseline_hash(bytes(body))

        conn.create_function("loopd_sha256", 1, sha256, deterministic=True)
        conn.execute(_BASELINES)
        conn.execute(
            "INSERT OR IGNORE INTO baselines (hash, body)"
            " SELECT loopd_sha256(baseline), baseline FROM sessions"
        )
        conn.execute(_SESSIONS.format(sessions="sessions_v2"))
        conn.execute(
            "INSERT INTO sessions_v2 (id, baseline, parent, slot, turns, next_call_id, untrusted,"
            " created_at, updated_at) SELECT id, loopd_sha256(baseline), NULL, slot, turns,"
            " next_call_id, untrusted, created_at, updated_at FROM sessions"
        )
        # Foreign keys are off here (they are switched on after the migration), so the table
        # that messages refer to can be swapped under the same name.
        conn.execute("DROP TABLE sessions")
        conn.execute("ALTER TABLE sessions_v2 RENAME TO sessions")
        broken = conn.execute("PRAGMA foreign_key_check").fetchall()
        if broken:
            raise StoreError(None, f"{self.path}: migration broke references: {broken[:5]}")
