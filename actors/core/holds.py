"""Which session ids a turn holds, who waits for each, and what each waiter is told.

A session id is held while a turn of it runs (a user's, a scheduled job's or a child's), from
the moment the Context accepts the turn until its outcome is routed. ``hold`` succeeds only if
nobody holds the id, which is what answers a second turn ``busy``. A :class:`Hold` knows its
waiter: a user's ``reply_to`` hears the turn's outcome, a parent's pending call hears
``SubagentCompleted`` or ``SubagentFailed`` (:meth:`Hold.child_answer`, :meth:`Hold.failure`).
"""

from __future__ import annotations

from dataclasses import dataclass

from actors.core.config import DEFAULT_AGENT
from actors.core.context_effects import ContextEffect, Emit, Reply, Report, ToSession
from actors.core.dispatch import descends_from
from actors.core.spawn import child_summary, subagent_result_text
from actors.core.text import neutralise
from messages import (
    BackgroundReport,
    BackgroundRow,
    Baseline,
    ChatMessage,
    CreateChild,
    FailReason,
    Resume,
    RunTurn,
    SessionRecord,
    SlotPool,
    SubagentCompleted,
    SubagentFailed,
    SubagentFinished,
    ToolSpec,
    TurnCompleted,
    TurnEnded,
    TurnFailed,
    TurnOutcome,
)

__all__ = ["Hold", "HoldTable", "Live"]


@dataclass
class Hold:
    """Why a session id is held: a user's turn (answer ``reply_to``), or a child's turn
    (answer ``parent``'s call ``call_id``)."""

    session: str
    text: str
    speaker: str | None = None
    reply_to: str | None = None
    parent: str | None = None
    call_id: int = 0
    spawn: int = 0
    """A child's spawn number, so a late timer of an earlier child is recognised."""
    answered: bool = False
    """The waiter has its answer already (a child that timed out is still winding down)."""
    incarnation: int = 0
    """The session actor that was told to run this turn."""
    slot: int = 0
    """The slot a new session is created on."""
    open_request: int = 0
    """The store request that opens this session, so a late answer is told apart."""
    agent: str | None = None
    """The agent profile asked for; None: a stored session's own, ``default`` for a new one."""
    trace: dict[str, str] | None = None
    """The trace context the turn belongs under."""
    untrusted: bool = False
    """A child's: its parent's untrusted flag at the spawn, which the child starts with."""
    output: ToolSpec | None = None
    """The ``final_answer`` tool asked for (a typed turn): a new session is created with it;
    a typed child's JSON reaches its parent uncut."""
    background: bool = False
    """A background child that was answered ``started``: its outcome is a :class:`Report`."""
    silent: bool = False
    """A background child cancelled with its parent or an ancestor: it reports nothing."""
    cancelled: bool = False
    """Told to cancel already: it is winding down, and a second cancel neither tells it again
    nor counts it among what it cancelled."""
    reports: tuple[BackgroundRow, ...] = ()
    """A turn the Context runs for background reports: the reports it delivers."""
    resume: Resume | None = None
    """Continue the turn its stored transcript cut off (a call a person decided) instead of
    starting one on ``text``."""

    @property
    def is_child(self) -> bool:
        """True for a subagent's turn."""
        return self.parent is not None

    def first_message(self) -> ChatMessage | None:
        """The user message a new top-level session is created with (its ``OpenSession``'s
        ``first``), so creating it and storing the turn's first message are one transaction;
        None for a turn that stores more than that first (background reports, a resume)."""
        if self.is_child or self.reports or self.resume is not None:
            return None
        return ChatMessage(role="user", content=self.text, name=self.speaker)

    def run_turn(self, *, stored: bool = False) -> RunTurn:
        """What the session actor is told to run this turn on a session it has (stored);
        ``stored``: the session was created with :meth:`first_message`."""
        pool: SlotPool = "background" if self.is_child else "main"
        reports = tuple(
            BackgroundReport(r.parent, r.child, r.report or "", r.untrusted) for r in self.reports
        )
        return RunTurn(
            self.text,
            self.speaker,
            stored=stored,
            pool=pool,
            trace=self.trace,
            reports=reports,
            resume=self.resume,
        )

    def _to_parent(self, reply: SubagentCompleted | SubagentFailed) -> ContextEffect:
        """Where a child's answer goes: the parent's pending call, or (a background child's)
        a :class:`Report` to store and deliver."""
        assert self.parent is not None
        if not self.background:
            return ToSession(self.parent, reply)
        text = None if self.silent else subagent_result_text(reply)
        finished = self._finished(reply)
        return Report(self.parent, self.session, self.call_id, text, reply.untrusted, finished)

    def first_run(self, baseline: Baseline, reply_to: str) -> tuple[SessionRecord, RunTurn]:
        """A new child's record, not stored yet, and its first turn on it.

        The record holds its first message. It is stored with the child's first write (the
        CreateChild the RunTurn carries, answered to ``reply_to``): one store request and one
        transaction for a child that answers at once. The store opens a stored record only if
        that parent's spawn created it; the child's turn then starts over on it.
        """
        assert self.parent is not None
        agent = self.agent or DEFAULT_AGENT
        first = ChatMessage(role="user", content=self.text)
        create = CreateChild(
            self.session,
            self.parent,
            baseline,
            self.slot,
            self.untrusted,
            first,
            reply_to,
            agent=agent,
        )
        record = SessionRecord(
            self.session,
            baseline,
            self.slot,
            (first,),
            turns=1,
            next_call_id=1,
            untrusted=self.untrusted,
            parent=self.parent,
            agent=agent,
        )
        run = RunTurn(self.text, stored=True, pool="background", trace=self.trace, create=create)
        return record, run

    def failure(
        self, reason: FailReason, detail: str, *, turn_began: bool = True
    ) -> list[ContextEffect]:
        """Answer whoever waits on this hold with a failure the Context decided.

        A held turn that ends here ends with a ``TurnEnded`` event like any other; a request
        refused before it held anything (BUSY) has no turn to end. A child that failed this
        way passes no text to its parent, so it passes no untrusted flag either.
        """
        effects: list[ContextEffect] = []
        if turn_began:
            ended = TurnEnded(session=self.session, completed=False, reason=reason, detail=detail)
            effects.append(Emit(ended))
        if self.parent is None:
            effects.append(Reply(self.reply_to, TurnFailed(self.session, reason, detail)))
            return effects
        failed = SubagentFailed(self.parent, self.call_id, self.session, reason, False, detail)
        effects.append(self._to_parent(failed))
        return effects

    def _finished(self, reply: SubagentCompleted | SubagentFailed) -> SubagentFinished:
        """A background child's ``SubagentFinished``, told by the Context once its report is
        stored; a foreground child's is the parent's to tell, once it has stored the answer
        (SPEC 18)."""
        assert self.parent is not None
        return SubagentFinished(
            session=self.parent,
            call_id=self.call_id,
            child=self.session,
            completed=isinstance(reply, SubagentCompleted),
            reason=reply.reason if isinstance(reply, SubagentFailed) else None,
            detail=reply.detail if isinstance(reply, SubagentFailed) else "",
        )

    def child_answer(
        self, outcome: TurnOutcome, untrusted: bool, summary_chars: int
    ) -> list[ContextEffect]:
        """A child's turn ended with ``outcome``: its parent's pending call hears it, with the
        child's untrusted flag and what it spent (a completed child's answer as a summary of
        at most ``summary_chars``)."""
        assert self.parent is not None
        if isinstance(outcome, TurnCompleted):
            # A typed child's JSON is neutralised, never cut (its turn failed if too long).
            typed = self.output is not None
            summary = (
                neutralise(outcome.content)
                if typed
                else child_summary(outcome.content, summary_chars)
            )
            reply: SubagentCompleted | SubagentFailed = SubagentCompleted(
                self.parent, self.call_id, self.session, summary, untrusted, outcome.usage
            )
        else:
            reply = SubagentFailed(
                self.parent,
                self.call_id,
                self.session,
                outcome.reason,
                untrusted,
                outcome.detail,
                outcome.usage,
            )
        # A background child's event first, so it reaches the bus before the report's turn.
        return [self._to_parent(reply)]


