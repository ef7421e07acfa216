"""The store actor: the one writer of a runtime's session store, whichever backend it is.

:class:`StoreActor` owns a :class:`~actors.stores.base.StoreBackend` (SQLite by default) and
answers the protocol's store requests (:class:`~messages.OpenSession`,
:class:`~messages.CreateChild`, :class:`~messages.AppendMessages`,
:class:`~messages.CompactHistory`) with reply messages.

Group commit: the actor takes every store request waiting in its inbox and writes them in one
transaction, each in a savepoint of its own (one that fails is rolled back alone), and answers
each only after the COMMIT, so an answer still means "on disk". Under load one fsync then
serves many sessions.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import msgspec
import pykka
from pykka._envelope import Envelope

from actors.dispatcher.directory import Directory
from actors.dispatcher.inbox import SimpleInbox
from actors.stores.base import (
    SessionExists,
    SessionNotFound,
    SessionTaken,
    StoreBackend,
    StoreError,
)
from actors.stores.sqlite import SessionStore
from messages.approvals import (
    ApprovalsRun,
    ApprovalStored,
    DropApprovals,
    ListApprovals,
    RecordSpent,
    SettleApproval,
    StoreApproval,
)
from messages.background import (
    BackgroundLoaded,
    BackgroundSaved,
    DropBackground,
    LoadBackground,
    SaveBackground,
)
from messages.remote import DropRemoteTask, ListRemoteTasks, RemoteTaskSaved, SaveRemoteTask
from messages.runtime import (
    Appended,
    AppendMessages,
    CompactHistory,
    CreateChild,
    OpenSession,
    ReleaseSession,
    SessionLoaded,
    StoreFailed,
)

__all__ = ["StoreActor", "StoreRequest"]

log = logging.getLogger(__name__)


StoreRequest = (
    OpenSession
    | CreateChild
    | AppendMessages
    | CompactHistory
    | SaveBackground
    | DropBackground
    | LoadBackground
    | StoreApproval
    | SettleApproval
    | ApprovalsRun
    | DropApprovals
    | RecordSpent
    | SaveRemoteTask
    | DropRemoteTask
)
"""What the store actor writes and answers (``SettleApproval``, ``ApprovalsRun``,
``DropApprovals`` and ``RecordSpent`` are not answered)."""


_REQUESTS = (
    OpenSession,
    CreateChild,
    AppendMessages,
    CompactHistory,
    SaveBackground,
    DropBackground,
    LoadBackground,
    StoreApproval,
    SettleApproval,
    ApprovalsRun,
    DropApprovals,
    RecordSpent,
    SaveRemoteTask,
    DropRemoteTask,
)
_UNANSWERED = (ApprovalsRun, DropApprovals, RecordSpent)


class _Inbox(SimpleInbox):
    """The store actor's inbox: a :class:`~actors.dispatcher.inbox.SimpleInbox` that hands over
    the run of store requests at its head, for the actor to write in one transaction, and that
    lets a teller run a request itself when the store is idle.

    ``_running`` is held while a handler of the store runs, on the store's thread or a
    teller's; ``_queued`` counts the envelopes put in the queue and not yet taken under
    ``_running``. A teller may run its request in place only with ``_running`` taken and
    nothing queued or held, so a request never overtakes one sent before it. The store's
    thread holds ``_running`` from the start until its first ``get``, so nothing runs in place
    before the store is open, and for good once it has stopped.
    """

    __slots__ = ("_count", "_queued", "_running", "_store_holds", "run_here", "run_in_place")

    run_here: Callable[[], bool]
    """Whether the calling thread may run a request in place (the actor sets it)."""

    run_in_place: Callable[[StoreRequest], None] | None
    """Writes and answers one request on the calling thread (the actor sets it)."""

    def __init__(self) -> None:
        super().__init__()
        self._running = threading.Lock()
        self._running.acquire()
        self._store_holds = True
        self._count = threading.Lock()
        self._queued = 0
        self.run_here = _never
        self.run_in_place = None

    def put(self, envelope: Envelope[Any], /) -> None:
        """Queue ``envelope``; or, for a plain store request told on a thread that may run it
        (``run_here``) while the store is idle, write and answer it here and now."""
        run = self.run_in_place
        if (
            run is not None
            and envelope.reply_to is None
            and isinstance(envelope.message, _REQUESTS)
            and self.run_here()
            and self._running.acquire(blocking=False)
        ):
            try:
                with self._count:
                    idle = self._queued == 0
                if idle and not self._held:
                    run(envelope.message)
                    return
            finally:
                self._running.release()
        with self._count:
            self._queued += 1
        self._queue.put(envelope)

    def get(self) -> Envelope[Any]:
        """The next envelope, for the store's own thread, which then holds ``_running``."""
        if self._store_holds:
            self._store_holds = False
            self._running.release()
        if self._held:  # taken from the queue (and counted off) under _running already
            self._running.acquire()
            self._store_holds = True
            return self._held.popleft()
        envelope = self._queue.get()
        self._running.acquire()
        self._store_holds = True
        with self._count:
            self._queued -= 1
        return envelope

    def take_requests(self, limit: int) -> list[StoreRequest]:
        """Remove and return the store requests (plain tells) at the head, up to ``limit``.

        It stops at the first envelope that is anything else (an ask, a stop, another message),
        which stays first, so every message still reaches the actor in the order it was sent.
        """
        taken: list[StoreRequest] = []
        while len(taken) < limit and not self._held:
            try:
                envelope = self._queue.get_nowait()
            except queue.Empty:
                break
            with self._count:
                self._queued -= 1
            if envelope.reply_to is not None or not isinstance(envelope.message, _REQUESTS):
                self._held.append(envelope)
                break
            taken.append(envelope.message)
        return taken


