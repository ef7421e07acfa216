"""The session store: every session's baseline, transcript and counters, in one SQLite file.

:class:`SessionStore` is a plain class over stdlib ``sqlite3``; :class:`StoreActor` owns one and
answers the protocol's store requests (:class:`~messages.OpenSession`,
:class:`~messages.AppendMessages`, :class:`~messages.CompactHistory`) with reply messages.

Durability: the database runs in WAL mode with ``synchronous=FULL``, so every commit is on disk
when the call returns. A session actor sends its next model request only after the store has
answered ``Appended``, so a crash loses at most the request in flight (SPEC 7).

Nothing is ever deleted: compaction marks the old messages ``compacted`` and appends the summary
as the new live history, so ``history()`` can always show what a session once said.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pykka

from actors.directory import Directory
from messages.chat import Baseline, ChatMessage
from messages.ids import check_session_id
from messages.runtime import (
    Appended,
    AppendMessages,
    CompactHistory,
    OpenSession,
    SessionLoaded,
    SessionRecord,
    StoreFailed,
)

__all__ = [
    "DB_NAME",
    "SCHEMA_VERSION",
    "Exists",
    "SessionExists",
    "SessionInfo",
    "SessionNotFound",
    "SessionStore",
    "StoreActor",
    "StoreError",
    "StoredMessage",
]

log = logging.getLogger(__name__)

DB_NAME = "loopd.db"
"""The store's file name under ``home``: ``<home>/loopd.db``."""

SCHEMA_VERSION = 1
"""The schema this module writes, kept in ``PRAGMA user_version``."""

BUSY_TIMEOUT_MS = 10_000
"""How long a statement waits for another process's lock (a CLI reader, say) before failing."""

_SCHEMA = """
CREATE TABLE sessions (
    id           TEXT PRIMARY KEY NOT NULL,
    baseline     BLOB NOT NULL,
    slot         INTEGER NOT NULL,
    turns        INTEGER NOT NULL DEFAULT 0,
    next_call_id INTEGER NOT NULL DEFAULT 1 CHECK (next_call_id >= 1),
    untrusted    INTEGER NOT NULL DEFAULT 0 CHECK (untrusted IN (0, 1)),
    created_at   TEXT NOT NULL,
    updated_at   TEXT NOT NULL
);
CREATE TABLE messages (
    session   TEXT NOT NULL REFERENCES sessions(id),
    seq       INTEGER NOT NULL CHECK (seq >= 1),
    body      BLOB NOT NULL,
    compacted INTEGER NOT NULL DEFAULT 0 CHECK (compacted IN (0, 1)),
    at        TEXT NOT NULL,
    PRIMARY KEY (session, seq)
);
"""


class StoreError(Exception):
    """A store operation failed; the message names the session (when there is one) and why.

    ``session`` is the session concerned (or None for the store as a whole) and ``detail`` what
    went wrong.
    """

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


class StoredMessage(msgspec.Struct, frozen=True):
    """One stored message of :meth:`SessionStore.history`, with its sequence number and time.

    ``compacted`` is True for a message that a compaction summary has replaced.
    """

    seq: int
    message: ChatMessage
    compacted: bool
    at: str


