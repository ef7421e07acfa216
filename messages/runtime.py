"""Messages between loopd's own actors: the store, the session actors and the port."""

from __future__ import annotations

from datetime import datetime

from messages.approvals import Resume, StoredApproval
from messages.background import BackgroundReport
from messages.base import Message
from messages.chat import Baseline, ChatMessage, SlotPool, Usage
from messages.ids import CallId, SessionId, check_text, check_top_level_session
from messages.tools import ToolResult
from messages.turns import FailReason, TurnOutcome

__all__ = [
    "AppendMessages",
    "Appended",
    "Cancel",
    "CancelModelRequest",
    "CancelPortCall",
    "CancelTurn",
    "ChildTimedOut",
    "CompactHistory",
    "ContextStatus",
    "CreateChild",
    "Inspect",
    "OpenSession",
    "PortCall",
    "ReleaseSession",
    "Remember",
    "RunTurn",
    "ScheduledTurn",
    "SessionCrashed",
    "SessionLoaded",
    "SessionRecord",
    "SessionStopped",
    "SessionTurnEnded",
    "StoreFailed",
    "Tick",
    "TokensSpent",
    "ToolDone",
]


class SessionRecord(Message, frozen=True):
    """A stored session as it is read back: its live history, counters and flag.

    ``transcript`` holds the messages after the baseline that are not compacted away.
    ``next_call_id`` is the id the session's next tool call takes.
    """

    id: SessionId
    baseline: Baseline
    slot: int
    transcript: tuple[ChatMessage, ...]
    turns: int
    next_call_id: int
    untrusted: bool
    parent: SessionId | None = None
    """The session whose spawn created this one (a child); None for a top-level session."""
    agent: str = "default"
    """The agent profile (``[agents.NAME]``) the session was created with."""
    decided: tuple[StoredApproval, ...] = ()
    """The stored decisions of calls the transcript leaves without a result: a person
    decided, and the turn stopped before the call's result was stored (a store that failed
    the write, a crash). The turn that answers them answers each as decided: a declined call
    with its decline, told already."""


class OpenSession(Message, frozen=True):
    """Open ``session``; with a ``baseline``, create it on ``slot`` if it is not stored yet.

    Without a baseline a session that is not stored is ``StoreFailed(missing=True)``: the
    Context then builds a baseline (reading memory) only for a session that is really new.
    With ``create_only`` a stored session is an error (``StoreFailed(exists=True)``).
    ``request_id`` comes back in the answer, so a late answer is told from a current one.
    ``first``: a session created here is stored with it as its first message and its first
    turn counted, in the same transaction (the user message of the turn that creates it:
    one commit, not two); a stored session is opened as it is, ``first`` not added.
    """

    session: SessionId
    baseline: Baseline | None
    slot: int
    reply_to: str
    create_only: bool = False
    request_id: int = 0
    agent: str = "default"
    """The agent profile a session created here is stored with (a stored one keeps its own)."""
    first: ChatMessage | None = None


class CreateChild(Message, frozen=True):
    """Create child ``session`` of ``parent`` with its first user message, in one transaction.

    The child is stored on ``slot`` with ``baseline``, ``untrusted`` (its parent's flag at the
    spawn, or its own by then), ``first`` and then ``more`` as its messages, ``next_call_id``
    and one turn counted, and answered ``SessionLoaded`` (``created=True``). A stored record
    that the same parent's spawn created is opened as it is (``created=False``, nothing
    stored); any other stored record with that id is ``StoreFailed(taken=True)`` and nothing
    of it is used.

    The Context builds it at the spawn and hands it to the child in its ``RunTurn``; the child
    sends it as its first write, with what its turn stores first as ``more``.
    """

    session: SessionId
    parent: SessionId
    baseline: Baseline
    slot: int
    untrusted: bool
    first: ChatMessage
    reply_to: str
    request_id: int = 0
    agent: str = "default"
    """The agent profile the child runs."""
    more: tuple[ChatMessage, ...] = ()
    """Messages stored after ``first``, in the same transaction."""
    next_call_id: int = 1
    running: bool = True
    """The child's turn runs on after this write (False: the write also ends it)."""


class SessionLoaded(Message, frozen=True):
    """The store's answer to :class:`OpenSession`; ``created`` if it was new."""

    record: SessionRecord
    created: bool
    request_id: int = 0


class StoreFailed(Message, frozen=True):
    """A store operation on ``session`` failed; ``exists`` for a create of a known id,
    ``missing`` for an open (without a baseline) of an unknown one, ``taken`` for a
    :class:`CreateChild` whose id holds a record that parent's spawn did not create,
    ``held_elsewhere`` for a session another process runs (a shared PostgreSQL store)."""

    session: SessionId
    detail: str
    exists: bool = False
    request_id: int = 0
    missing: bool = False
    taken: bool = False
    held_elsewhere: bool = False


class ReleaseSession(Message, frozen=True):
    """The Context is done with ``session`` (its actor stopped): the store may let another
    process take it. Nothing answers; a store that has no per-session lock ignores it."""

    session: SessionId


class AppendMessages(Message, frozen=True):
    """Append ``messages`` to ``session`` and save its counters, in one transaction."""

    session: SessionId
    request_id: int
    messages: tuple[ChatMessage, ...]
    turns: int
    next_call_id: int
    untrusted: bool
    reply_to: str
    reports: tuple[SessionId, ...] = ()
    """Background children whose reports ``messages`` deliver: their stored rows are deleted
    in the same transaction, so a report is in the transcript or still stored, never both."""
    running: bool | None = None
    """True: a turn of ``session`` runs from this write on (its first write); False: the turn
    ended with it; None: unchanged. A session stored running at a start was cut off."""


