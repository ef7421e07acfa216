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
``connect_timeout_s``) and takes back the locks this store held.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import msgspec
import psycopg  # the loopd[postgres] extra; open_store explains a missing one

from actors.core.text import redact
from actors.stores.base import (
    SessionExists,
    SessionInfo,
    SessionNotFound,
    SessionTaken,
    StoredMessage,
    StoreError,
)
from actors.stores.memory import (
    DEFAULT_MAX_CHARS,
    DEFAULT_MAX_ENTRY_CHARS,
    check_room,
    entry_text,
)
from actors.stores.sqlite import baseline_hash
from messages.chat import Baseline, ChatMessage
from messages.ids import check_session_id
from messages.runtime import SessionRecord

__all__ = [
    "PG_SCHEMA_VERSION",
    "PgMemory",
    "PgSchedulerState",
    "PgSessionStore",
    "SessionHeldElsewhere",
    "lock_key",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

PG_SCHEMA_VERSION = 2
"""The schema this module writes, kept in ``loopd_meta``. Version 1 had no ``agent``: its
sessions run the ``default`` agent."""

STATEMENT_TIMEOUT_MS = 30_000
"""The longest a statement may run on the server before it fails (``statement_timeout``)."""

_SCHEMA_LOCK = 0x6C6F6F7064  # "loopd": one migration at a time across processes

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS loopd_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS loopd_baselines (hash TEXT PRIMARY KEY, body BYTEA NOT NULL)",
    """CREATE TABLE IF NOT EXISTS loopd_sessions (
        id           TEXT PRIMARY KEY,
        baseline     TEXT NOT NULL REFERENCES loopd_baselines(hash),
        parent       TEXT,
        slot         INTEGER NOT NULL,
        turns        INTEGER NOT NULL DEFAULT 0,
        next_call_id BIGINT NOT NULL DEFAULT 1 CHECK (next_call_id >= 1),
        untrusted    BOOLEAN NOT NULL DEFAULT FALSE,
        created_at   TEXT NOT NULL,
        updated_at   TEXT NOT NULL)""",
    # Version 2: the agent profile of each session.
    "ALTER TABLE loopd_sessions ADD COLUMN IF NOT EXISTS agent TEXT NOT NULL DEFAULT 'default'",
    """CREATE TABLE IF NOT EXISTS loopd_messages (
        session   TEXT NOT NULL REFERENCES loopd_sessions(id),
        seq       INTEGER NOT NULL CHECK (seq >= 1),
        body      BYTEA NOT NULL,
        compacted BOOLEAN NOT NULL DEFAULT FALSE,
        at        TEXT NOT NULL,
        PRIMARY KEY (session, seq))""",
    """CREATE TABLE IF NOT EXISTS loopd_memory (
        seq  BIGSERIAL PRIMARY KEY,
        text TEXT NOT NULL,
        at   TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS loopd_scheduler (
        job        TEXT PRIMARY KEY,
        last_run   TIMESTAMPTZ,
        first_seen TIMESTAMPTZ)""",
)

_ENCODER = msgspec.json.Encoder()
_BASELINE = msgspec.json.Decoder(Baseline)
_MESSAGE = msgspec.json.Decoder(ChatMessage)
_BASELINE_CACHE = 64


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


