"""The session store: every session's baseline, transcript and counters, in one SQLite file.

:class:`SessionStore` is a plain class over stdlib ``sqlite3``; the store actor
(:class:`~actors.services.store.StoreActor`) owns one and does all of its disk work.

Durability: the database runs in WAL mode with ``synchronous=FULL``, so every commit is on disk
when the call returns. A session actor sends its next model request only after the store has
answered ``Appended``, so a crash loses at most the request in flight (SPEC 7).

A baseline is stored once, in ``baselines`` keyed by the SHA-256 of its bytes; sessions refer to
it. A child's record names the ``parent`` whose spawn created it, so a record made any other way
is never taken for a child. Nothing is ever deleted: compaction marks the old messages
``compacted`` and appends the summary as the new live history, so ``history()`` can always show
what a session once said.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from actors.stores.base import (
    SessionExists,
    SessionInfo,
    SessionNotFound,
    SessionTaken,
    StoredMessage,
    StoreError,
    StoreFileReplaced,
)
from messages.chat import Baseline, ChatMessage
from messages.ids import check_session_id
from messages.runtime import (
    SessionRecord,
)

__all__ = ["DB_NAME", "SCHEMA_VERSION", "SessionStore", "baseline_hash"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

DB_NAME = "loopd.db"
"""The store's file name under ``home``: ``<home>/loopd.db``."""

SCHEMA_VERSION = 3
"""The schema this module writes, kept in ``PRAGMA user_version``. Version 1 (baselines inline
in ``sessions``, no ``parent``) and version 2 (no ``agent``) are migrated when a store is
opened; a session stored before version 3 runs the ``default`` agent."""

BUSY_TIMEOUT_MS = 10_000
"""How long a statement waits for another process's lock (a CLI reader, say) before failing."""

_BASELINES = """
CREATE TABLE baselines (
    hash TEXT PRIMARY KEY NOT NULL,
    body BLOB NOT NULL
)"""

_SESSIONS = """
CREATE TABLE {name} (
    id           TEXT PRIMARY KEY NOT NULL,
    baseline     TEXT NOT NULL REFERENCES baselines(hash),
    parent       TEXT,
    slot         INTEGER NOT NULL,
    turns        INTEGER NOT NULL DEFAULT 0,
    next_call_id INTEGER NOT NULL DEFAULT 1 CHECK (next_call_id >= 1),
    untrusted    INTEGER NOT NULL DEFAULT 0 CHECK (untrusted IN (0, 1)),
    created_at   TEXT NOT NULL,
    updated_at   TEXT NOT NULL,
    agent        TEXT NOT NULL DEFAULT 'default'
)"""

_MESSAGES = """
CREATE TABLE messages (
    session   TEXT NOT NULL REFERENCES sessions(id),
    seq       INTEGER NOT NULL CHECK (seq >= 1),
    body      BLOB NOT NULL,
    compacted INTEGER NOT NULL DEFAULT 0 CHECK (compacted IN (0, 1)),
    at        TEXT NOT NULL,
    PRIMARY KEY (session, seq)
)"""


_last_now: tuple[int, str] = (-1, "")