def _now() -> str:
    """The current time, RFC 3339 UTC with milliseconds (text sorts in time order)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


_ENCODER = msgspec.json.Encoder()
_BASELINE = msgspec.json.Decoder(Baseline)
_MESSAGE = msgspec.json.Decoder(ChatMessage)


class SessionStore:
    """Sessions in one SQLite file: create, open, append, compact, list, read back.

    Every method runs in one transaction and commits durably before it returns. The connection
    is opened with ``check_same_thread=False`` so the store may be built on one thread and used
    on another, but one thread owns the writes: the :class:`StoreActor`'s. A lock still
    serialises calls, so an occasional read from another thread (a REPL) cannot interleave with a
    write's transaction. Other processes (``loopd sessions``) should open their own store; WAL
    lets them read while the runtime writes.

    Session ids are only ever SQL values (parameters), never part of a statement or a path, so
    any text is safe to look up. Ids of new sessions are checked with
    :func:`~messages.ids.check_session_id`.
    """

    def __init__(self, path: str | Path) -> None:
        """Open (and if need be create) the store at ``path``, the database file itself.

        Creates missing parent directories. Raises :class:`StoreError` if the file is not a
        loopd store or was written by a newer schema.
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
        except BaseException as exc:
            conn.close()
            if isinstance(exc, sqlite3.Error):
                raise StoreError(None, f"cannot open the store at {self.path}: {exc}") from exc
            raise
        self._conn = conn

    def _configure(self, conn: sqlite3.Connection) -> None:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
        if str(mode).lower() != "wal":
            # Some file systems (network mounts) refuse WAL; the store still works, slower.
            log.warning("store %s: journal_mode is %s, not wal", self.path, mode)
        # FULL: a commit is fsynced before it returns, so "appended" means durable.
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")

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
                    "SELECT name FROM sqlite_master WHERE name IN ('sessions', 'messages')"
                ).fetchall()
                if known:
                    raise StoreError(
                        None, f"{self.path} holds tables that are not a loopd store: {known}"
                    )
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    @contextmanager
    def _transaction(self, session: str, action: str, *, write: bool) -> Iterator[sqlite3.Cursor]:
        """One transaction; any SQLite error becomes a StoreError naming session and action."""
        with self._lock:
            if self._conn is None:
                raise StoreError(session, f"cannot {action}: the store is closed")
            conn = self._conn
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

    def create(self, id: str, baseline: Baseline, slot: int) -> SessionRecord:
        """Store a new session ``id`` with ``baseline`` on ``slot``; return its record.

        It starts with no messages, 0 turns, ``next_call_id`` 1 and trusted. Raises
        :class:`SessionExists` for a stored id and ``ValueError`` for an invalid one.
        """
        check_session_id(id)
        with self._transaction(id, "create", write=True) as cur:
            if self._row(cur, id) is not None:
                raise SessionExists(id)
            self._insert(cur, id, baseline, slot)
            return self._record(cur, id)

    def open(self, id: str) -> SessionRecord:
        """Read session ``id`` back: baseline, slot, live transcript and counters.

        Raises :class:`SessionNotFound` if it is not stored and :class:`StoreError` if a stored
        value cannot be read.
        """
        with self._transaction(id, "open", write=False) as cur:
            return self._record(cur, id)

    def open_or_create(self, id: str, baseline: Baseline, slot: int) -> tuple[SessionRecord, bool]:
        """Open ``id``, or create it with ``baseline`` on ``slot``; True when it was created.

        A stored session keeps its own baseline and slot (its baseline is byte-stable for its
        life); ``baseline`` and ``slot`` are used only for a new one.
        """
        check_session_id(id)
        with self._transaction(id, "open or create", write=True) as cur:
            created = self._row(cur, id) is None
            if created:
                self._insert(cur, id, baseline, slot)
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
            if cur.execute("SELECT 1 FROM sessions WHERE id = ?", (id,)).fetchone() is None:
                raise SessionNotFound(id)
            now = _now()
            cur.execute(
                "UPDATE messages SET compacted = 1 WHERE session = ? AND compacted = 0", (id,)
            )
            self._insert_messages(cur, id, (summary,), now)
            cur.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", (now, id))

    def list_sessions(self) -> list[SessionInfo]:
        """Every stored session's counters, sorted by id."""
        with self._transaction("*", "list sessions", write=False) as cur:
            rows = cur.execute(
                "SELECT s.id, s.slot, s.turns, s.untrusted,"
                " (SELECT COUNT(*) FROM messages m WHERE m.session = s.id),"
                " s.created_at, s.updated_at FROM sessions s ORDER BY s.id"
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
            "SELECT baseline, slot, turns, untrusted, next_call_id FROM sessions WHERE id = ?",
            (id,),
        ).fetchone()
        return row

    @staticmethod
    def _insert(cur: sqlite3.Cursor, id: str, baseline: Baseline, slot: int) -> None:
        now = _now()
        cur.execute(
            "INSERT INTO sessions (id, baseline, slot, turns, next_call_id, untrusted,"
            " created_at, updated_at) VALUES (?, ?, ?, 0, 1, 0, ?, ?)",
            (id, _ENCODER.encode(baseline), slot, now, now),
        )

    @staticmethod
    def _insert_messages(
        cur: sqlite3.Cursor, id: str, messages: Sequence[ChatMessage], at: str
    ) -> None:
        (last,) = cur.execute(
            "SELECT COALESCE(MAX(seq), 0) FROM messages WHERE session = ?", (id,)
        ).fetchone()
        cur.executemany(
            "INSERT INTO messages (session, seq, body, compacted, at) VALUES (?, ?, ?, 0, ?)",
            [(id, last + i, _ENCODER.encode(m), at) for i, m in enumerate(messages, 1)],
        )

    def _record(self, cur: sqlite3.Cursor, id: str) -> SessionRecord:
        row = self._row(cur, id)
        if row is None:
            raise SessionNotFound(id)
        body, slot, turns, untrusted, next_call_id = row
        try:
            baseline = _BASELINE.decode(body)
        except (msgspec.DecodeError, TypeError) as exc:
            raise StoreError(id, f"cannot read the stored baseline: {exc}") from exc
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
        )

    @staticmethod
    def _decode_message(id: str, seq: int, body: Any) -> ChatMessage:
        # A row that does not decode is an error, never skipped: a silently shorter transcript
        # would send the model a different conversation than the one it had.
        try:
            return _MESSAGE.decode(body)
        except (msgspec.DecodeError, TypeError) as exc:
            raise StoreError(id, f"cannot read stored message seq {seq}: {exc}") from exc


