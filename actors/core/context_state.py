"""The Context's decisions, as a state class with no I/O (SPEC 3 and 5).

:class:`ContextState` takes the Context's inputs (a ``StartTurn``, a ``SubagentRequest``, the
store's answers, a session's ``SessionTurnEnded``, a crash, a cancel, a timer, a tick...) and
returns effects (``actors.core.context_effects``) for ``ContextActor`` to carry out, as a
:class:`~actors.core.turn.Turn` does for its session actor. A test drives it without a thread.
The rules it keeps:

- a session id is held by one turn at a time; another is answered ``busy``, and a scheduled
  job is skipped while the session or any of its descendants is held;
- a session with a live actor gets its turn at once; otherwise the store opens it, and only a
  session the store does not have gets a baseline (so memory is read only for new sessions); a
  child is always new and starts at once, its record created by its first write;
- the store's answer for another request than the hold's current one (a late one) is ignored;
- every session actor started gets a new incarnation, and a message from an earlier actor of
  the same id changes nothing;
- a turn's outcome goes to the user's ``reply_to``, or to the parent's pending call as
  ``SubagentCompleted`` or ``SubagentFailed``; a waiter is answered once, and always;
- ``loop.max_children_total`` children at most, each within ``loop.child_timeout_s``;
- a cancel reaches the session and every held descendant;
- idle top-level sessions are passivated (``sessions.idle_s``, ``sessions.max_live``);
- with ``loop.token_budget``, every model request of a family is counted and refused once the
  family has spent the budget;
- background children (``[subagents] background``) are stored before they are answered, and
  their reports before they are delivered (the rules are ``actors.core.background``'s, mixed
  in as :class:`~actors.core.background.BackgroundSpawns`).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from datetime import datetime

from actors.core.agents import Agents
from actors.core.approval_desk import ApprovalDesk
from actors.core.background import Background, BackgroundSpawns
from actors.core.budget import Budgets
from actors.core.config import DEFAULT_AGENT, Config
from actors.core.context_effects import (
    ArmSweep,
    BuildBaseline,
    CancelTimer,
    ContextEffect,
    Emit,
    IfGone,
    Reply,
    StartSession,
    StartTimer,
    StopSession,
    TellSession,
    ToModel,
    ToSession,
    ToStore,
    UpdateMemory,
)
from actors.core.dispatch import ArgumentError, child_id
from actors.core.holds import Hold, HoldTable, Live
from actors.core.output import output_fits, output_spec, wrong_output_detail
from actors.core.passivation import IdleSessions
from actors.core.session_state import store_failure_reason
from actors.core.spawn import child_text
from messages import (
    BackgroundReport,
    Baseline,
    Cancel,
    CancelModelRequest,
    ChildTimedOut,
    ContextStatus,
    DenyReason,
    FailReason,
    JobSkipped,
    ModelError,
    ModelRequest,
    OpenSession,
    ReleaseSession,
    RunTurn,
    ScheduledTurn,
    SessionCrashed,
    SessionLoaded,
    SessionRecord,
    SessionStopped,
    SessionTurnEnded,
    StartTurn,
    StoreFailed,
    SubagentRequest,
    SubagentStarted,
    Tick,
    TokensSpent,
    ToolDone,
    ToolResult,
    TurnEnded,
    TurnFailed,
    denial_message,
)
from messages.ids import CHILD_PREFIX

__all__ = ["SWEEP_MAX_S", "ContextState", "Live"]  # Live: from actors.core.holds

log = logging.getLogger(__name__)

SWEEP_MAX_S = 60.0
"""The longest time between two looks for idle sessions (``sessions.idle_s`` if shorter)."""

Effects = list[ContextEffect]


class ContextState(BackgroundSpawns):
    """The Context's holds, live table, idle sessions, budgets and counters; what to do next.

    Each input returns the effects to carry out, in order. :class:`BuildBaseline` and
    :class:`StartSession` are questions the shell answers at once (``baseline_built`` /
    ``baseline_failed``, ``started`` / ``start_failed``), and a :class:`TellSession` to a dead
    actor is answered ``undelivered``; the effects those return come in the place of the
    question, before anything after it.
    """

    def __init__(
        self,
        config: Config,
        agents: Agents,
        clock: Callable[[], datetime],
        address: str = "context",
    ) -> None:
        self.config = config
        self.address = address  # where the store answers what the Context asks
        self.agents = agents
        self.clock = clock
        self.holds = HoldTable()
        budget = config.loop.token_budget
        self.budgets = Budgets(budget) if budget is not None else None
        self.live: dict[str, Live] = {}
        sessions = config.sessions
        self.idle = IdleSessions(sessions.idle_s, sessions.max_live)
        self.incarnations = itertools.count(1)
        self.spawns = itertools.count(1)
        self.requests = itertools.count(1)
        self.background = Background(config.subagents.max_background)
        self.desk = ApprovalDesk(self)  # the calls waiting for a person (SPEC 11)

    # Life cycle.

    def begin(self) -> Effects:
        """The Context started: arm the first look for idle sessions, and read what background
        children the last run left."""
        return self._arm_sweep() + self.load_background()

    def shut_down(self, detail: str) -> Effects:
        """The Context stops: answer every held turn CANCELLED and tell every running one to
        stop working."""
        effects: Effects = self._stop_waiting() + self.desk.unsettled_at_stop(detail)
        effects += self.desk.record_spent()
        parks = self.desk.parks_at_stop()  # a family whose call waits parks, children too
        stored = self.desk.stored_at_stop()
        for hold in self.holds.drain():
            if hold.answered:
                continue
            if hold.session in stored:
                # Its calls wait in the store, and the next start resumes the turn; a waiter
                # (a turn passivated while it waited) still hears of the stop.
                if hold.reply_to is not None:
                    failed = TurnFailed(hold.session, FailReason.CANCELLED, detail)
                    effects.append(Reply(hold.reply_to, failed))
                continue
            # A session that gets the Cancel ends its turn (storing what keeps its transcript
            # valid) and emits its own TurnEnded; its answer to us would come too late.
            if hold.parent is not None:
                ended = TurnEnded(
                    session=hold.session,
                    completed=False,
                    reason=FailReason.CANCELLED,
                    detail=detail,
                )
                # Its parent is being cancelled too: no SubagentFailed.
                cancel = self.desk.stop_cancel(parks, hold.session, detail)
                effects += self._tell_live(hold, cancel, otherwise=(Emit(ended),))
                continue
            told = Reply(hold.reply_to, TurnFailed(hold.session, FailReason.CANCELLED, detail))
            answer = tuple(hold.failure(FailReason.CANCELLED, detail))
            # park: a call waiting for a person stays stored, for the next start to resume.
            cancel = self.desk.stop_cancel(parks, hold.session, detail)
            effects += self._tell_live(hold, cancel, then=(told,), otherwise=answer)
        return effects

    def status(self) -> ContextStatus:
        """What ``Inspect`` answers: the held ids and the live ones."""
        return ContextStatus(held=self.holds.held(), live=tuple(sorted(self.live)))

    # A user's turn.

    def start_turn(self, msg: StartTurn) -> Effects:
        """A user's turn: hold the session, then run it (a live actor) or open it (the store)."""
        hold = Hold(
            msg.session,
            msg.text,
            msg.speaker,
            reply_to=msg.reply_to,
            agent=msg.agent,
            trace=msg.trace,
            output=msg.output,
        )
        if msg.agent is not None and msg.agent not in self.agents:
            detail = f"no agent profile is named {msg.agent} (see [agents.NAME] in the config)"
            return [Reply(msg.reply_to, TurnFailed(msg.session, FailReason.WRONG_AGENT, detail))]
        if not self.holds.hold(hold):
            detail = f"session {msg.session} is busy: another turn holds it"
            return [Reply(msg.reply_to, TurnFailed(msg.session, FailReason.BUSY, detail))]
        self.idle.busy(msg.session)  # held: never passivated while its turn runs
        return self._turn_held(hold)

    def _hold_turn(self, hold: Hold) -> Effects:
        """Hold and run a turn the Context starts itself (a background report's)."""
        self.holds.hold(hold)  # the caller checked that nothing holds the session
        self.idle.busy(hold.session)
        return self._turn_held(hold)

    def _turn_held(self, hold: Hold) -> Effects:
        if self.budgets is not None:
            self.budgets.open(hold.session)
        return self._open(hold, self.config.slots.home_slot("main"))

    def scheduled(self, msg: ScheduledTurn) -> Effects:
        """A ``[[cron]]`` job or the heartbeat: a turn like a user's, unless the session or one
        of its descendants is held, when it is skipped."""
        # A job never piles onto a session that is busy, or waiting for its children.
        busy = self.busy_for_job(msg.session)
        if busy:
            skipped = JobSkipped(session=msg.session, job=msg.job, held=busy)
            return [Emit(skipped), Reply(msg.reply_to, skipped)]
        return self.start_turn(StartTurn(msg.session, msg.text, None, msg.reply_to, msg.agent))

    def model_request(self, msg: ModelRequest) -> Effects:
        """With ``loop.token_budget``, every model request passes here: it goes on to the model
        unless its family has spent the budget, when it is refused (``over_budget``)."""
        refusal = self.budgets.refusal(msg.session) if self.budgets is not None else None
        if refusal is None:
            return [ToModel(msg)]
        refused = ModelError(msg.session, msg.request_id, refusal, over_budget=True)
        return [Reply(msg.reply_to, refused)]

    def cancel_model_request(self, msg: CancelModelRequest) -> Effects:
        """A budgeted session's cancel goes the way its request went, after it."""
        return [ToModel(msg)]

    def tokens_spent(self, msg: TokensSpent) -> Effects:
        """Count what one answer cost its family."""
        if self.budgets is not None:
            self.budgets.spend(msg.session, msg.usage)
        return []

    # A child's turn (SPEC 5, steps 1 to 4).

    def spawn(self, msg: SubagentRequest) -> Effects:
        """A session's ``subagent`` call: deny it, answer it BUSY, or hold and start the child."""
        try:
            child = child_id(msg.parent, msg.call_id)
        except ArgumentError as exc:  # the session checks first; answer all the same
            return self._deny(msg, denial_message(DenyReason.INVALID_ARGUMENTS, exc.detail))
        denial = self.limit_denial(msg.parent, msg.background)
        if denial is not None:
            return self._deny(msg, denial)
        if msg.agent not in self.agents:  # the session checks first; answer all the same
            detail = f"unknown agent: {msg.agent}"
            return self._deny(msg, denial_message(DenyReason.INVALID_ARGUMENTS, detail))
        text = child_text(msg.task, self.config.loop.tool_result_cap, self.clock())
        spawn = next(self.spawns)
        hold = Hold(
            child,
            text,
            parent=msg.parent,
            call_id=msg.call_id,
            spawn=spawn,
            agent=msg.agent,
            trace=msg.trace,
            untrusted=msg.untrusted,
        )
        if not self.holds.hold(hold):
            detail = f"session {child} is held already"
            return hold.failure(FailReason.BUSY, detail, turn_began=False)
        if msg.background:  # stored first, then answered and started
            return self._store_background(hold)
        started = SubagentStarted(msg.parent, msg.call_id, child, agent=msg.agent)
        return self._launch(hold, started)

    def _launch(self, hold: Hold, started: SubagentStarted) -> Effects:
        """Start held child ``hold``: the event, its timer, its baseline (then its actor)."""
        child = hold.session
        effects: Effects = [Emit(started)]
        timeout = self.config.loop.child_timeout_s
        if timeout is not None:
            effects.append(StartTimer(child, hold.spawn, timeout))
        # SPEC 5, steps 2 and 4: a child's id is always new, so it needs its baseline now.
        hold.slot = self.config.slots.home_slot("background")
        hold.output = self.agents.get(hold.agent or DEFAULT_AGENT).output
        effects.append(self._build_baseline(hold))
        return effects

    def _deny(self, msg: SubagentRequest, text: str) -> Effects:
        denial = ToolResult(msg.call_id, text, denied=True)
        return [ToSession(msg.parent, ToolDone(msg.parent, denial))]

    def baseline_built(self, asked: BuildBaseline, baseline: Baseline) -> Effects:
        """The answer to :class:`BuildBaseline`: a child starts on it, a new top-level session
        is opened with it."""
        hold = self.holds.get(asked.session)
        if hold is None:
            return []
        if hold.is_child and not asked.known_only:
            return self._create_child(hold, baseline)
        return self._ask_store(hold, baseline)

    def baseline_unknown(self, asked: BuildBaseline) -> Effects:
        """The answer to a ``known_only`` :class:`BuildBaseline` whose baseline would need a
        read: open the session without one (the store says whether it is new)."""
        hold = self.holds.get(asked.session)
        if hold is None:
            return []
        return self._ask_store(hold, None)

    def baseline_failed(
        self, asked: BuildBaseline, detail: str, reason: FailReason = FailReason.SPAWN_ERROR
    ) -> Effects:
        """The baseline could not be built (memory, a system file): the turn fails ``reason``
        (``spawn_error``; ``store_error`` when the memory lives in a store out of reach)."""
        hold = self.holds.get(asked.session)
        if hold is None:
            return []
        effects = self._release(hold.session)
        detail = f"could not build the baseline: {detail}"
        return effects + hold.failure(reason, detail)

    def _create_child(self, hold: Hold, baseline: Baseline) -> Effects:
        """A child's actor starts at once on a record that holds its first message, and asks
        the model (:meth:`Hold.first_run`)."""
        return self._start_session(*hold.first_run(baseline, self.address))

    # Opening a session: a live actor, or the store (SPEC 5, step 4).

    def _open(self, hold: Hold, slot: int) -> Effects:
        hold.slot = slot
        live = self.live.get(hold.session)
        if live is not None:
            if not self._agent_fits(hold, live.agent):
                return self._wrong_agent(hold, live.agent)
            if not output_fits(hold.output, live.output):
                return self._wrong_output(hold)
            hold.incarnation = live.incarnation
            run = hold.run_turn()
            ran = self.desk.carrying_out(hold.session, run)
            return ran + self._tell_live(hold, run, if_gone=IfGone.REOPEN)
        # Open first; only a session that is not stored needs a baseline (and so memory),
        # unless it is known without a read: then the store opens or creates in one request.
        if hold.is_child:  # resumed on its stored record: never created here
            return self._ask_store(hold, None)
        return [self._build_baseline(hold, known_only=True)]

    def reopen(self, hold: Hold) -> Effects:
        """Run ``hold``'s turn on its stored session (a turn resumed by a decision)."""
        return self._open(hold, self.config.slots.home_slot("main"))

    def _ask_store(self, hold: Hold, baseline: Baseline | None) -> Effects:
        hold.open_request = next(self.requests)
        request = OpenSession(
            hold.session,
            baseline,
            hold.slot,
            self.address,
            request_id=hold.open_request,
            agent=hold.agent or DEFAULT_AGENT,
            first=hold.first_message() if baseline is not None else None,
        )
        return [ToStore(request)]

    def _current(self, session: str, request_id: int) -> Hold | None:
        """The hold a store answer belongs to, or None for a late answer."""
        hold = self.holds.get(session)
        if hold is None or hold.open_request != request_id or hold.answered:
            return None
        return hold

    def store_failed(self, msg: StoreFailed) -> Effects:
        """The store could not open a session: a new one (``missing``) gets its baseline, any
        other failure fails the turn."""
        hold = self._current(msg.session, msg.request_id)
        if hold is None:
            return []
        if not msg.missing:
            effects = self._release(msg.session)
            return effects + hold.failure(store_failure_reason(msg), msg.detail)
        return [self._build_baseline(hold)]

    def _build_baseline(self, hold: Hold, *, known_only: bool = False) -> BuildBaseline:
        """The question for a new session's baseline: its profile's, with the ``final_answer``
        tool of the turn's output schema, or else of the profile's."""
        agent = hold.agent or DEFAULT_AGENT
        output = hold.output or self.agents.get(agent).output
        return BuildBaseline(hold.session, agent, output, known_only)

    def _agent_fits(self, hold: Hold, stored: str) -> bool:
        """Whether ``hold`` may run a session stored with profile ``stored``."""
        return stored in self.agents and (hold.agent is None or hold.agent == stored)

    def _wrong_agent(self, hold: Hold, stored: str) -> Effects:
        """Release ``hold`` and answer it ``WRONG_AGENT`` (nothing was stored for it)."""
        if stored not in self.agents:
            detail = (
                f"session {hold.session} runs the agent profile {stored}, which the config no "
                f"longer has (add [agents.{stored}] back to resume it)"
            )
        else:
            detail = (
                f"session {hold.session} runs the agent profile {stored}, not {hold.agent}: "
                "a stored session keeps its agent"
            )
        effects = self._release(hold.session)
        return effects + hold.failure(FailReason.WRONG_AGENT, detail, turn_began=False)

    def loaded(self, msg: SessionLoaded) -> Effects:
        """The store opened (or created) a session: start its actor and run the turn."""
        session = msg.record.id
        hold = self._current(session, msg.request_id)
        if hold is None:
            return []  # answered already (cancelled, or the runtime is stopping)
        if not self._agent_fits(hold, msg.record.agent):
            return self._wrong_agent(hold, msg.record.agent)
        if not output_fits(hold.output, output_spec(msg.record.baseline)):
            return self._wrong_output(hold)
        if hold.is_child:  # resumed after a restart: a typed child's JSON reaches its parent uncut
            hold.output = output_spec(msg.record.baseline)
        # Created with the turn's user message (OpenSession.first): the turn asks the model.
        stored = msg.created and msg.record.turns == 1
        return self._start_session(msg.record, hold.run_turn(stored=stored))

    def _wrong_output(self, hold: Hold) -> Effects:
        """Release ``hold`` and answer it ``WRONG_OUTPUT`` (nothing was stored for it)."""
        effects = self._release(hold.session)
        detail = wrong_output_detail(hold.session)
        return effects + hold.failure(FailReason.WRONG_OUTPUT, detail, turn_began=False)

    def _start_session(self, record: SessionRecord, run: RunTurn) -> Effects:
        """Ask for the actor of ``record``, a new incarnation, to be started, then told ``run``."""
        return [StartSession(record, next(self.incarnations), run)]

    def started(self, asked: StartSession, ref: object) -> Effects:
        """The answer to :class:`StartSession`: the actor ``ref`` runs; tell it its turn, and
        passivate the least recently used idle sessions past ``sessions.max_live``."""
        session = asked.record.id
        record = asked.record
        self.live[session] = Live(
            ref, asked.incarnation, record.agent, output_spec(record.baseline)
        )
        hold = self.holds.get(session)
        effects: Effects = []
        if hold is not None:
            hold.incarnation = asked.incarnation
            effects += self.desk.carrying_out(session, asked.run)
            effects += self._tell_live(hold, asked.run)
        for idle in self.idle.over_limit(len(self.live)):
            effects += self._passivate(idle, "sessions.max_live")
        return effects

    def start_failed(self, asked: StartSession, detail: str) -> Effects:
        """The session actor could not start: the turn fails ``crashed``."""
        hold = self.holds.get(asked.record.id)
        if hold is None:
            return []
        effects = self._release(hold.session)
        detail = f"could not start the session actor: {detail}"
        return effects + hold.failure(FailReason.CRASHED, detail)

    def _running(self, hold: Hold) -> bool:
        """True if ``hold``'s turn has been told to the live actor that runs it."""
        live = self.live.get(hold.session)
        return live is not None and hold.incarnation != 0 and live.incarnation == hold.incarnation

    def _tell_live(
        self,
        hold: Hold,
        message: RunTurn | Cancel | BackgroundReport,
        *,
        then: tuple[ContextEffect, ...] = (),
        if_gone: IfGone = IfGone.NOTHING,
        otherwise: tuple[ContextEffect, ...] = (),
    ) -> Effects:
        """Tell ``message`` to the live actor running ``hold``; if there is none, what
        ``if_gone`` and ``otherwise`` say at once.

        An actor can die between two of our messages; its SessionCrashed (or SessionStopped)
        is then on its way, and the hold is answered when it arrives.
        """
        live = self.live.get(hold.session)
        if live is None or live.incarnation != hold.incarnation:
            return self._gone(hold.session, if_gone, otherwise)
        tell = TellSession(
            hold.session, live.incarnation, live.ref, message, then, if_gone, otherwise
        )
        return [tell]

    def undelivered(self, told: TellSession) -> Effects:
        """The answer to a :class:`TellSession` whose actor was dead: what to do instead."""
        return self._gone(told.session, told.if_gone, told.otherwise)

    def _gone(self, session: str, if_gone: IfGone, otherwise: tuple[ContextEffect, ...]) -> Effects:
        if if_gone is IfGone.REOPEN:
            hold = self.holds.get(session)
            if hold is None:
                return list(otherwise)
            hold.incarnation = 0
            self.live.pop(session, None)  # stopped from outside: rebuild it from the store
            return [*otherwise, *self._ask_store(hold, None)]
        if if_gone is IfGone.RELEASE:
            return [*self._release(session), *otherwise]
        return list(otherwise)

    def _release(self, session: str) -> Effects:
        hold = self.holds.release(session)
        effects: Effects = []
        if hold is None:
            return effects
        if hold.is_child:
            self.background.end(session)
        else:
            self.background.returned(hold)  # reports it was told and did not store wait again
        if hold.is_child and self.config.loop.child_timeout_s is not None:
            effects.append(CancelTimer(session))
        if self.budgets is not None and (hold.background or not hold.is_child):
            self.budgets.close(session)
        return effects

    # Ends (SPEC 5, steps 6 and 7).

    def turn_ended(self, msg: SessionTurnEnded) -> Effects:
        """A session's turn ended: route its outcome to the user or to the parent's call."""
        self.background.delivered(msg.reports)
        hold = self.holds.get(msg.session)
        if hold is None:
            # Answered already (a cancel that found the child's actor retired just before
            # this arrived): a child's actor is gone all the same.
            if msg.session.startswith(CHILD_PREFIX):
                self.live.pop(msg.session, None)
            return []
        effects: Effects = []
        outcome = msg.outcome
        stale = isinstance(outcome, TurnFailed) and outcome.reason is FailReason.STORE_ERROR
        if hold.parent is not None or stale:
            # A child runs one turn. A session after a store error holds messages the store
            # did not take. Either way its actor goes; the stored session stays.
            live = self.live.pop(msg.session, None)
            if live is not None and hold.parent is None:
                effects.append(StopSession(live.ref))  # a child has stopped itself
            effects += self._give_back(msg.session)
        effects += self._release(msg.session)
        if hold.parent is None:
            if msg.session in self.live:
                self.idle.idle(msg.session, self.clock().timestamp())
            effects.append(Reply(hold.reply_to, outcome))
            return effects + self._deliver(msg.session)  # reports waiting for it: a new turn
        effects.append(UpdateMemory(msg.session, msg.turns))
        if hold.answered:
            return effects
        summary_chars = self.config.compact.summary_chars
        return effects + hold.child_answer(msg.outcome, msg.untrusted, summary_chars)

    def _forget(self, session: str, incarnation: int) -> tuple[Hold | None, Effects]:
        """Drop actor ``incarnation`` of ``session`` and the hold it ran; returns the hold if
        its waiter still needs an answer.

        A message from an earlier actor of the same id (stopped, then replaced) changes nothing.
        """
        effects: Effects = []
        live = self.live.get(session)
        if live is not None and live.incarnation == incarnation:
            del self.live[session]
            self.idle.busy(session)
            effects += self._give_back(session)
        hold = self.holds.get(session)
        if hold is None or hold.incarnation != incarnation:
            return None, effects
        effects += self._release(session)
        return (None if hold.answered else hold), effects

    def give_back(self, session: str) -> Effects:
        """:meth:`_give_back`, for the approval desk."""
        return self._give_back(session)

    def release(self, session: str) -> Effects:
        """:meth:`_release`, for the approval desk."""
        return self._release(session)

    def _give_back(self, session: str) -> Effects:
        """``session``'s actor is gone: a store with per-session locks may now let another
        process run it. Told only to such a store: for SQLite it would be a wake-up of the
        store's thread for nothing, on every child."""
        if self.config.store.locks_sessions:
            return [ToStore(ReleaseSession(session))]
        return []

    def crashed(self, msg: SessionCrashed) -> Effects:
        """A session actor failed or was stopped during a turn: its waiter hears ``crashed``."""
        self.background.delivered(msg.reports)
        hold, effects = self._forget(msg.session, msg.incarnation)
        if hold is not None:
            effects += hold.failure(FailReason.CRASHED, msg.detail)
        return effects

    def stopped(self, msg: SessionStopped) -> Effects:
        """An idle session actor stopped; a turn it was sent but never began fails."""
        hold, effects = self._forget(msg.session, msg.incarnation)
        if hold is not None:
            # It stopped before the RunTurn it was sent could start: that turn will not run.
            detail = "the session actor stopped before its turn began"
            effects += hold.failure(FailReason.CRASHED, detail)
        return effects

    # Passivation: an idle session's actor stops; its next turn rebuilds it from the store.

    def _arm_sweep(self) -> Effects:
        """The next look for idle sessions, if there is an idle limit (one timer at a time)."""
        if self.idle.idle_s <= 0:
            return []
        return [ArmSweep(min(self.idle.idle_s, SWEEP_MAX_S))]

    def tick(self, tick: Tick) -> Effects:
        """Passivate every session idle for ``sessions.idle_s`` at the tick's time (our clock's
        time for a Tick without one, which is also what re-arms the timer)."""
        now = tick.now if tick.now is not None else self.clock()
        effects: Effects = []
        for session in self.idle.expired(now.timestamp()):
            effects += self._passivate(session, "sessions.idle_s")
        if self.idle.idle_s > 0:  # and the sessions whose calls waited as long for a person
            effects += self.desk.passivate(now.timestamp(), self.idle.idle_s)
        if tick.now is None:
            effects += self._arm_sweep()
        return effects

    def _passivate(self, session: str, why: str) -> Effects:
        """Stop ``session``'s idle actor. Everything of it is stored already (a turn ends only
        after its last write is), and the store answers in order, so the next turn's
        ``OpenSession`` reads it all back."""
        live = self.live.pop(session, None)
        if live is None or self.holds.get(session) is not None:
            log.error("context: %s is not an idle live session; not passivated", session)
            if live is not None:
                self.live[session] = live
            return []
        log.debug("context: passivating %s (%s)", session, why)
        # A shared store may now let another process run it (its lock goes).
        return [StopSession(live.ref), *self._give_back(session)]

    # Cancellation and time limits.

    def cancel(
        self, session: str, reason: FailReason, detail: str
    ) -> tuple[tuple[str, ...], Effects]:
        """Cancel the held turns of ``session`` and its descendants; returns their ids, and
        the effects. A turn told to cancel before, still winding down, is left out."""
        family: list[str] = []
        effects: Effects = []
        for held in self.holds.family(session):
            hold = self.holds.get(held)
            if hold is None or hold.cancelled:
                continue
            hold.cancelled = True
            family.append(held)
            if hold.background and held != session:
                hold.silent = True  # cancelled with an ancestor: it reports nothing
            # A live session answers through SessionTurnEnded; one still opening (no actor
            # yet to tell) is let go and answered here.
            answer = () if hold.answered else tuple(hold.failure(reason, detail))
            effects += self.desk.cancelled(held, reason, detail)
            effects += self._tell_live(
                hold, Cancel(reason, detail), if_gone=IfGone.RELEASE, otherwise=answer
            )
        return tuple(family), effects

    def timed_out(self, msg: ChildTimedOut) -> Effects:
        """A child outlived ``loop.child_timeout_s``: its parent hears ``timeout`` now, and
        the child is cancelled."""
        hold = self.holds.get(msg.child)
        if hold is None or hold.spawn != msg.spawn or hold.answered:
            return []
        effects: Effects = [CancelTimer(msg.child, fired=True)]
        limit = self.config.loop.child_timeout_s
        detail = f"the child outlived loop.child_timeout_s ({limit} s)"
        # The child's own TurnEnded comes when its cancelled turn winds down.
        effects += hold.failure(FailReason.TIMEOUT, detail, turn_began=False)
        hold.answered = True
        _family, cancelled = self.cancel(msg.child, FailReason.CANCELLED, detail)
        return effects + cancelled
