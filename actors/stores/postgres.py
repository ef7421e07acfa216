"""The session store in PostgreSQL, for runtimes on several processes or machines (issue 13).

:class:`PgSessionStore` keeps what :class:`~actors.stores.sqlite.SessionStore` keeps (baselines
stored once, messages never deleted, ``parent`` per child, counters) in tables named ``loopd_*`` of
the database at ``[store] url``, through psycopg 3, and answers the same calls with the same
errors, so the :class:`~actors.services.store.StoreActor` drives either one.

Durability: every transaction is committed before a call returns, with the server's
``synchronous_commit`` (on by default), so "appended" means on the server's disk.

One runner per session: the first time this store opens or creates a session it takes a
session-level advisory lock named by the session id on its connection, and keeps it until
:meth:`PgSessionStore.release` (the Context is done with the session) or until the connection
ends. A process that dies loses its connection, so its locks go with it. Another process that
asks for a session whose lock is taken is refused with :class:`SessionHeldElsewhere`.

A lost connection (the server stopped, restarted or unreachable) fails the request at hand with
a :class:`~actors.stores.base.StoreError`; the next request connects again (within
``connect_timeout_s``) and takes back the locks this store held. A connection the server ended
while it was idle (a restart between two requests) is found dead at the first statement of the
next transaction, before anything was done on it: that transaction connects again at once
instead of failing. The memory entries (:class:`PgMemory`) and the scheduler's state
(:class:`PgSchedulerState`) go through the same store, so they reconnect the same way.

The session logic is :class:`~actors.stores.sql.SqlSessionStore`'s; this module adds the
connection, the ``loopd_*`` schema, the advisory locks, and the tables a cluster shares.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from datetime import datetime
from typing import Any

import psycopg  # the loopd[postgres] extra; open_store explains a missing one

from actors.core.text import redact
from actors.stores.base import StoreError
from actors.stores.memory import (
    DEFAULT_MAX_CHARS,
    DEFAULT_MAX_ENTRY_CHARS,
    check_room,
    entry_text,
)
from actors.stores.outbox_rows import OUTBOX_TABLE, OutboxRows
from actors.stores.remote_rows import remote_table
from actors.stores.sql import Dialect, SqlSessionStore, now
from messages.background import BackgroundRow
from messages.ids import family_root

__all__ = [
    "HOLDER_LEASE_S",
    "PG",
    "PG_SCHEMA_VERSION",
    "PgMemory",
    "PgSchedulerState",
    "PgSessionStore",
    "SessionHeldElsewhere",
    "lock_key",
]

log = logging.getLogger(__name__)

PG_SCHEMA_VERSION = 5
"""The schema this module writes, kept in ``loopd_meta``. Version 1 had no ``agent``: its
sessions run the ``default`` agent. Version 2 had no ``loopd_background`` and no
``loopd_approvals``. Version 3 had no ``running`` flag on sessions, no
``loopd_a2a_tasks`` and no ``loopd_remote_tasks`` (A2A children). Version 4 had no
``loopd_outbox`` (a cluster shard's events not yet handed over)."""

STATEMENT_TIMEOUT_MS = 30_000
"""The longest a statement may run on the server before it fails (``statement_timeout``)."""

_SERVER_KEEPALIVES = (
    "-c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3"
)

HOLDER_LEASE_S = 25
"""How long the server keeps a vanished holder's connection (and its locks): 10 s idle, then
three unanswered probes 5 s apart. A holder that was killed closes its socket: at once."""

_SCHEMA_LOCK = 0x6C6F6F7064  # "loopd": one migration at a time across processes


def _failure(session: str | None, action: str, exc: Exception) -> StoreError:
    if isinstance(exc, StoreError):
        return exc
    return StoreError(session, f"cannot {action}: {type(exc).__name__}: {exc}".strip())


PG = Dialect(
    name="PostgreSQL",
    placeholder="%s",
    prefix="loopd_",
    begin_write="BEGIN",
    # The row a write reads first is locked, so two processes cannot both move a session on.
    for_update=" FOR UPDATE",
    blob="BYTEA",
    bigint="BIGINT",
    flag="BOOLEAN",
    flag_check=False,
    if_not_exists=True,
    error=psycopg.Error,
    in_transaction=lambda conn: conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE,
    failure=_failure,
    # A connection that failed this way is gone: its jobs run again on a new one.
    lost=(psycopg.OperationalError,),
)
"""PostgreSQL's dialect: ``%s``, tables named ``loopd_*``, ``FOR UPDATE``, real booleans."""

_BASELINES, _SESSIONS, _MESSAGES, _APPROVALS = PG.tables
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS loopd_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    _BASELINES,
    _SESSIONS.format(sessions="sessions"),
    # Version 2: the agent profile of each session (a version 1 table gains it here).
    "ALTER TABLE loopd_sessions ADD COLUMN IF NOT EXISTS agent TEXT NOT NULL DEFAULT 'default'",
    _MESSAGES,
    # Version 3: background children and their reports, and the calls that wait for a person.
    PG.background_table,
    _APPROVALS,
    # Version 4: which sessions run a turn (what a crash cut off, at the next start).
    "ALTER TABLE loopd_sessions ADD COLUMN IF NOT EXISTS running BOOLEAN NOT NULL DEFAULT FALSE",
    # Version 4: the A2A endpoint's tasks.
    PG.a2a_table,
    """CREATE TABLE IF NOT EXISTS loopd_memory (
        seq  BIGSERIAL PRIMARY KEY,
        text TEXT NOT NULL,
        at   TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS loopd_scheduler (
        job        TEXT PRIMARY KEY,
        last_run   TIMESTAMPTZ,
        first_seen TIMESTAMPTZ)""",
    # Version 4 (A2A calling out): the remote children's rows (remote_rows).
    remote_table(PG),
    # Version 5: a cluster shard's events not yet handed to its driver (outbox_rows).
    OUTBOX_TABLE,
)