def _now() -> str:
    """The current time as the SQLite store writes it: RFC 3339 UTC, milliseconds, ``Z``."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class PgSessionStore:
    """Sessions in PostgreSQL: the same calls and errors as the SQLite store's.

    One connection, owned by the thread that calls (the store actor's); a lock serialises the
    occasional call from another thread. Ids are only ever SQL parameters.
    """

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
        self._baselines: OrderedDict[str, Baseline] = OrderedDict()
        with self._lock:
            conn = self._connect(None, "open the store")
            try:
                self._migrate(conn)
            except psycopg.Error as exc:
                conn.close()
                raise StoreError(None, f"cannot open the store at {redact(url)}: {exc}") from exc

    def __repr__(self) -> str:
        return f"PgSessionStore({redact(self.url)!r})"

    # Connection and transactions.

    def _connect(self, session: str | None, action: str) -> psycopg.Connection[Any]:
        if self._closed:
            raise StoreError(session, f"cannot {action}: the store is closed")
        if self._conn is not None and not self._conn.closed and not self._conn.broken:
            return self._conn
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        try:
            conn = psycopg.connect(
                self.url,
                autocommit=True,
                connect_timeout=max(1, round(self.connect_timeout_s)),
                # A server that hangs fails the statement instead of the turn waiting forever;
                # every statement of loopd's is short.
                options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
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
            raise self._failure(session, action, exc) from exc
        self._conn = conn
        return conn

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

    def _failure(self, session: str | None, action: str, exc: Exception) -> StoreError:
        if isinstance(exc, StoreError):
            return exc
        return StoreError(session, f"cannot {action}: {type(exc).__name__}: {exc}".strip())

    @contextmanager
    def _transaction(self, session: str, action: str) -> Iterator[psycopg.Cursor[Any]]:
        """One transaction; a database error becomes a StoreError naming session and action."""
        with self._lock:
            conn = self._connect(session, action)
            try:
                with conn.transaction(), conn.cursor() as cur:
                    yield cur
            except psycopg.Error as exc:
                raise self._failure(session, action, exc) from exc

    def run_batch(self, jobs: Sequence[tuple[str, Callable[[Any], _T]]]) -> list[_T | Exception]:
        """Run every job in one transaction, each in a savepoint; results once committed.

        As the SQLite store's ``run_batch``: a job that fails is rolled back alone;
        if the transaction itself fails every job runs again alone, so each gets the answer it
        would have had by itself (a server that is gone answers each with a StoreError).
        """
        with self._lock:
            try:
                conn = self._connect(None, "write")
            except StoreError as exc:
                return [StoreError(session, exc.detail) for session, _ in jobs]
            results: list[_T | Exception] = []
            try:
                with conn.transaction(), conn.cursor() as cur:
                    for session, job in jobs:
                        results.append(self._savepoint(conn, cur, session, job))
                return results
            except psycopg.Error as exc:
                log.warning("store: a batch of %d failed: %s", len(jobs), exc)
            return [self._alone(session, job) for session, job in jobs]

    def _savepoint(
        self,
        conn: psycopg.Connection[Any],
        cur: psycopg.Cursor[Any],
        session: str,
        job: Callable[[Any], _T],
    ) -> _T | Exception:
        try:
            with conn.transaction():
                return job(cur)
        except psycopg.OperationalError:
            raise  # the connection is gone: the whole batch is retried alone
        except psycopg.Error as exc:
            return self._failure(session, "write", exc)
        except Exception as exc:
            return exc

    def _alone(self, session: str, job: Callable[[Any], _T]) -> _T | Exception:
        try:
            with self._transaction(session, "write") as cur:
                return job(cur)
        except Exception as exc:
            return exc

    # Advisory locks.

    def _take(self, cur: psycopg.Cursor[Any], id: str) -> None:
        """Hold ``id`` for this process, or raise :class:`SessionHeldElsewhere`."""
        if id in self._locked:
            return
        row = cur.execute("SELECT pg_try_advisory_lock(%s)", (lock_key(id),)).fetchone()
        if row is None or not row[0]:
            raise SessionHeldElsewhere(id)
        self._locked.add(id)

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

    # The calls of SessionStore.

    def create(
        self, id: str, baseline: Baseline, slot: int, *, agent: str = "default"
    ) -> SessionRecord:
        """Store a new session of profile ``agent``; :class:`SessionExists` for a stored id."""
        check_session_id(id)
        with self._transaction(id, "create") as cur:
            return self.create_in(cur, id, baseline, slot, agent=agent)

    def create_in(
        self, cur: Any, id: str, baseline: Baseline, slot: int, *, agent: str = "default"
    ) -> SessionRecord:
        """:meth:`create` inside the caller's transaction."""
        check_session_id(id)
        self._take(cur, id)
        if self._row(cur, id) is not None:
            raise SessionExists(id)
        self._insert(cur, id, baseline, slot, agent=agent)
        return self._record(cur, id)

    def create_child(
        self,
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
        """Store child ``id`` of ``parent`` with ``first``, then ``more``; True if it is new."""
        with self._transaction(id, "create the child") as cur:
            return self.create_child_in(
                cur,
                id,
                parent,
                baseline,
                slot,
                untrusted=untrusted,
                first=first,
                agent=agent,
                more=more,
                next_call_id=next_call_id,
            )

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
        """As the SQLite store's ``create_child_in``: a record some other way made
        raises :class:`SessionTaken`; a new child holds ``first`` and ``more``, and one turn."""
        check_session_id(id)
        self._take(cur, id)
        row = cur.execute("SELECT parent FROM loopd_sessions WHERE id = %s", (id,)).fetchone()
        if row is not None:
            if row[0] != parent:
                raise SessionTaken(id, parent)
            if untrusted:
                cur.execute("UPDATE loopd_sessions SET untrusted = TRUE WHERE id = %s", (id,))
            return self._record(cur, id), False
        self._insert(
            cur,
            id,
            baseline,
            slot,
            parent=parent,
            untrusted=untrusted,
            turns=1,
            agent=agent,
            next_call_id=next_call_id,
        )
        transcript = (first, *more)
        self._insert_messages(cur, id, transcript, _now(), last=0)
        record = SessionRecord(
            id=id,
            baseline=baseline,
            slot=slot,
            transcript=transcript,
            turns=1,
            next_call_id=next_call_id,
            untrusted=untrusted,
            parent=parent,
            agent=agent,
        )
        return record, True

    def open(self, id: str) -> SessionRecord:
        """Read session ``id`` back (without holding it); :class:`SessionNotFound` if unknown."""
        with self._transaction(id, "open") as cur:
            return self._record(cur, id)

    def open_in(self, cur: Any, id: str) -> SessionRecord:
        """Hold and read ``id`` inside the caller's transaction."""
        self._take(cur, id)
        return self._record(cur, id)

    def open_or_create(
        self, id: str, baseline: Baseline, slot: int, *, agent: str = "default"
    ) -> tuple[SessionRecord, bool]:
        """Open ``id``, or create it with ``baseline`` on ``slot`` and profile ``agent``; True
        when created (a stored session keeps its own)."""
        check_session_id(id)
        with self._transaction(id, "open or create") as cur:
            return self.open_or_create_in(cur, id, baseline, slot, agent=agent)

    def open_or_create_in(
        self, cur: Any, id: str, baseline: Baseline, slot: int, *, agent: str = "default"
    ) -> tuple[SessionRecord, bool]:
        """:meth:`open_or_create` inside the caller's transaction."""
        check_session_id(id)
        self._take(cur, id)
        created = self._row(cur, id) is None
        if created:
            self._insert(cur, id, baseline, slot, agent=agent)
        return self._record(cur, id), created

    def append(
        self,
        id: str,
        messages: Sequence[ChatMessage],
        *,
        turns: int,
        next_call_id: int,
        untrusted: bool,
    ) -> None:
        """Append ``messages`` and save the counters, in one transaction."""
        with self._transaction(id, "append") as cur:
            self.append_in(
                cur, id, messages, turns=turns, next_call_id=next_call_id, untrusted=untrusted
            )

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
        """:meth:`append` inside the caller's transaction; call ids never go down."""
        row = cur.execute(
            "SELECT next_call_id FROM loopd_sessions WHERE id = %s FOR UPDATE", (id,)
        ).fetchone()
        if row is None:
            raise SessionNotFound(id)
        stored_next = row[0]
        if next_call_id < 1 or next_call_id < stored_next:
            raise StoreError(
                id,
                f"cannot append: next_call_id {next_call_id} is below the stored "
                f"{stored_next} (call ids are never reused)",
            )
        now = _now()
        self._insert_messages(cur, id, messages, now)
        cur.execute(
            "UPDATE loopd_sessions SET turns = %s, next_call_id = %s,"
            " untrusted = untrusted OR %s, updated_at = %s WHERE id = %s",
            (turns, next_call_id, bool(untrusted), now, id),
        )

    def compact(self, id: str, summary: ChatMessage) -> None:
        """Replace ``id``'s live history by ``summary`` (old messages kept, marked)."""
        with self._transaction(id, "compact") as cur:
            self.compact_in(cur, id, summary)

    def compact_in(self, cur: Any, id: str, summary: ChatMessage) -> None:
        """:meth:`compact` inside the caller's transaction."""
        if cur.execute("SELECT 1 FROM loopd_sessions WHERE id = %s", (id,)).fetchone() is None:
            raise SessionNotFound(id)
        now = _now()
        cur.execute(
            "UPDATE loopd_messages SET compacted = TRUE WHERE session = %s AND NOT compacted",
            (id,),
        )
        self._insert_messages(cur, id, (summary,), now)
        cur.execute("UPDATE loopd_sessions SET updated_at = %s WHERE id = %s", (now, id))

    def list_sessions(self) -> list[SessionInfo]:
        """Every stored session's counters, sorted by id."""
        with self._transaction("*", "list sessions") as cur:
            rows = cur.execute(
                "SELECT s.id, s.slot, s.turns, s.untrusted,"
                " (SELECT COUNT(*) FROM loopd_messages m WHERE m.session = s.id),"
                " s.created_at, s.updated_at, s.parent, s.agent FROM loopd_sessions s"
                " ORDER BY s.id"
            ).fetchall()
        return [
            SessionInfo(
                id=r[0],
                slot=r[1],
                turns=r[2],
                untrusted=bool(r[3]),
                messages=r[4],
                created_at=r[5],
                updated_at=r[6],
                parent=r[7],
                agent=r[8],
            )
            for r in rows
        ]

    def history(self, id: str) -> list[StoredMessage]:
        """Every stored message of ``id`` in order, compacted ones included."""
        with self._transaction(id, "read history") as cur:
            if self._row(cur, id) is None:
                raise SessionNotFound(id)
            rows = cur.execute(
                "SELECT seq, body, compacted, at FROM loopd_messages WHERE session = %s"
                " ORDER BY seq",
                (id,),
            ).fetchall()
        return [
            StoredMessage(seq=s, message=self._decode_message(id, s, b), compacted=c, at=at)
            for s, b, c, at in rows
        ]

    def children(self, id: str) -> list[str]:
        """The stored direct children of ``id`` (``sub-<id>-<n>``), by ``n``."""
        prefix = f"sub-{id}-"
        with self._transaction(id, "list children") as cur:
            rows = cur.execute(
                "SELECT id FROM loopd_sessions WHERE substr(id, 1, %s) = %s",
                (len(prefix), prefix),
            ).fetchall()
        pattern = re.compile(re.escape(prefix) + r"([0-9]+)", re.ASCII)
        found = [(m, r[0]) for r in rows if (m := pattern.fullmatch(r[0])) is not None]
        return [child for m, child in sorted(found, key=lambda f: (int(f[0][1]), f[1]))]

    # Memory entries and scheduler state, shared by every process of a cluster.

    def add_memory(self, text: str, *, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        """Store one memory entry; :class:`~actors.stores.memory.MemoryFailure` if the entries (one
        ``- <entry>`` line each) would pass ``max_chars``. Processes add one at a time."""
        with self._transaction("*", "remember") as cur:
            # One writer at a time across processes, so two cannot both fit the last room.
            cur.execute("LOCK TABLE loopd_memory IN SHARE ROW EXCLUSIVE MODE")
            row = cur.execute(
                "SELECT COALESCE(SUM(length(text) + 3), 0) FROM loopd_memory"
            ).fetchone()
            used = int(row[0]) if row is not None else 0
            check_room(used, len(text) + 3, max_chars, "the memory", "the loopd_memory table")
            cur.execute("INSERT INTO loopd_memory (text, at) VALUES (%s, %s)", (text, _now()))

    def memory_entries(self) -> list[str]:
        """Every memory entry, oldest first."""
        with self._transaction("*", "read memory") as cur:
            rows = cur.execute("SELECT text FROM loopd_memory ORDER BY seq").fetchall()
        return [r[0] for r in rows]

    def load_schedule(self) -> tuple[dict[str, datetime], dict[str, datetime]]:
        """The scheduler's state: the last run and the first sighting of each job, by name."""
        with self._transaction("*", "read the scheduler state") as cur:
            rows = cur.execute("SELECT job, last_run, first_seen FROM loopd_scheduler").fetchall()
        last_runs = {job: last for job, last, _ in rows if last is not None}
        first_seen = {job: seen for job, _, seen in rows if seen is not None}
        return last_runs, first_seen

    def save_schedule(
        self, last_runs: dict[str, datetime], first_seen: dict[str, datetime]
    ) -> None:
        """Save the times of these jobs (upserts; jobs not named are left as they are)."""
        jobs = sorted(set(last_runs) | set(first_seen))
        with self._transaction("*", "save the scheduler state") as cur:
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
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> PgSessionStore:
        """The store itself; ``with`` closes it at the end."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the store."""
        self.close()

    # Helpers, inside a transaction.

    @staticmethod
    def _row(cur: Any, id: str) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = cur.execute(
            "SELECT s.baseline, b.body, s.slot, s.turns, s.untrusted, s.next_call_id, s.parent,"
            " s.agent"
            " FROM loopd_sessions s LEFT JOIN loopd_baselines b ON b.hash = s.baseline"
            " WHERE s.id = %s",
            (id,),
        ).fetchone()
        return row

    @staticmethod
    def _insert(
        cur: Any,
        id: str,
        baseline: Baseline,
        slot: int,
        *,
        parent: str | None = None,
        untrusted: bool = False,
        turns: int = 0,
        agent: str = "default",
        next_call_id: int = 1,
    ) -> None:
        now = _now()
        body = _ENCODER.encode(baseline)
        key = baseline_hash(body)
        cur.execute(
            "INSERT INTO loopd_baselines (hash, body) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            (key, body),
        )
        cur.execute(
            "INSERT INTO loopd_sessions (id, baseline, parent, slot, turns, next_call_id,"
            " untrusted, created_at, updated_at, agent)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (id, key, parent, slot, turns, next_call_id, untrusted, now, now, agent),
        )

    @staticmethod
    def _insert_messages(
        cur: Any, id: str, messages: Sequence[ChatMessage], at: str, *, last: int | None = None
    ) -> None:
        if last is None:
            row = cur.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM loopd_messages WHERE session = %s", (id,)
            ).fetchone()
            last = int(row[0])
        cur.executemany(
            "INSERT INTO loopd_messages (session, seq, body, compacted, at)"
            " VALUES (%s, %s, %s, FALSE, %s)",
            [(id, last + i, _ENCODER.encode(m), at) for i, m in enumerate(messages, 1)],
        )

    def _baseline(self, id: str, key: str, body: Any) -> Baseline:
        cached = self._baselines.get(key)
        if cached is not None:
            self._baselines.move_to_end(key)
            return cached
        if body is None:
            raise StoreError(id, f"cannot read the stored baseline: no baseline {key} is stored")
        try:
            baseline = _BASELINE.decode(bytes(body))
        except (msgspec.DecodeError, TypeError) as exc:
            raise StoreError(id, f"cannot read the stored baseline: {exc}") from exc
        self._baselines[key] = baseline
        if len(self._baselines) > _BASELINE_CACHE:
            self._baselines.popitem(last=False)
        return baseline

    def _record(self, cur: Any, id: str) -> SessionRecord:
        row = self._row(cur, id)
        if row is None:
            raise SessionNotFound(id)
        key, body, slot, turns, untrusted, next_call_id, parent, agent = row
        baseline = self._baseline(id, key, body)
        live = cur.execute(
            "SELECT seq, body FROM loopd_messages WHERE session = %s AND NOT compacted"
            " ORDER BY seq",
            (id,),
        ).fetchall()
        return SessionRecord(
            id=id,
            baseline=baseline,
            slot=slot,
            transcript=tuple(self._decode_message(id, seq, b) for seq, b in live),
            turns=turns,
            next_call_id=next_call_id,
            untrusted=bool(untrusted),
            parent=parent,
            agent=agent,
        )

    @staticmethod
    def _decode_message(id: str, seq: int, body: Any) -> ChatMessage:
        try:
            return _MESSAGE.decode(bytes(body))
        except (msgspec.DecodeError, TypeError) as exc:
            raise StoreError(id, f"cannot read stored message seq {seq}: {exc}") from exc


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