class CompactHistory(Message, frozen=True):
    """Mark ``session``'s live history compacted and append ``summary`` as its new history."""

    session: SessionId
    request_id: int
    summary: ChatMessage
    reply_to: str


class TokensSpent(Message, frozen=True):
    """A session tells the Context what one model answer cost, so the family's spend against
    ``loop.token_budget`` is counted by one owner."""

    session: SessionId
    usage: Usage


class Appended(Message, frozen=True):
    """The store made request ``request_id`` of ``session`` durable."""

    session: SessionId
    request_id: int


class RunTurn(Message, frozen=True):
    """The Context tells a session actor to run one turn on ``text``, its model requests on
    the slots of ``pool``.

    ``stored``: the store holds ``text`` as the turn's user message already, and has counted
    the turn (a new child's record is created with it), so the turn asks the model at once.

    ``text`` must be a ``str`` and ``speaker`` a ``str`` or None, both valid Unicode text.
    ``trace`` is the trace context the turn belongs under (from its StartTurn or
    SubagentRequest).

    ``create``: a new child's record is not stored yet. Its first write is this request, with
    the messages to store added as ``CreateChild.more``, in place of an ``AppendMessages``: a
    child that answers at once costs one transaction, not two. A turn that ends before it
    stores anything sends it as it is, so the child's record exists all the same.
    """

    text: str
    speaker: str | None = None
    stored: bool = False
    pool: SlotPool = "main"
    trace: dict[str, str] | None = None
    create: CreateChild | None = None
    reports: tuple[BackgroundReport, ...] = ()
    """Background reports this turn delivers with its first message (a turn the Context runs
    for a report has ``text`` the first one's)."""
    resume: Resume | None = None
    """Continue the turn the stored transcript cut off instead of starting one on ``text``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_text(self.text, "the turn text")
        check_text(self.speaker, "the speaker", optional=True)


class SessionTurnEnded(Message, frozen=True):
    """A session actor tells the Context its turn (and its compaction) is over."""

    session: SessionId
    outcome: TurnOutcome
    turns: int
    untrusted: bool
    reports: tuple[SessionId, ...] = ()
    """The background children whose reports this turn stored in the transcript."""


class SessionCrashed(Message, frozen=True):
    """A session actor (number ``incarnation``) failed or was stopped during its turn."""

    session: SessionId
    detail: str
    incarnation: int = 0
    reports: tuple[SessionId, ...] = ()
    """The background children whose reports the cut-off turn had sent to the store."""


class PortCall(Message, frozen=True):
    """Run the port tool ``name`` for ``session``'s call ``call_id``; answer at ``reply_to``.
    ``untrusted`` is the session's flag when it made the call (a tool may refuse then)."""

    session: SessionId
    call_id: CallId
    name: str
    arguments: str
    reply_to: str
    untrusted: bool = False


class ToolDone(Message, frozen=True):
    """The result of ``session``'s tool call, from the port (or a call answered by the Context)."""

    session: SessionId
    result: ToolResult


class Inspect(Message, frozen=True):
    """Ask an actor what it holds: a session answers its :class:`SessionRecord`, the Context
    its :class:`ContextStatus`. For the REPL and tests (``ref.ask(Inspect())``)."""


class ContextStatus(Message, frozen=True):
    """The Context's view: ids held by a running turn, and ids with a live actor."""

    held: tuple[SessionId, ...]
    live: tuple[SessionId, ...]


class ScheduledTurn(Message, frozen=True):
    """The scheduler asks the Context to run job ``job``'s turn on ``session``.

    The Context skips it (a ``JobSkipped`` event, and the same to ``reply_to``) while the session
    or any of its descendants is held; otherwise it runs like a :class:`~messages.StartTurn`
    whose outcome goes to ``reply_to``.
    """

    job: str
    session: SessionId
    text: str
    reply_to: str | None = None
    agent: str | None = None
    """The agent profile of the turn, as :class:`~messages.StartTurn`'s (a ``[[cron]]`` job's
    ``agent``; None: ``default``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_top_level_session(self.session)
        check_text(self.text, "the turn text")


class Tick(Message, frozen=True):
    """Wake the scheduler (run every job due at ``now``) or the Context (passivate the sessions
    idle at ``now``); the receiver's clock when None."""

    now: datetime | None = None


class CancelTurn(Message, frozen=True):
    """Cancel ``session``'s running turn and every child below it; each answers CANCELLED."""

    session: SessionId
    detail: str = "cancelled"


class Cancel(Message, frozen=True):
    """The Context tells a session actor to end its turn now with ``reason``."""

    reason: FailReason
    detail: str
    park: bool = False
    """The runtime stops: a call waiting for a person keeps waiting (stored), unanswered."""
    keep: tuple[CallId, ...] = ()
    """With ``park``: ``subagent`` calls whose child waits for a person (or a descendant of
    it does); they stay unanswered too, for the child's outcome after the next start."""


class CancelModelRequest(Message, frozen=True):
    """``session`` no longer waits for its model request ``request_id``: the model service
    drops it, or closes its connection so the server stops generating."""

    session: SessionId
    request_id: int


class CancelPortCall(Message, frozen=True):
    """``session`` no longer waits for its tool call ``call_id``: the port tells the tool."""

    session: SessionId
    call_id: CallId


class ChildTimedOut(Message, frozen=True):
    """The Context's timer: ``child`` (spawn number ``spawn``) outlived its time limit."""

    child: SessionId
    spawn: int


class Remember(Message, frozen=True):
    """``session``'s call ``call_id`` asks the Context to append ``text`` to memory."""

    session: SessionId
    call_id: CallId
    text: str


class SessionStopped(Message, frozen=True):
    """A session actor (number ``incarnation``) stopped while it ran no turn; a RunTurn sent
    to it may be lost."""

    session: SessionId
    incarnation: int = 0