class SessionHeldElsewhere(StoreError):
    """Another process runs this session (it holds the session's advisory lock)."""

    held_elsewhere = True

    def __init__(self, session: str) -> None:
        super().__init__(
            session,
            "another loopd process holds it (its advisory lock is taken); a session is run by "
            "one process at a time",
        )


def lock_key(session: str) -> int:
    """The advisory lock key of ``session``: 64 bits of SHA-256, as a signed bigint."""
    digest = hashlib.sha256(b"loopd-session:" + session.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class PgSessionStore(SqlSessionStore, OutboxRows):
    """Sessions in PostgreSQL: the same calls and errors as the SQLite store's.

    One connection, owned by the thread that calls (the store actor's); a lock serialises the
    occasional call from another thread. Ids are only ever SQL parameters.
    """

    dialect = PG

    def __init__(self, url: str, *, connect_timeout_s: float = 5.0) -> None:
        """Connect to ``url`` and create the ``loopd_*`` tables if they are missing.

        Raises :class:`StoreError` naming the (password-free) url if the server cannot be
        reached or the database holds a newer loopd schema.
        """
        self.url = url
        self.connect_timeout_s = connect_timeout_s
        self._lock = threading.RLock()
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False
        self._locked: set[str] = set()
        with self._lock:
            conn = self._connection(None, "open the store")
            try:
                self._migrate(conn)
            except psycopg.Error as exc:
                conn.close()
                raise StoreError(None, f"cannot open the store at {redact(url)}: {exc}") from exc

    def __repr__(self) -> str:
        return f"PgSessionStore({redact(self.url)!r})"

    # Connection and transactions.

    def _alive(self) -> bool:
        conn = self._conn
        return conn is not None and not conn.closed and not conn.broken

    def _connection(self, session: str | None, action: str) -> psycopg.Connection[Any]:
        if self._closed:
            raise StoreError(session, f"cannot {action}: the store is closed")
        if self._conn is not None and self._alive():
            return self._conn
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        try:
            conn = psycopg.connect(
                self.url,
                autocommit=True,  # each method states its own BEGIN and COMMIT
                connect_timeout=max(1, round(self.connect_timeout_s)),
                # A server that hangs fails the statement instead of the turn waiting forever;
                # every statement of loopd's is short. The server's keepalives on this
                # connection are its lease: a holder whose machine vanished loses its
                # connection, and with it its sessions' locks, within HOLDER_LEASE_S.
                options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS} {_SERVER_KEEPALIVES}",
                # Keepalives: a server that vanished without closing the socket is noticed.
                keepalives=1,
                keepalives_idle=5,
                keepalives_interval=2,
                keepalives_count=3,
            )
        except psycopg.Error as exc:
            raise StoreError(
                session, f"cannot {action}: cannot reach PostgreSQL at {redact(self.url)}: {exc}"
            ) from exc
        try:
            self._relock(conn)
        except psycopg.Error as exc:
            conn.close()
            raise _failure(session, action, exc) from exc
        self._conn = conn
        return conn

    def _begin(self, session: str | None, action: str, *, write: bool) -> Any:
        reused = self._alive()
        try:
            return super()._begin(session, action, write=write)
        except StoreError:
            # A connection the server ended while it sat idle (a restart) fails at its first
            # statement, the BEGIN, before anything was done: connect again at once.
            if not reused or self._alive():
                raise
        log.info("store: the connection to PostgreSQL was lost while idle; connecting again")
        return super()._begin(session, action, write=write)

    def _relock(self, conn: psycopg.Connection[Any]) -> None:
        """Take back the locks of a connection that ended: the sessions are still ours."""
        for session in sorted(self._locked):
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (lock_key(session),)).fetchone()
            if row is None or not row[0]:
                log.warning("store: lost session %s to another process after a reconnect", session)
                self._locked.discard(session)

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            for statement in _SCHEMA:
                conn.execute(statement)
            row = conn.execute("SELECT value FROM loopd_meta WHERE key = 'schema'").fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO loopd_meta (key, value) VALUES ('schema', %s)",
                    (str(PG_SCHEMA_VERSION),),
                )
            elif int(row[0]) > PG_SCHEMA_VERSION:
                raise StoreError(
                    None,
                    f"the store at {redact(self.url)} has schema version {row[0]}; this loopd "
                    f"reads version {PG_SCHEMA_VERSION} (upgrade loopd)",
                )
            elif int(row[0]) < PG_SCHEMA_VERSION:  # the statements above migrated it
                conn.execute(
                    "UPDATE loopd_meta SET value = %s WHERE key = 'schema'",
                    (str(PG_SCHEMA_VERSION),),
                )

    # Advisory locks.

    def _hold(self, cur: Any, id: str) -> None:
        """Hold ``id`` for this process, or raise :class:`SessionHeldElsewhere`."""
        if id in self._locked:
            return
        row = cur.execute("SELECT pg_try_advisory_lock(%s)", (lock_key(id),)).fetchone()
        if row is None or not row[0]:
            raise SessionHeldElsewhere(id)
        self._locked.add(id)

    def refuse_if_run_elsewhere(self, cur: Any, session: str) -> None:
        """Raise :class:`SessionHeldElsewhere` if another connection holds the advisory lock
        of ``session`` or of its family's top-level session (a process runs the family now: a
        child's own lock goes with its actor, its root's stays while the family runs). It
        only looks: two decisions from outside do not lock each other out (the row's update
        decides between them)."""
        if self.held_elsewhere_in(cur, session):
            raise SessionHeldElsewhere(session)

    def held_elsewhere_in(self, cur: Any, session: str) -> bool:
        """Whether another connection holds the lock of ``session`` or of its family's root."""
        root = family_root(session)
        return self._held_elsewhere(cur, session) or (
            root != session and self._held_elsewhere(cur, root)
        )

    def _held_elsewhere(self, cur: Any, session: str) -> bool:
        key = lock_key(session) & 0xFFFFFFFFFFFFFFFF  # as pg_locks shows a bigint key
        row = cur.execute(
            "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND classid = %s AND objid = %s AND objsubid = 1 AND pid <> pg_backend_pid()"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            (key >> 32, key & 0xFFFFFFFF),
        ).fetchone()
        return row is not None

    def load_background_in(self, cur: Any) -> tuple[BackgroundRow, ...]:
        """Every background row but those of a live process: a row whose child or parent
        another process holds is that process's (its child still runs, or its report is
        being delivered); a start that took it would report a running child ``failed``."""
        return tuple(
            row
            for row in super().load_background_in(cur)
            if not self.held_elsewhere_in(cur, row.child)
            and not self.held_elsewhere_in(cur, row.parent)
        )

    def release(self, id: str) -> None:
        """Let another process run ``id``: drop its advisory lock (if this store holds it)."""
        with self._lock:
            if id not in self._locked:
                return
            self._locked.discard(id)
            conn = self._conn
            if conn is None or conn.closed or conn.broken:
                return  # the lock ended with its connection
            try:
                conn.execute("SELECT pg_advisory_unlock(%s)", (lock_key(id),))
            except psycopg.Error as exc:
                log.warning("store: cannot release session %s: %s", id, exc)

    def held(self) -> tuple[str, ...]:
        """The sessions this store holds the lock of, sorted."""
        with self._lock:
            return tuple(sorted(self._locked))

    # Memory entries and scheduler state, shared by every process of a cluster.

    def add_memory(self, text: str, *, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        """Store one memory entry; :class:`~actors.stores.memory.MemoryFailure` if the entries (one
        ``- <entry>`` line each) would pass ``max_chars``. Processes add one at a time."""
        with self._transaction("*", "remember", write=True) as cur:
            # One writer at a time across processes, so two cannot both fit the last room.
            cur.execute("LOCK TABLE loopd_memory IN SHARE ROW EXCLUSIVE MODE")
            row = cur.execute(
                "SELECT COALESCE(SUM(length(text) + 3), 0) FROM loopd_memory"
            ).fetchone()
            used = int(row[0]) if row is not None else 0
            check_room(used, len(text) + 3, max_chars, "the memory", "the loopd_memory table")
            cur.execute("INSERT INTO loopd_memory (text, at) VALUES (%s, %s)", (text, now()))

    def memory_entries(self) -> list[str]:
        """Every memory entry, oldest first."""
        with self._transaction("*", "read memory", write=False) as cur:
            rows = cur.execute("SELECT text FROM loopd_memory ORDER BY seq").fetchall()
        return [r[0] for r in rows]

    def load_schedule(self) -> tuple[dict[str, datetime], dict[str, datetime]]:
        """The scheduler's state: the last run and the first sighting of each job, by name."""
        with self._transaction("*", "read the scheduler state", write=False) as cur:
            rows = cur.execute("SELECT job, last_run, first_seen FROM loopd_scheduler").fetchall()
        last_runs = {job: last for job, last, _ in rows if last is not None}
        first_seen = {job: seen for job, _, seen in rows if seen is not None}
        return last_runs, first_seen

    def save_schedule(
        self, last_runs: dict[str, datetime], first_seen: dict[str, datetime]
    ) -> None:
        """Save the times of these jobs (upserts; jobs not named are left as they are)."""
        jobs = sorted(set(last_runs) | set(first_seen))
        with self._transaction("*", "save the scheduler state", write=True) as cur:
            cur.executemany(
                "INSERT INTO loopd_scheduler (job, last_run, first_seen) VALUES (%s, %s, %s)"
                " ON CONFLICT (job) DO UPDATE SET"
                " last_run = COALESCE(EXCLUDED.last_run, loopd_scheduler.last_run),"
                " first_seen = COALESCE(EXCLUDED.first_seen, loopd_scheduler.first_seen)",
                [(job, last_runs.get(job), first_seen.get(job)) for job in jobs],
            )

    def close(self) -> None:
        """Close the connection (its advisory locks go with it). Safe to call twice."""
        with self._lock:
            self._closed = True
            self._locked.clear()
            super().close()


class PgMemory:
    """A :class:`~actors.stores.memory.MemorySource` whose entries live in the shared store.

    Every process of a cluster reads and writes the same entries, so what one session remembers
    reaches the baselines of new sessions on every shard. The block is one ``- <entry>`` line
    per entry, oldest first (the shape the memory file's ``remember`` writes), at most
    ``max_chars`` characters. It opens its own connection, on first use, so it never waits
    behind the store actor's.
    """

    def __init__(
        self,
        url: str,
        *,
        connect_timeout_s: float = 5.0,
        max_chars: int = DEFAULT_MAX_CHARS,
        max_entry_chars: int = DEFAULT_MAX_ENTRY_CHARS,
    ) -> None:
        """Read and write the entries of the database at ``url``, within the two limits."""
        self.url = url
        self.connect_timeout_s = connect_timeout_s
        self.max_chars = max_chars
        self.max_entry_chars = max_entry_chars
        self._store: PgSessionStore | None = None
        self._lock = threading.Lock()

    def _shared(self) -> PgSessionStore:
        with self._lock:
            if self._store is None:
                self._store = PgSessionStore(self.url, connect_timeout_s=self.connect_timeout_s)
            return self._store

    def block(self) -> str:
        """The entries as ``- <entry>`` lines, cut at ``max_chars`` (with a note); raises
        StoreError if the store is unreachable (the spawn then fails)."""
        text = "".join(f"- {entry}\n" for entry in self._shared().memory_entries())
        if len(text) > self.max_chars:
            text = text[: self.max_chars] + (
                f"\n[loopd: the memory is longer than {self.max_chars} characters; "
                "the rest is left out]\n"
            )
        return text

    def remember(self, line: str) -> None:
        """Store ``line`` (one line: runs of white space become one space) as a new entry.

        Raises :class:`~actors.stores.memory.MemoryFailure` for an empty entry, one longer than
        ``max_entry_chars``, or when the entries would pass ``max_chars``.
        """
        text = entry_text(line, self.max_entry_chars)
        self._shared().add_memory(text, max_chars=self.max_chars)

    def updated(self, session: str, turns: int) -> None:
        """Nothing to do: the entries do not depend on turns."""

    def close(self) -> None:
        """Close the connection, if one was opened."""
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None

    def __repr__(self) -> str:
        return f"PgMemory({redact(self.url)!r})"


class PgSchedulerState:
    """The scheduler's state in the shared store (a
        :class:`~actors.services.scheduler.SchedulerStateStore`): one row per job in
    ``loopd_scheduler``.

        Each call opens its own short connection: the scheduler loads once and saves once per run,
        so none is kept open between runs.
    """

    def __init__(self, url: str, *, connect_timeout_s: float = 5.0) -> None:
        """Keep the state in the database at ``url``."""
        self.url = url
        self.connect_timeout_s = connect_timeout_s

    def load(self) -> tuple[dict[str, datetime], dict[str, datetime]]:
        """The last run and the first sighting of each job, by job name."""
        with PgSessionStore(self.url, connect_timeout_s=self.connect_timeout_s) as store:
            return store.load_schedule()

    def save(self, last_runs: dict[str, datetime], first_seen: dict[str, datetime]) -> None:
        """Save these jobs' times."""
        with PgSessionStore(self.url, connect_timeout_s=self.connect_timeout_s) as store:
            store.save_schedule(last_runs, first_seen)

    def __repr__(self) -> str:
        return f"PgSchedulerState({redact(self.url)!r})"