class HoldTable:
    """Which session ids a turn holds. ``hold`` succeeds only if nobody holds the id."""

    def __init__(self) -> None:
        self._holds: dict[str, Hold] = {}
        # Counted as holds come and go: every spawn asks, and counting the table each time
        # is quadratic in a wide fan-out.
        self._children = 0

    def hold(self, hold: Hold) -> bool:
        """Hold ``hold.session``; False (BUSY) if it is held already."""
        if hold.session in self._holds:
            return False
        self._holds[hold.session] = hold
        self._children += hold.is_child
        return True

    def get(self, session: str) -> Hold | None:
        """The hold on ``session``, if any."""
        return self._holds.get(session)

    def release(self, session: str) -> Hold | None:
        """Let ``session`` go; returns the hold it had, if any."""
        hold = self._holds.pop(session, None)
        if hold is not None:
            self._children -= hold.is_child
        return hold

    def held(self) -> tuple[str, ...]:
        """Every held id, sorted."""
        return tuple(sorted(self._holds))

    def family(self, session: str) -> tuple[str, ...]:
        """Held ids among ``session`` and its descendants (``sub-<session>-<n>``, deeper too)."""
        return tuple(s for s in self.held() if s == session or descends_from(s, session))

    def children(self) -> int:
        """How many children's turns are held."""
        return self._children

    def drain(self) -> list[Hold]:
        """Release everything; returns what was held."""
        holds, self._holds = list(self._holds.values()), {}
        self._children = 0
        return holds


@dataclass(frozen=True)
class Live:
    """A running session actor (``ref``, the shell's handle), its number among the actors of
    that id, and the profile it runs."""

    ref: object
    incarnation: int
    agent: str = DEFAULT_AGENT
    output: ToolSpec | None = None
    """Its ``final_answer`` tool (a typed session), to check a turn's schema against."""