class StoreActor(pykka.ThreadingActor):
    """The actor that owns the :class:`SessionStore` and does all of its (blocking) disk work.

    It answers each request at the request's ``reply_to`` address in ``directory``:
    ``OpenSession`` with ``SessionLoaded`` or ``StoreFailed`` (``exists=True`` for a
    ``create_only`` open of a stored id), ``AppendMessages`` and ``CompactHistory`` with
    ``Appended`` or ``StoreFailed`` carrying the ``request_id``. Every request is answered, so
    no waiter hangs: any error becomes ``StoreFailed`` and the actor keeps serving. Whoever
    starts it registers its ref at :data:`~actors.directory.STORE`.
    """

    def __init__(self, path: str | Path, directory: Directory) -> None:
        """``path`` is the database file (``<home>/loopd.db``); ``directory`` finds replies."""
        super().__init__()
        self.path = Path(path)
        self.directory = directory
        self.store: SessionStore | None = None
        self.open_error: str | None = None

    def on_start(self) -> None:
        """Open the store on the actor's own thread, which then owns its connection."""
        try:
            self.store = SessionStore(self.path)
        except Exception as exc:
            # Stay up and answer StoreFailed: a dead actor would leave every requester hanging.
            self.open_error = str(exc)
            log.error("store actor could not open %s: %s", self.path, exc)

    def on_stop(self) -> None:
        """Close the store; every committed request is already durable."""
        if self.store is not None:
            self.store.close()
            self.store = None

    def on_receive(self, message: Any) -> Any:
        """Handle one store request and tell its answer to ``message.reply_to``."""
        if isinstance(message, OpenSession):
            reply: Any = self._open(message)
        elif isinstance(message, AppendMessages | CompactHistory):
            reply = self._write(message)
        else:
            log.warning("store actor ignores unknown message %s", type(message).__name__)
            return None
        if not self.directory.tell(message.reply_to, reply):
            log.debug("store reply to %s was not delivered", message.reply_to)
        return None

    def _store(self) -> SessionStore:
        if self.store is None:
            raise StoreError(None, self.open_error or "the store is closed")
        return self.store

    def _open(self, msg: OpenSession) -> SessionLoaded | StoreFailed:
        rid = msg.request_id
        try:
            store = self._store()
            if msg.baseline is None:
                return SessionLoaded(store.open(msg.session), False, rid)
            if msg.create_only:
                return SessionLoaded(store.create(msg.session, msg.baseline, msg.slot), True, rid)
            record, created = store.open_or_create(msg.session, msg.baseline, msg.slot)
            return SessionLoaded(record, created, rid)
        except Exception as exc:
            failed = self._failed(msg.session, exc, rid, exists=isinstance(exc, SessionExists))
            if isinstance(exc, SessionNotFound):
                failed = msgspec.structs.replace(failed, missing=True)
            return failed

    def _write(self, msg: AppendMessages | CompactHistory) -> Appended | StoreFailed:
        try:
            store = self._store()
            if isinstance(msg, AppendMessages):
                store.append(
                    msg.session,
                    msg.messages,
                    turns=msg.turns,
                    next_call_id=msg.next_call_id,
                    untrusted=msg.untrusted,
                )
            else:
                store.compact(msg.session, msg.summary)
            return Appended(msg.session, msg.request_id)
        except Exception as exc:
            return self._failed(msg.session, exc, msg.request_id)

    @staticmethod
    def _failed(
        session: str, exc: Exception, request_id: int, *, exists: bool = False
    ) -> StoreFailed:
        if isinstance(exc, StoreError):
            log.info("store request failed: %s", exc)
        else:
            # Not a store condition we expected: keep the traceback for the operator.
            log.exception("store request for session %r failed", session)
        return StoreFailed(session, str(exc), exists=exists, request_id=request_id)
