"""Approvals: a person decides a tool call (the requests users send, and the runtime's own).

``ApproveCall`` / ``DenyCall`` are told to the Context by whoever decides (``Runtime.approve``,
the CLI, the REPL); a decision for a call that is not waiting is answered ``ApprovalRefused``.
The rest travel inside the runtime: the Context tells the session its ``ApprovalDecision``,
the store keeps each waiting call as a ``StoredApproval`` (``StoreApproval``,
``SettleApproval``, ``ApprovalsRun``, ``DropApprovals``), and ``Resume`` continues a turn cut
off while it (or a child of it) waited.
"""

from __future__ import annotations

from datetime import datetime

from messages.base import Message
from messages.events import ApprovalRequested
from messages.ids import CallId, SessionId
from messages.turns import SubagentCompleted, SubagentFailed

__all__ = [
    "ApprovalDecision",
    "ApprovalRefused",
    "ApprovalStored",
    "ApprovalTimedOut",
    "ApprovalsRun",
    "ApproveCall",
    "DenyCall",
    "DropApprovals",
    "ListApprovals",
    "Park",
    "Parked",
    "RecordSpent",
    "Resume",
    "SettleApproval",
    "StoreApproval",
    "StoredApproval",
]


class ApproveCall(Message, frozen=True):
    """A person says yes to ``session``'s waiting call ``call_id``; ``note`` is kept with the
    decision. The answer (``ApprovalSettled`` or ``ApprovalRefused``) goes to ``reply_to``."""

    session: SessionId
    call_id: CallId
    note: str | None = None
    reply_to: str | None = None


class DenyCall(Message, frozen=True):
    """A person says no to ``session``'s waiting call ``call_id``: the model reads
    ``Denied: a person declined this call: <reason>.``"""

    session: SessionId
    call_id: CallId
    reason: str
    reply_to: str | None = None


class ApprovalRefused(Message, frozen=True):
    """A decision that changed nothing: ``session``'s call ``call_id`` is not waiting (it never
    was, or it was settled already); ``detail`` says which."""

    session: SessionId
    call_id: CallId
    detail: str


class ApprovalDecision(Message, frozen=True):
    """The Context tells a session how its waiting call ``call_id`` was settled: ``approved``,
    or declined for ``reason``."""

    call_id: CallId
    approved: bool
    reason: str = ""
    denial: str = ""
    note: str | None = None
    """An approval's note: kept with the call's stored result (``ChatMessage.decision``),
    never sent to the model."""
    """Set when nobody was asked: the Context denied the call at once (a ``subagent`` call
    a spawn limit denies anyway, see ``StoreApproval.spawns``), nothing was stored, and this
    is the whole text the call answers."""


class ApprovalTimedOut(Message, frozen=True):
    """The Context's own timer: ``session``'s call ``call_id`` outlived ``approvals.timeout_s``."""

    session: SessionId
    call_id: CallId


class StoredApproval(Message, frozen=True):
    """A waiting call as the store keeps it: the request, its deadline, and, once decided (the
    CLI on a home no runtime holds), the decision the next ``Runtime.start`` carries out."""

    request: ApprovalRequested
    deadline: datetime
    approved: bool | None = None
    reason: str = ""
    spent: int = 0
    """With ``loop.token_budget``: what the call's family had spent when it began to wait, so
    a turn resumed after a restart goes on counting from there."""
    background: bool = False
    """The call is a background child's (or a descendant's): no parent's call waits for it,
    so a restart drops it."""
    ran: bool = False
    """The runtime began carrying out the decision (the call's work ran): a start after a
    crash answers the call as interrupted instead of running it again."""


class StoreApproval(Message, frozen=True):
    """Store a waiting call; answered ``Appended`` with ``request_id`` at ``reply_to``."""

    session: SessionId
    request_id: int
    approval: StoredApproval
    reply_to: str
    spawns: bool = False
    """The held work starts a child (a ``subagent`` call): the Context first checks the limits
    only it knows (``loop.max_children_total``, ``subagents.max_background``); a call they deny
    anyway is not stored, and the session is told ``ApprovalDecision(denial=...)``."""
    background: bool = False
    """With ``spawns``: the child would run in the background."""


class SettleApproval(Message, frozen=True):
    """Record the decision of ``session``'s waiting call ``call_id``; with ``reply_to``, the
    store answers :class:`ApprovalStored` once it is committed (the Context tells nobody of
    the decision before that)."""

    session: SessionId
    call_id: CallId
    approved: bool
    reason: str = ""
    ran: bool = False
    """The runtime carries the decision out at once (a live turn's): the row is marked
    carried out in the same transaction (see ``ApprovalsRun``)."""
    reply_to: str | None = None


class ApprovalStored(Message, frozen=True):
    """The store's answer to a :class:`SettleApproval`: the decision is committed, or
    ``error`` says why it is not; ``not_waiting`` when the store holds no waiting call to
    decide (decided already, or withdrawn, by another process)."""

    session: SessionId
    call_id: CallId
    error: str = ""
    not_waiting: bool = False


class DropApprovals(Message, frozen=True):
    """Forget ``session``'s stored calls ``call_ids`` (answered, or cancelled; no answer)."""

    session: SessionId
    call_ids: tuple[CallId, ...]


class RecordSpent(Message, frozen=True):
    """At a stop: what the family of ``session`` has spent by now (``loop.token_budget``), kept
    with its calls ``call_ids`` that wait for a person, if they still wait (no answer)."""

    session: SessionId
    call_ids: tuple[CallId, ...]
    spent: int


class ApprovalsRun(Message, frozen=True):
    """Mark ``session``'s decided calls ``call_ids`` as carried out: their work begins now, so
    a start after a crash never runs it again (no answer)."""

    session: SessionId
    call_ids: tuple[CallId, ...]


class ListApprovals(Message, frozen=True):
    """Asked of the store: every stored approval, oldest first."""


class Resume(Message, frozen=True):
    """Continue the turn the stored transcript cut off (its last answer has calls without
    results): ``decisions`` settle waiting calls, ``waiting`` are still waiting for a person;
    any other call without a result is answered as interrupted."""

    decisions: tuple[ApprovalDecision, ...] = ()
    waiting: tuple[CallId, ...] = ()
    children: tuple[CallId, ...] = ()
    """``subagent`` calls whose child still waits for a person: they stay open, and the
    child's outcome answers them later, as a running child's does."""
    answers: tuple[SubagentCompleted | SubagentFailed, ...] = ()
    """The outcomes of children that waited, each answering its ``subagent`` call."""


class Park(Message, frozen=True):
    """The Context asks a session whose calls wait for a person to stop its turn for now (to
    passivate it): the turn stores the results it has and ends unpublished, answered
    ``Parked``; a decision later resumes it from the store."""


class Parked(Message, frozen=True):
    """A session's answer to ``Park``: ``parked``, or not (its turn is still doing other work,
    or no longer waits); ``incarnation`` names the actor that answers."""

    session: SessionId
    incarnation: int
    parked: bool