def _now() -> str:
    """The current time, RFC 3339 UTC with milliseconds (text sorts in time order)."""
    # A write batch asks for it several times within one millisecond: the last text is kept
    # (one tuple, swapped whole, so threads may share it).
    global _last_now
    ms = time.time_ns() // 1_000_000
    last = _last_now
    if last[0] == ms:
        return last[1]
    at = datetime.fromtimestamp(ms // 1000, UTC).replace(microsecond=ms % 1000 * 1000)
    text = at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    _last_now = (ms, text)
    return text


_ENCODER = msgspec.json.Encoder()
_BASELINE = msgspec.json.Decoder(Baseline)
_MESSAGE = msgspec.json.Decoder(ChatMessage)

_BASELINE_CACHE = 64
"""Decoded baselines kept per store: a runtime has few (one per memory-block change)."""


def baseline_hash(body: bytes) -> str:
    """The key of a stored baseline: the SHA-256 of its encoded bytes, in hex."""
    return hashlib.sha256(body).hexdigest()


class SessionStore:
    """Sessions in one SQLite file: create, open, append, compact, list, read back.

    Every method runs in one transaction and commits durably before it returns;
    :meth:`run_batch` runs many operations in one. The connection is opened with
    ``check_same_thread=False`` so the store may be built on one thread and used on another, but
    one thread owns the writes: the :class:`StoreActor`'s. A lock still serialises calls, so an
    occasional read from another thread (a REPL) cannot interleave with a write's transaction.
    Other processes (``loopd sessions``) should open their own store; WAL lets them read while
    the runtime writes.

    Before every write the store checks that its path still names the file it opened: a file
    removed or replaced under it raises :class:`StoreFileReplaced` instead of writing to a file
    nobody will read again.

    Session ids are only ever SQL values (parameters), never part of a statement or a path, so
    any text is safe to look up. Ids of new sessions are checked with
    :func:`~messages.ids.check_session_id`.
    """

    # Class defaults, so a subclass that opens its connection its own way (a read-only view)
    # still has them: the file's identity (checked before writes) and the decoded baselines.
    _identity: tuple[int, int] | None = None
    _baselines: OrderedDict[str, Baseline] | None = None
    _last_written: tuple[Baseline, str, bytes] | None = None

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
                    " ('sessions', 'messages', 'baselines')"
                ).fetchall()
                if known:
                    raise StoreError(
                        None, f"{self.path} holds tables that are not a loopd store: {known}"
                    )
                conn.execute(_BASELINES)
                conn.execute(_SESSIONS.format(name="sessions"))
                conn.execute(_MESSAGES)
            elif version == 1:
                self._migrate_from_1(conn)  # builds the version 3 table
            elif version == 2:
                log.info("store %s: migrating schema version 2 to %d", self.path, SCHEMA_VERSION)
                conn.execute(
                    "ALTER TABLE sessions ADD COLUMN agent TEXT NOT NULL DEFAULT 'default'"
                )
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
        conn.execute(_SESSIONS.format(name="sessions_v2"))
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

    @contextmanager
    def _transaction(self, session: str, action: str, *, write: bool) -> Iterator[sqlite3.Cursor]:
        """One transaction; any SQLite error becomes a StoreError naming session and action."""
        with self._lock:
            conn = self._connection(session, action)
            if write:
                self.check_file()
            try:
                # Writes take the write lock up front, so a read-then-write cannot race another
                # process; reads get one consistent snapshot across their statements.
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    yield conn.cursor()
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise StoreError(session, f"cannot {action}: {exc}") from exc

    def _connection(self, session: str | None, action: str) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(session, f"cannot {action}: the store is closed")
        return self._conn

    def run_batch(
        self, jobs: Sequence[tuple[str, Callable[[sqlite3.Cursor], _T]]]
    ) -> list[_T | Exception]:
        """Run every job of ``jobs`` (``(session, job)`` pairs) in one transaction; each job's
        result or the exception it raised, in order, once the COMMIT is on disk.

        Each job runs in a savepoint of its own: one that fails is rolled back alone and the
        others commit. If the transaction itself fails (the COMMIT, or an error that aborts the
        whole transaction), every job is run again alone, in its own transaction, so each gets
        the answer it would have had by itself.
        """
        with self._lock:
            try:
                conn = self._connection(None, "write")
                self.check_file()
                conn.execute("BEGIN IMMEDIATE")
            except StoreError as exc:
                return [exc for _ in jobs]
            except sqlite3.Error as exc:
                return [StoreError(session, f"cannot write: {exc}") for session, _ in jobs]
            results: list[_T | Exception] = []
            try:
                if len(jobs) == 1:
                    # Alone in its transaction, a job needs no savepoint: if it fails, the
                    # transaction is rolled back instead, with the same answer.
                    session, job = jobs[0]
                    try:
                        results.append(job(conn.cursor()))
                    except Exception as exc:
                        conn.execute("ROLLBACK")
                        if isinstance(exc, sqlite3.Error):
                            return [StoreError(session, f"cannot write: {exc}")]
                        return [exc]
                else:
                    for session, job in jobs:
                        results.append(self._savepoint(conn, session, job))
                conn.execute("COMMIT")
                return results
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                log.warning("store %s: a batch of %d failed: %s", self.path, len(jobs), exc)
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return [self._alone(session, job) for session, job in jobs]

    @staticmethod
    def _savepoint(
        conn: sqlite3.Connection, session: str, job: Callable[[sqlite3.Cursor], _T]
    ) -> _T | Exception:
        conn.execute("SAVEPOINT job")
        try:
            result = job(conn.cursor())
        except Exception as exc:
            # If the error aborted the whole transaction the savepoint is gone: this raises,
            # and run_batch falls back to one transaction per job.
            conn.execute("ROLLBACK TO job")
            conn.execute("RELEASE job")
            if isinstance(exc, sqlite3.Error):
                return StoreError(session, f"cannot write: {exc}")
            return exc
        conn.execute("RELEASE job")
        return result

    def _alone(self, session: str, job: Callable[[sqlite3.Cursor], _T]) -> _T | Exception:
        try:
            with self._transaction(session, "write", write=True) as cur:
                return job(cur)
        except Exception as exc:
            return exc

    def create(
        self, id: str, baseline: Baseline, slot: int, *, agent: str = "default"
    ) -> SessionRecord:
        """Store a new session ``id`` of profile ``agent`` with ``baseline`` on ``slot``;
        return its record.

        It starts with no messages, 0 turns, ``next_call_id`` 1 and trusted. Raises
        :class:`SessionExists` for a stored id and ``ValueError`` for an invalid one.
        """
        check_session_id(id)
        with self._transaction(id, "create", write=True) as cur:
            return self.create_in(cur, id, baseline, slot, agent=agent)

    def create_in(
        self,
        cur: sqlite3.Cursor,
        id: str,
        baseline: Baseline,
        slot: int,
        *,
        agent: str = "default",
    ) -> SessionRecord:
        """:meth:`create` inside the caller's transaction (for :meth:`run_batch`)."""
        check_session_id(id)
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
        """Store child ``id`` of ``parent`` with ``first`` as its first message; True if new.

        See :meth:`create_child_in`.
        """
        with self._transaction(id, "create the child", write=True) as cur:
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
        cur: sqlite3.Cursor,
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
        """Create child ``id`` of ``parent`` inside the caller's transaction; True if new.

        A new child is stored on ``slot`` with ``baseline``, profile ``agent``, ``untrusted``
        (its parent's flag at the spawn, or its own by then), ``first`` and then ``more`` as
        its messages (a child's first write: its first message and what its turn stored
        first), ``next_call_id`` and its first turn counted. A
        record of ``id`` that a spawn of ``parent`` created is returned as stored (False), made
        untrusted if ``untrusted`` (``first`` is not added: the turn stores it after repairing
        what was cut off). Any other record of ``id`` raises :class:`SessionTaken`, and nothing
        of it is read.
        """
        check_session_id(id)
        row = cur.execute("SELECT parent FROM sessions WHERE id = ?", (id,)).fetchone()
        if row is not None:
            if row[0] != parent:
                raise SessionTaken(id, parent)
            if untrusted:  # the flag only ever goes up, whatever the record said
                cur.execute("UPDATE sessions SET untrusted = 1 WHERE id = ?", (id,))
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
        """Read session ``id`` back: baseline, slot, live transcript and counters.

        Raises :class:`SessionNotFound` if it is not stored and :class:`StoreError` if a stored
        value cannot be read.
        """
        with self._transaction(id, "open", write=False) as cur:
            return self._record(cur, id)

    def open_in(self, cur: sqlite3.Cursor, id: str) -> SessionRecord:
        """:meth:`open` inside the caller's transaction (for :meth:`run_batch`)."""
        return self._record(cur, id)

    def open_or_create(
        self, id: str, baseline: Baseline, slot: int, *, agent: str = "default"
    ) -> tuple[SessionRecord, bool]:
        """Open ``id``, or create it with ``baseline`` on ``slot``; True when it was created.

        A stored session keeps its own baseline, slot and agent (its baseline is byte-stable
        for its life); ``baseline``, ``slot`` and ``agent`` are used only for a new one.
        """
        check_session_id(id)
        with self._transaction(id, "open or create", write=True) as cur:
            return self.open_or_create_in(cur, id, baseline, slot, agent=agent)

    def open_or_create_in(
        self,
        cur: sqlite3.Cursor,
        id: str,
        baseline: Baseline,
        slot: int,
        *,
        agent: str = "default",
    ) -> tuple[SessionRecord, bool]:
        """:meth:`open_or_create` inside the caller's transaction (for :meth:`run_batch`)."""
        check_session_id(id)
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
        """Append ``messages`` to ``id``'s history and save its counters, in one transaction.

        The messages take the next sequence numbers, in order. ``next_call_id`` may never go
        down (call ids are never reused): a lower value raises :class:`StoreError` and nothing is
        written. ``untrusted`` is sticky: once a session is untrusted it stays so.
        """
        with self._transaction(id, "append", write=True) as cur:
            self.append_in(
                cur, id, messages, turns=turns, next_call_id=next_call_id, untrusted=untrusted
            )

    def append_in(
        self,
        cur: sqlite3.Cursor,
        id: str,
        messages: Sequence[ChatMessage],
        *,
        turns: int,
        next_call_id: int,
        untrusted: bool,
    ) -> None:
        """:meth:`append` inside the caller's transaction (for :meth:`run_batch`)."""
        # The hot path of every turn: read the one counter it checks, not the baseline.
        row = cur.execute("SELECT next_call_id FROM sessions WHERE id = ?", (id,)).fetchone()
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
            "UPDATE sessions SET turns = ?, next_call_id = ?, untrusted = MAX(untrusted, ?),"
            " updated_at = ? WHERE id = ?",
            (turns, next_call_id, int(bool(untrusted)), now, id),
        )

    def compact(self, id: str, summary: ChatMessage) -> None:
        """Replace ``id``'s live history by ``summary``, in one transaction.

        Every live message is marked compacted (kept, not deleted) and ``summary`` is appended
        as the only live message. The baseline is not touched.
        """
        with self._transaction(id, "compact", write=True) as cur:
            self.compact_in(cur, id, summary)

    def compact_in(self, cur: sqlite3.Cursor, id: str, summary: ChatMessage) -> None:
        """:meth:`compact` inside the caller's transaction (for :meth:`run_batch`)."""
        if cur.execute("SELECT 1 FROM sessions WHERE id = ?", (id,)).fetchone() is None:
            raise SessionNotFound(id)
        now = _now()
        cur.execute("UPDATE messages SET compacted = 1 WHERE session = ? AND compacted = 0", (id,))
        self._insert_messages(cur, id, (summary,), now)
        cur.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", (now, id))

    def list_sessions(self) -> list[SessionInfo]:
        """Every stored session's counters, sorted by id."""
        with self._transaction("*", "list sessions", write=False) as cur:
            rows = cur.execute(
                "SELECT s.id, s.slot, s.turns, s.untrusted,"
                " (SELECT COUNT(*) FROM messages m WHERE m.session = s.id),"
                " s.created_at, s.updated_at, s.parent, s.agent FROM sessions s ORDER BY s.id"
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
        """Every stored message of ``id`` in order, compacted ones included.

        Raises :class:`SessionNotFound` if it is not stored.
        """
        with self._transaction(id, "read history", write=False) as cur:
            if self._row(cur, id) is None:
                raise SessionNotFound(id)
            rows = cur.execute(
                "SELECT seq, body, compacted, at FROM messages WHERE session = ? ORDER BY seq",
                (id,),
            ).fetchall()
        return [
            StoredMessage(
                seq=seq, message=self._decode_message(id, seq, body), compacted=bool(c), at=at
            )
            for seq, body, c, at in rows
        ]

    def children(self, id: str) -> list[str]:
        """The stored direct children of ``id``: ids ``sub-<id>-<n>``, ``n`` digits, by ``n``.

        Grandchildren (``sub-sub-<id>-<n>-<m>``) and children of other sessions whose id starts
        like ``id`` (``sub-<id>-1-2`` is a child of ``<id>-1``) are not included.
        """
        prefix = f"sub-{id}-"
        # A prefix compare, not LIKE: '_' and '%' are legal in ids and would be wildcards there.
        with self._transaction(id, "list children", write=False) as cur:
            rows = cur.execute(
                "SELECT id FROM sessions WHERE substr(id, 1, ?) = ?", (len(prefix), prefix)
            ).fetchall()
        pattern = re.compile(re.escape(prefix) + r"([0-9]+)", re.ASCII)
        found = [(m, r[0]) for r in rows if (m := pattern.fullmatch(r[0])) is not None]
        return [child for m, child in sorted(found, key=lambda f: (int(f[0][1]), f[1]))]

    def release(self, id: str) -> None:
        """Nothing to do: one runtime owns a SQLite store's home (its home lock)."""

    def close(self) -> None:
        """Close the database; later calls raise :class:`StoreError`. Safe to call twice."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> SessionStore:
        """The store itself; ``with SessionStore(path) as store:`` closes it at the end."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the store."""
        self.close()

    # Helpers; each runs inside a transaction opened by a public method.

    @staticmethod
    def _row(cur: sqlite3.Cursor, id: str) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = cur.execute(
            "SELECT s.baseline, b.body, s.slot, s.turns, s.untrusted, s.next_call_id, s.parent,"
            " s.agent"
            " FROM sessions s LEFT JOIN baselines b ON b.hash = s.baseline WHERE s.id = ?",
            (id,),
        ).fetchone()
        return row

    def _baseline_row(self, baseline: Baseline) -> tuple[str, bytes]:
        """``baseline``'s key and encoded body. The Context hands every new session of a
        profile the same Baseline object while memory is unchanged, so the last one's are
        kept, by identity: no encoding and hashing per child. (The row is still inserted each
        time: a rolled-back transaction may have taken it away.)"""
        last = self._last_written
        if last is not None and last[0] is baseline:
            return last[1], last[2]
        body = _ENCODER.encode(baseline)
        key = baseline_hash(body)
        self._last_written = (baseline, key, body)
        return key, body

    def _insert(
        self,
        cur: sqlite3.Cursor,
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
        key, body = self._baseline_row(baseline)
        cur.execute("INSERT OR IGNORE INTO baselines (hash, body) VALUES (?, ?)", (key, body))
        cur.execute(
            "INSERT INTO sessions (id, baseline, parent, slot, turns, next_call_id, untrusted,"
            " created_at, updated_at, agent) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (id, key, parent, slot, turns, next_call_id, int(untrusted), now, now, agent),
        )

    @staticmethod
    def _insert_messages(
        cur: sqlite3.Cursor,
        id: str,
        messages: Sequence[ChatMessage],
        at: str,
        *,
        last: int | None = None,
    ) -> None:
        if last is None:
            (last,) = cur.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM messages WHERE session = ?", (id,)
            ).fetchone()
        assert last is not None
        cur.executemany(
            "INSERT INTO messages (session, seq, body, compacted, at) VALUES (?, ?, ?, 0, ?)",
            [(id, last + i, _ENCODER.encode(m), at) for i, m in enumerate(messages, 1)],
        )

    def _baseline(self, id: str, key: str, body: Any) -> Baseline:
        cache = self._baselines
        if cache is None:
            cache = self._baselines = OrderedDict()
        cached = cache.get(key)
        if cached is not None:
            cache.move_to_end(key)
            return cached
        if body is None:
            raise StoreError(id, f"cannot read the stored baseline: no baseline {key} is stored")
        try:
            baseline = _BASELINE.decode(body)
        except (msgspec.DecodeError, TypeError) as exc:
            raise StoreError(id, f"cannot read the stored baseline: {exc}") from exc
        cache[key] = baseline
        if len(cache) > _BASELINE_CACHE:
            cache.popitem(last=False)
        return baseline

    def _record(self, cur: sqlite3.Cursor, id: str) -> SessionRecord:
        row = self._row(cur, id)
        if row is None:
            raise SessionNotFound(id)
        key, body, slot, turns, untrusted, next_call_id, parent, agent = row
        baseline = self._baseline(id, key, body)
        live = cur.execute(
            "SELECT seq, body FROM messages WHERE session = ? AND compacted = 0 ORDER BY seq",
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
        # A row that does not decode is an error, never skipped: a silently shorter transcript
        # would send the model a different conversation than the one it had.
        try:
            return _MESSAGE.decode(body)
        except (msgspec.DecodeError, TypeError) as exc:
            raise StoreError(id, f"cannot read stored message seq {seq}: {exc}") from exc