def _never() -> bool:
    return False


class StoreActor(pykka.ThreadingActor):
    """The actor that owns the :class:`SessionStore` and does all of its (blocking) disk work.

    It answers each request at the request's ``reply_to`` address in ``directory``:
    ``OpenSession`` and ``CreateChild`` with ``SessionLoaded`` or ``StoreFailed``
    (``exists=True`` for a ``create_only`` open of a stored id, ``taken=True`` for a child id
    whose record the parent did not create), ``AppendMessages`` and ``CompactHistory`` with
    ``Appended`` or ``StoreFailed`` carrying the ``request_id``. Every request is answered, so
    no waiter hangs: any error becomes ``StoreFailed`` and the actor keeps serving. Whoever
    starts it registers its ref at :data:`~actors.dispatcher.directory.STORE`.

    Group commit: on each request it also takes the store requests waiting right behind it in
    its inbox (up to ``max_batch``) and writes them all in one transaction; every answer goes
    out after the COMMIT. ``max_batch = 1`` writes one request per transaction.

    In place: a plain store request told while the store is idle, on a thread for which
    ``run_here()`` is true, is handled on that thread before ``tell`` returns (see the module's
    docstring); the runtime passes its dispatcher's ``lent_here``. The default runs nothing in
    place.
    """

    max_batch: int = 256
    """Most requests written in one transaction; 1 turns group commit off."""

    @staticmethod
    def _create_actor_inbox() -> _Inbox:
        return _Inbox()

    def __init__(
        self,
        path: str | Path | Callable[[], StoreBackend],
        directory: Directory,
        lend_thread: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
        run_here: Callable[[], bool] = _never,
    ) -> None:
        """``path`` is the database file (``<home>/loopd.db``), or a function that opens
        another backend (PostgreSQL); ``directory`` finds replies. ``lend_thread`` (the
        sessions' dispatcher's ``lend``) is entered around a batch's answers when no request
        waits: the first requester handles its answer on this thread, between two batches,
        instead of a dispatcher thread being woken for it. ``run_here`` says whether a
        teller's thread may run its request in place."""
        super().__init__()
        self.lend_thread = lend_thread
        if callable(path):
            self.opener: Callable[[], StoreBackend] = path
            self.path = Path()
        else:
            self.path = Path(path)
            self.opener = lambda: SessionStore(self.path)
        self.directory = directory
        self.store: StoreBackend | None = None
        self.open_error: str | None = None
        inbox = self.actor_inbox
        if isinstance(inbox, _Inbox):
            inbox.run_here = run_here
            inbox.run_in_place = self._run_in_place

    def _run_in_place(self, message: StoreRequest) -> None:
        # This one request alone: only the store's own thread takes what waits in the queue,
        # since an envelope taken here that is not a request would wait in _held for a get()
        # that sleeps in the queue already.
        try:
            self._write([message])
        except Exception:  # a reply that could not be told: the teller's handler goes on
            log.exception("store: a request run in place failed")

    def on_start(self) -> None:
        """Open the store on the actor's own thread; nothing runs in place before it is open."""
        try:
            self.store = self.opener()
        except Exception as exc:
            # Stay up and answer StoreFailed: a dead actor would leave every requester hanging.
            self.open_error = str(exc)
            log.error("store actor could not open its store: %s", exc)

    def on_stop(self) -> None:
        """Close the store; every committed request is already durable."""
        if self.store is not None:
            self.store.close()
            self.store = None

    def on_receive(self, message: Any) -> Any:
        """Handle a store request, and those waiting behind it, and tell each its answer."""
        if isinstance(message, ReleaseSession):
            if self.store is not None:
                self.store.release(message.session)
            return None
        if isinstance(message, ListApprovals):  # asked by Runtime.start, before the Context
            return self.store.approvals(ours=True) if self.store is not None else []
        if isinstance(message, ListRemoteTasks):  # asked by Runtime.start, before the Context
            return self.store.remote_tasks() if self.store is not None else ()
        if not isinstance(message, _REQUESTS):
            log.warning("store actor ignores unknown message %s", type(message).__name__)
            return None
        batch: list[StoreRequest] = [message]
        inbox = self.actor_inbox
        if self.max_batch > 1 and isinstance(inbox, _Inbox):
            batch += inbox.take_requests(self.max_batch - 1)
        self._write(batch)
        return None

    def _write(self, batch: list[StoreRequest]) -> None:
        """Write ``batch`` in one transaction and tell each request its answer."""
        try:
            answers = self._answers(batch)
        except Exception as exc:  # a bug below the store's own error handling: answer all
            log.exception("store: a batch of %d failed", len(batch))
            answers = [self._reply(r, StoreError(r.session, str(exc))) for r in batch]
        # With nothing waiting, the first requester handles its answer on this thread; with
        # more requests waiting, the store gets on with them and the dispatcher with that.
        lend = self.lend_thread if self.actor_inbox.empty() else contextlib.nullcontext
        with lend():
            for request, reply in zip(batch, answers, strict=True):
                if reply is None or isinstance(request, _UNANSWERED):  # nobody waits for it
                    continue
                if not self.directory.tell(request.reply_to, reply):
                    log.debug("store reply to %s was not delivered", request.reply_to)

    def _answers(self, batch: list[StoreRequest]) -> list[Any]:
        if self.store is None:
            error = StoreError(None, self.open_error or "the store is closed")
            return [self._reply(r, error) for r in batch]
        store = self.store
        jobs = [(r.session, self._job(store, r)) for r in batch]
        return [
            self._reply(r, result) for r, result in zip(batch, store.run_batch(jobs), strict=True)
        ]

    @staticmethod
    def _job(store: StoreBackend, msg: StoreRequest) -> Callable[[Any], Any]:
        """The work of ``msg`` inside a transaction; returns what :meth:`_reply` answers."""
        if isinstance(msg, AppendMessages):
            return lambda cur: store.append_in(
                cur,
                msg.session,
                msg.messages,
                turns=msg.turns,
                next_call_id=msg.next_call_id,
                untrusted=msg.untrusted,
                reports=msg.reports,
                running=msg.running,
            )
        if isinstance(msg, SaveBackground):
            return lambda cur: store.save_background_in(cur, msg.row)
        if isinstance(msg, DropBackground):
            return lambda cur: store.drop_background_in(cur, msg.session)
        if isinstance(msg, LoadBackground):
            return store.load_background_in
        if isinstance(msg, SaveRemoteTask):
            return lambda cur: store.save_remote_in(cur, msg.row)
        if isinstance(msg, DropRemoteTask):
            return lambda cur: store.drop_remote_in(cur, msg.session)
        if isinstance(msg, CompactHistory):
            return lambda cur: store.compact_in(cur, msg.session, msg.summary)
        if isinstance(msg, StoreApproval):
            return lambda cur: store.add_approval_in(cur, msg.approval)
        if isinstance(msg, SettleApproval):

            def settle(cur: Any) -> bool:
                done = store.settle_approval_in(
                    cur, msg.session, msg.call_id, msg.approved, msg.reason
                )
                if msg.ran:  # carried out at once: both in one transaction
                    store.mark_ran_in(cur, msg.session, (msg.call_id,))
                return done

            return settle
        if isinstance(msg, ApprovalsRun):
            return lambda cur: store.mark_ran_in(cur, msg.session, msg.call_ids)
        if isinstance(msg, DropApprovals):
            return lambda cur: store.drop_approvals_in(cur, msg.session, msg.call_ids)
        if isinstance(msg, RecordSpent):
            return lambda cur: store.record_spent_in(cur, msg.session, msg.call_ids, msg.spent)
        if isinstance(msg, CreateChild):
            return lambda cur: store.create_child_in(
                cur,
                msg.session,
                msg.parent,
                msg.baseline,
                msg.slot,
                untrusted=msg.untrusted,
                first=msg.first,
                agent=msg.agent,
                more=msg.more,
                next_call_id=msg.next_call_id,
                running=msg.running,
            )
        baseline = msg.baseline
        if baseline is None:
            return lambda cur: (store.open_in(cur, msg.session), False)
        if msg.create_only:
            return lambda cur: (
                store.create_in(cur, msg.session, baseline, msg.slot, agent=msg.agent),
                True,
            )
        return lambda cur: store.open_or_create_in(
            cur, msg.session, baseline, msg.slot, agent=msg.agent, first=msg.first
        )

    def _reply(self, msg: StoreRequest, result: Any) -> Any:
        if isinstance(msg, SettleApproval) and msg.reply_to is not None:
            if result is False:  # the store has no waiting call to decide: nothing was stored
                error = "the store holds no waiting call to decide (decided or withdrawn elsewhere)"
                return ApprovalStored(msg.session, msg.call_id, error, not_waiting=True)
            error = str(result) if isinstance(result, Exception) else ""
            return ApprovalStored(msg.session, msg.call_id, error)
        if isinstance(msg, (*_UNANSWERED, SettleApproval)):
            if isinstance(result, Exception):
                log.warning("store: %s for %s failed: %s", type(msg).__name__, msg.session, result)
            return None
        rid = msg.request_id
        if isinstance(msg, SaveBackground | DropBackground):
            error = str(result) if isinstance(result, Exception) else ""
            return BackgroundSaved(msg.session, rid, error)
        if isinstance(msg, SaveRemoteTask | DropRemoteTask):
            error = str(result) if isinstance(result, Exception) else ""
            return RemoteTaskSaved(msg.session, rid, error)
        if isinstance(msg, LoadBackground):
            if isinstance(result, Exception):
                return BackgroundLoaded((), rid, str(result))
            return BackgroundLoaded(result, rid)
        if isinstance(result, Exception):
            failed = self._failed(msg.session, result, rid)
            if isinstance(msg, OpenSession | CreateChild):
                failed = msgspec.structs.replace(
                    failed,
                    exists=isinstance(result, SessionExists),
                    missing=isinstance(result, SessionNotFound),
                    taken=isinstance(result, SessionTaken),
                    held_elsewhere=isinstance(result, StoreError) and result.held_elsewhere,
                )
            return failed
        if isinstance(msg, OpenSession | CreateChild):
            record, created = result
            return SessionLoaded(record, created, rid)
        return Appended(msg.session, rid)

    @staticmethod
    def _failed(session: str, exc: Exception, request_id: int) -> StoreFailed:
        if isinstance(exc, StoreError):
            log.info("store request failed: %s", exc)
        else:
            # Not a store condition we expected: keep the traceback for the operator.
            log.error("store request for session %r failed", session, exc_info=exc)
        return StoreFailed(session, str(exc), request_id=request_id)
