"""The session logic of both SQL stores, written once over a small :class:`Dialect`.

:class:`SqlSessionStore` holds what a session store does whatever the database: create, create a
child, open, append, compact, list, read back, and run a batch of jobs in one transaction with a
savepoint each. :class:`~actors.stores.sqlite.SessionStore` (one SQLite file) and
:class:`~actors.stores.postgres.PgSessionStore` (``[store] url``) add only what is their own:
opening the connection, migrating their schema, the file check before a write (SQLite) and the
per-session advisory locks (PostgreSQL).

A baseline is stored once, in ``baselines`` keyed by the SHA-256 of its bytes; sessions refer to
it. A child's record names the ``parent`` whose spawn created it, so a record made any other way
is never taken for a child. Nothing is ever deleted: compaction marks the old messages
``compacted`` and appends the summary as the new live history, so ``history()`` can always show
what a session once said.

Session ids are only ever SQL values (parameters), never part of a statement or a path, so any
text is safe to look up. Ids of new sessions are checked with
:func:`~messages.ids.check_session_id`.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Self, TypeVar

import msgspec

from actors.stores.a2a_rows import A2aTaskRows
from actors.stores.approval_rows import ApprovalRows
from actors.stores.background_rows import BackgroundRows
from actors.stores.base import (
    SessionExists,
    SessionInfo,
    SessionNotFound,
    SessionTaken,
    StoredMessage,
    StoreError,
)
from actors.stores.dialect import Dialect
from actors.stores.remote_rows import RemoteRows
from actors.stores.turn_rows import TurnRows
from messages.chat import Baseline, ChatMessage
from messages.ids import check_session_id
from messages.runtime import SessionRecord

__all__ = ["Dialect", "SqlSessionStore", "baseline_hash", "now"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

_last_now: tuple[int, str] = (-1, "")


def now() -> str:
    """The current time, RFC 3339 UTC with milliseconds and ``Z`` (text sorts in time order)."""
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


def baseline_hash(body: bytes) -> str:
    """The key of a stored baseline: the SHA-256 of its encoded bytes, in hex."""
    return hashlib.sha256(body).hexdigest()


_ENCODER = msgspec.json.Encoder()
_BASELINE = msgspec.json.Decoder(Baseline)
_MESSAGE = msgspec.json.Decoder(ChatMessage)

_BASELINE_CACHE = 64
"""Decoded baselines kept per store: a runtime has few (one per memory-block change)."""


class SqlSessionStore(BackgroundRows, ApprovalRows, TurnRows, A2aTaskRows, RemoteRows):
    """Sessions in a SQL database: create, open, append, compact, list, read back.

    Every method runs in one transaction and commits durably before it returns;
    :meth:`run_batch` runs many operations in one. One thread owns the writes (the store
    actor's); a lock still serialises calls, so an occasional read from another thread (a REPL)
    cannot interleave with a write's transaction.

    A subclass names its :attr:`dialect` and opens the connection (:meth:`_connection`); it may
    check something before each write (:meth:`_before_write`) and hold a session it opens or
    creates (:meth:`_hold`). The ``*_in`` methods run inside a transaction :meth:`run_batch`
    opened; their ``cur`` is the driver's cursor.
    """

    dialect: Dialect
    """The database's dialect (a class attribute of each store). The approvals table's
    methods come from :class:`~actors.stores.approval_rows.ApprovalRows`."""

    _now = staticmethod(now)

    # Class defaults, so a subclass that opens its connection its own way (a read-only view)
    # still has them: the connection, the decoded baselines, the last baseline written.
    _conn: Any = None
    _baselines: OrderedDict[str, Baseline] | None = None
    _last_written: tuple[Baseline, str, bytes] | None = None
    _lock: threading.RLock

    # --- what a subclass provides ---

    def _connection(self, session: str | None, action: str) -> Any:
        """The open connection; :class:`StoreError` if there is none (closed, unreachable)."""
        if self._conn is None:
            raise StoreError(session, f"cannot {action}: the store is closed")
        return self._conn

    def _before_write(self) -> None:
        """Raise :class:`StoreError` if a write must not go ahead (nothing, by default)."""

    def _hold(self, cur: Any, id: str) -> None:
        """This store now runs ``id``: hold it (nothing, by default)."""

    # --- transactions ---

    def _begin(self, session: str | None, action: str, *, write: bool) -> Any:
        """A connection inside a new transaction; a failure is a :class:`StoreError`."""
        conn = self._connection(session, action)
        if write:
            self._before_write()
        try:
            conn.execute(self.dialect.begin_write if write else "BEGIN")
        except self.dialect.error as exc:
            raise self.dialect.failure(session, action, exc) from exc
        return conn

    def _rollback(self, conn: Any) -> None:
        if self.dialect.in_transaction(conn):
            # A lost connection took its transaction with it: nothing is left to roll back.
            with contextlib.suppress(*self.dialect.lost):
                conn.execute("ROLLBACK")

    @contextmanager
    def _transaction(self, session: str, action: str, *, write: bool) -> Iterator[Any]:
        """One transaction; a database error becomes a StoreError naming session and action."""
        with self._lock:
            # Writes take the write lock up front where the database has one, so a
            # read-then-write cannot race another process; reads get one snapshot.
            conn = self._begin(session, action, write=write)
            cur = conn.cursor()
            try:
                yield cur
                conn.execute("COMMIT")
            except BaseException as exc:
                try:
                    self._rollback(conn)
                except self.dialect.error as rollback_exc:
                    log.warning("store: cannot roll back: %s", rollback_exc)
                if isinstance(exc, self.dialect.error):
                    raise self.dialect.failure(session, action, exc) from exc
                raise
            finally:
                cur.close()

    def run_batch(self, jobs: Sequence[tuple[str, Callable[[Any], _T]]]) -> list[_T | Exception]:
        """Run every job of ``jobs`` (``(session, job)`` pairs) in one transaction; each job's
        result or the exception it raised, in order, once the COMMIT is durable.

        Each job runs in a savepoint of its own: one that fails is rolled back alone and the
        others commit. If the transaction itself fails (the COMMIT, a lost connection, or an
        error that aborts the whole transaction), every job is run again alone, in its own
        transaction, so each gets the answer it would have had by itself.
        """
        d = self.dialect
        with self._lock:
            try:
                conn = self._begin(None, "write", write=True)
            except StoreError as exc:
                return [_for_session(session, exc) for session, _ in jobs]
            results: list[_T | Exception] = []
            cur = conn.cursor()
            try:
                if len(jobs) == 1:
                    # Alone in its transaction, a job needs no savepoint: if it fails, the
                    # transaction is rolled back instead, with the same answer.
                    session, job = jobs[0]
                    try:
                        results.append(job(cur))
                    except d.lost:
                        raise  # the connection is gone: run it again, connected anew
                    except Exception as exc:
                        self._rollback(conn)
                        return [_failure(d, session, exc)]
                else:
                    for session, job in jobs:
                        results.append(self._savepoint(conn, cur, session, job))
                conn.execute("COMMIT")
                return results
            except d.error as exc:
                self._rollback(conn)
                log.warning("store: a batch of %d failed: %s", len(jobs), exc)
            except BaseException:
                self._rollback(conn)
                raise
            finally:
                cur.close()
            return [self._alone(session, job) for session, job in jobs]

    def _savepoint(
        self, conn: Any, cur: Any, session: str, job: Callable[[Any], _T]
    ) -> _T | Exception:
        conn.execute("SAVEPOINT job")
        try:
            result = job(cur)
        except self.dialect.lost:
            raise  # the connection is gone: the whole batch runs again, alone
        except Exception as exc:
            # If the error aborted the whole transaction the savepoint is gone: this raises,
            # and run_batch falls back to one transaction per job.
            conn.execute("ROLLBACK TO SAVEPOINT job")
            conn.execute("RELEASE SAVEPOINT job")
            return _failure(self.dialect, session, exc)
        conn.execute("RELEASE SAVEPOINT job")
        return result

    def _alone(self, session: str, job: Callable[[Any], _T]) -> _T | Exception:
        try:
            with self._transaction(session, "write", write=True) as cur:
                return job(cur)
        except Exception as exc:
            return exc

    # --- the calls ---

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
        self, cur: Any, id: str, baseline: Baseline, slot: int, *, agent: str = "default"
    ) -> SessionRecord:
        """:meth:`create` inside the caller's transaction (for :meth:`run_batch`)."""
        check_session_id(id)
        self._hold(cur, id)
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
        running: bool = True,
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
                running=running,
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
        running: bool = True,
    ) -> tuple[SessionRecord, bool]:
        """Create child ``id`` of ``parent`` inside the caller's transaction; True if new.

        A new child is stored on ``slot`` with ``baseline``, profile ``agent``, ``untrusted``
        (its parent's flag at the spawn, or its own by then), ``first`` and then ``more`` as
        its messages (a child's first write: its first message and what its turn stored
        first), ``next_call_id`` and its first turn counted. A record of ``id`` that a spawn of
        ``parent`` created is returned as stored (False), made untrusted if ``untrusted``
        (``first`` is not added: the turn stores it after repairing what was cut off). Any
        other record of ``id`` raises :class:`SessionTaken`, and nothing of it is read.
        """
        check_session_id(id)
        self._hold(cur, id)
        q = self.dialect.q
        row = cur.execute(q.parent, (id,)).fetchone()
        if row is not None:
            if row[0] != parent:
                raise SessionTaken(id, parent)
            if untrusted:  # the flag only ever goes up, whatever the record said
                cur.execute(q.flag_untrusted, (id,))
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
        self._insert_messages(cur, id, transcript, now(), last=0)
        if running:  # a child's first write is its turn's (unless it also ends it)
            cur.execute(q.running, (True, id))
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
        """Read session ``id`` back: baseline, slot, live transcript and counters (without
        holding it).

        Raises :class:`SessionNotFound` if it is not stored and :class:`StoreError` if a stored
        value cannot be read.
        """
        with self._transaction(id, "open", write=False) as cur:
            return self._record(cur, id)

    def open_in(self, cur: Any, id: str) -> SessionRecord:
        """Hold and read ``id`` inside the caller's transaction (for :meth:`run_batch`)."""
        self._hold(cur, id)
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
        cur: Any,
        id: str,
        baseline: Baseline,
        slot: int,
        *,
        agent: str = "default",
        first: ChatMessage | None = None,
    ) -> tuple[SessionRecord, bool]:
        """:meth:`open_or_create` inside the caller's transaction (for :meth:`run_batch`); a
        session created with ``first`` holds it as its first message, its first turn counted and
        running."""
        check_session_id(id)
        self._hold(cur, id)
        if self._row(cur, id) is not None:
            return self._record(cur, id), False
        self._insert(cur, id, baseline, slot, turns=0 if first is None else 1, agent=agent)
        if first is None:
            return self._record(cur, id), True
        self._insert_messages(cur, id, (first,), now(), last=0)
        cur.execute(self.dialect.q.running, (True, id))  # its first turn runs from here
        return SessionRecord(id, baseline, slot, (first,), 1, 1, False, agent=agent), True

    def append(
        self,
        id: str,
        messages: Sequence[ChatMessage],
        *,
        turns: int,
        next_call_id: int,
        untrusted: bool,
        running: bool | None = None,
    ) -> None:
        """Append ``messages`` to ``id``'s history and save its counters, in one transaction.

        The messages take the next sequence numbers, in order. ``next_call_id`` may never go
        down (call ids are never reused): a lower value raises :class:`StoreError` and nothing is
        written. ``untrusted`` is sticky: once a session is untrusted it stays so.
        """
        with self._transaction(id, "append", write=True) as cur:
            self.append_in(
                cur,
                id,
                messages,
                turns=turns,
                next_call_id=next_call_id,
                untrusted=untrusted,
                running=running,
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
        reports: Sequence[str] = (),
        running: bool | None = None,
    ) -> None:
        """:meth:`append` inside the caller's transaction (for :meth:`run_batch`).

        ``reports`` names background children whose reports ``messages`` deliver: their rows
        go in the same transaction, so each report is delivered once. ``running`` True marks
        a turn of ``id`` running from this write on, False ended with it (None: unchanged)."""
        q = self.dialect.q
        # The hot path of every turn: read the one counter it checks, not the baseline.
        row = cur.execute(q.next_call_id, (id,)).fetchone()
        if row is None:
            raise SessionNotFound(id)
        stored_next = row[0]
        if next_call_id < 1 or next_call_id < stored_next:
            raise StoreError(
                id,
                f"cannot append: next_call_id {next_call_id} is below the stored "
                f"{stored_next} (call ids are never reused)",
            )
        at = now()
        self._insert_messages(cur, id, messages, at)
        self.answered_in(cur, id, messages)  # a decision goes from its row to its result
        cur.execute(q.counters, (turns, next_call_id, bool(untrusted), at, id))
        for child in reports:  # delivered with these messages: in this transcript, not stored
            cur.execute(q.drop_background, (child,))
        if running is not None:
            cur.execute(q.running, (bool(running), id))

    def compact(self, id: str, summary: ChatMessage) -> None:
        """Replace ``id``'s live history by ``summary``, in one transaction.

        Every live message is marked compacted (kept, not deleted) and ``summary`` is appended
        as the only live message. The baseline is not touched.
        """
        with self._transaction(id, "compact", write=True) as cur:
            self.compact_in(cur, id, summary)

    def compact_in(self, cur: Any, id: str, summary: ChatMessage) -> None:
        """:meth:`compact` inside the caller's transaction (for :meth:`run_batch`)."""
        q = self.dialect.q
        if cur.execute(q.exists, (id,)).fetchone() is None:
            raise SessionNotFound(id)
        at = now()
        cur.execute(q.compact, (id,))
        self._insert_messages(cur, id, (summary,), at)
        cur.execute(q.touch, (at, id))

    def list_sessions(self) -> list[SessionInfo]:
        """Every stored session's counters, sorted by id."""
        with self._transaction("*", "list sessions", write=False) as cur:
            rows = cur.execute(self.dialect.q.list).fetchall()
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
            rows = cur.execute(self.dialect.q.history, (id,)).fetchall()
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
            rows = cur.execute(self.dialect.q.children, (len(prefix), prefix)).fetchall()
        pattern = re.compile(re.escape(prefix) + r"([0-9]+)", re.ASCII)
        found = [(m, r[0]) for r in rows if (m := pattern.fullmatch(r[0])) is not None]
        return [child for m, child in sorted(found, key=lambda f: (int(f[0][1]), f[1]))]

    def release(self, id: str) -> None:
        """Let another process run ``id`` (nothing to do where one runtime owns the store)."""

    def close(self) -> None:
        """Close the connection; later calls raise :class:`StoreError`. Safe to call twice."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Self:
        """The store itself; ``with Store(...) as store:`` closes it at the end."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the store."""
        self.close()

    # --- helpers; each runs inside a transaction opened by a public method ---

    def _row(self, cur: Any, id: str) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = cur.execute(self.dialect.q.row, (id,)).fetchone()
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
        q = self.dialect.q
        at = now()
        key, body = self._baseline_row(baseline)
        cur.execute(q.baseline, (key, body))
        cur.execute(
            q.session, (id, key, parent, slot, turns, next_call_id, bool(untrusted), at, at, agent)
        )

    def _insert_messages(
        self,
        cur: Any,
        id: str,
        messages: Sequence[ChatMessage],
        at: str,
        *,
        last: int | None = None,
    ) -> None:
        q = self.dialect.q
        if last is None:
            (last,) = cur.execute(q.last_seq, (id,)).fetchone()
        assert last is not None
        cur.executemany(
            q.message, [(id, last + i, _ENCODER.encode(m), at) for i, m in enumerate(messages, 1)]
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

    def _record(self, cur: Any, id: str) -> SessionRecord:
        row = self._row(cur, id)
        if row is None:
            raise SessionNotFound(id)
        key, body, slot, turns, untrusted, next_call_id, parent, agent = row
        baseline = self._baseline(id, key, body)
        live = cur.execute(self.dialect.q.live, (id,)).fetchall()
        transcript = tuple(self._decode_message(id, seq, b) for seq, b in live)
        return SessionRecord(
            id=id,
            baseline=baseline,
            slot=slot,
            transcript=transcript,
            turns=turns,
            next_call_id=next_call_id,
            untrusted=bool(untrusted),
            parent=parent,
            agent=agent,
            decided=self.decided_in(cur, id, transcript),
        )

    @staticmethod
    def _decode_message(id: str, seq: int, body: Any) -> ChatMessage:
        # A row that does not decode is an error, never skipped: a silently shorter transcript
        # would send the model a different conversation than the one it had.
        try:
            return _MESSAGE.decode(body)
        except (msgspec.DecodeError, TypeError) as exc:
            raise StoreError(id, f"cannot read stored message seq {seq}: {exc}") from exc


def _failure(dialect: Dialect, session: str, exc: Exception) -> Exception:
    """A job's error as its answer: a driver error becomes a StoreError naming the session."""
    if isinstance(exc, dialect.error):
        return dialect.failure(session, "write", exc)
    return exc


def _for_session(session: str, exc: StoreError) -> StoreError:
    """The failure of a batch that could not begin, for one of its jobs: a plain StoreError is
    told again naming the job's session; a particular one (the file replaced) as it is."""
    if type(exc) is StoreError:
        return StoreError(session, exc.detail)
    return exc
