"""The Context actor: holds session ids, starts session actors, spawns children, routes answers."""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any

import pykka

from actors.core.agents import Agents
from actors.core.budget import Budgets
from actors.core.config import DEFAULT_AGENT, Config
from actors.core.dispatch import ArgumentError, Registry, child_id, descends_from
from actors.core.passivation import IdleSessions
from actors.core.spawn import build_baseline, child_summary, child_text
from actors.dispatcher import DispatchedActor, TimerHandle
from actors.dispatcher.directory import CONTEXT, EVENTS, MODEL, STORE, Directory, session_address
from actors.sessions.session import SessionActor, SessionEnv, store_failure_reason
from actors.stores.base import StoreError
from actors.stores.memory import MemorySource
from messages import (
    Baseline,
    Cancel,
    CancelModelRequest,
    CancelTurn,
    ChatMessage,
    ChildTimedOut,
    ContextStatus,
    CreateChild,
    DenyReason,
    FailReason,
    Inspect,
    JobSkipped,
    MemoryWarning,
    ModelError,
    ModelRequest,
    OpenSession,
    ReleaseSession,
    Remember,
    RunTurn,
    ScheduledTurn,
    SessionCrashed,
    SessionLoaded,
    SessionRecord,
    SessionStopped,
    SessionTurnEnded,
    SlotPool,
    StartTurn,
    StoreFailed,
    SubagentCompleted,
    SubagentFailed,
    SubagentFinished,
    SubagentRequest,
    SubagentStarted,
    Tick,
    TokensSpent,
    ToolDone,
    ToolResult,
    TurnCompleted,
    TurnEnded,
    TurnFailed,
    denial_message,
)
from messages.ids import CHILD_PREFIX

BASELINES_KEPT = 16
"""Baselines the Context keeps built (one per profile and memory block); past it, it starts
over."""

__all__ = ["BASELINES_KEPT", "SWEEP_MAX_S", "ContextActor", "Hold", "HoldTable", "Live"]

log = logging.getLogger(__name__)

SWEEP_MAX_S = 60.0
"""The longest time between two looks for idle sessions (``sessions.idle_s`` if shorter)."""


def baseline_failure(exc: Exception) -> FailReason:
    """Why a turn fails whose baseline could not be built: ``store_error`` when the memory
    lives in a store that is out of reach (PostgreSQL's entries), else ``spawn_error``."""
    return FailReason.STORE_ERROR if isinstance(exc, StoreError) else FailReason.SPAWN_ERROR


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

    @property
    def is_child(self) -> bool:
        """True for a subagent's turn."""
        return self.parent is not None


@dataclass(frozen=True)
class Live:
    """A running session actor, and its number among the actors of that id."""

    ref: pykka.ActorRef[Any]
    incarnation: int
    agent: str = DEFAULT_AGENT


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


class ContextActor(DispatchedActor):
    """One per runtime. Owns the configuration, the memory source, the hold table and the table
    of live session actors; the only actor that starts sessions or spawns children.

    It never waits: opening a session is a request to the store, a turn is a message to the
    session, and each answer comes back as a message that moves a hold along. A handler that
    fails is logged and the Context goes on; if the Context itself stops, every held turn is
    answered. It runs on the runtime's dispatcher (``session_env.dispatcher``), like the
    sessions; its only blocking work is the memory file, which it owns.
    """

    def __init__(
        self,
        config: Config,
        directory: Directory,
        registry: Registry,
        memory: MemorySource,
        session_env: SessionEnv,
        clock: Callable[[], datetime],
    ) -> None:
        super().__init__(session_env.dispatcher)
        self.config = config
        self.directory = directory
        self.registry = registry
        self.agents = session_env.agents or Agents(config, registry)
        self.memory = memory
        self.session_env = session_env
        self.clock = clock
        self.holds = HoldTable()
        budget = config.loop.token_budget
        self.budgets = Budgets(budget) if budget is not None else None
        self.live: dict[str, Live] = {}
        sessions = config.sessions
        self.idle = IdleSessions(sessions.idle_s, sessions.max_live)
        self.sweep: TimerHandle | None = None
        self.timers: dict[str, TimerHandle] = {}
        self.incarnations = itertools.count(1)
        self.spawns = itertools.count(1)
        self.requests = itertools.count(1)
        self._baselines: dict[tuple[str, str, str, int], Baseline] = {}

    def on_start(self) -> None:
        self.directory.register(CONTEXT, self.actor_ref)
        self._arm_sweep()

    def on_stop(self) -> None:
        self._shut_down("the runtime stopped")

    def on_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._shut_down(f"the Context failed: {exception_value}")

    def _shut_down(self, detail: str) -> None:
        """Answer every held turn CANCELLED and tell every running one to stop working."""
        if self.sweep is not None:
            self.sweep.cancel()
        for timer in self.timers.values():
            timer.cancel()
        for hold in self.holds.drain():
            if hold.answered:
                continue
            # A session that gets the Cancel ends its turn (storing what keeps its transcript
            # valid) and emits its own TurnEnded; its answer to us would come too late.
            told = self._tell_live(hold, Cancel(FailReason.CANCELLED, detail))
            if hold.parent is not None:
                if not told:
                    self._emit(
                        TurnEnded(
                            session=hold.session,
                            completed=False,
                            reason=FailReason.CANCELLED,
                            detail=detail,
                        )
                    )
                continue  # its parent is being cancelled too
            if told:
                failed = TurnFailed(hold.session, FailReason.CANCELLED, detail)
                self.directory.tell(hold.reply_to, failed)
            else:
                self._answer_failure(hold, FailReason.CANCELLED, detail)
        self.directory.unregister(CONTEXT, self.actor_ref)

    def on_receive(self, message: Any) -> Any:
        try:
            return self._handle(message)
        except Exception:
            # One bad message must not take down the actor every turn depends on.
            log.exception("context: handling %s failed", type(message).__name__)
            return None

    def _handle(self, message: Any) -> Any:
        if isinstance(message, StartTurn):
            self._start_turn(message)
        elif isinstance(message, ScheduledTurn):
            self._scheduled(message)
        elif isinstance(message, SubagentRequest):
            self._spawn(message)
        elif isinstance(message, SessionLoaded):
            self._loaded(message)
        elif isinstance(message, StoreFailed):
            self._store_failed(message)
        elif isinstance(message, SessionTurnEnded):
            self._turn_ended(message)
        elif isinstance(message, SessionCrashed):
            self._crashed(message)
        elif isinstance(message, SessionStopped):
            self._stopped(message)
        elif isinstance(message, Remember):
            self._remember(message)
        elif isinstance(message, CancelTurn):
            return self._cancel(message.session, FailReason.CANCELLED, message.detail)
        elif isinstance(message, ChildTimedOut):
            self._timed_out(message)
        elif isinstance(message, Tick):
            self._sweep(message)
        elif isinstance(message, ModelRequest):
            self._model_request(message)
        elif isinstance(message, CancelModelRequest):
            self.directory.tell(MODEL, message)  # after the request it cancels
        elif isinstance(message, TokensSpent):
            if self.budgets is not None:
                self.budgets.spend(message.session, message.usage)
        elif isinstance(message, Inspect):
            return ContextStatus(held=self.holds.held(), live=tuple(sorted(self.live)))
        else:
            log.warning("context: unexpected message %r", message)
        return None

    # A user's turn.

    def _start_turn(self, msg: StartTurn) -> None:
        hold = Hold(
            msg.session,
            msg.text,
            msg.speaker,
            reply_to=msg.reply_to,
            agent=msg.agent,
            trace=msg.trace,
        )
        if msg.agent is not None and msg.agent not in self.agents:
            detail = f"no agent profile is named {msg.agent} (see [agents.NAME] in the config)"
            self.directory.tell(
                msg.reply_to, TurnFailed(msg.session, FailReason.WRONG_AGENT, detail)
            )
            return
        if not self.holds.hold(hold):
            detail = f"session {msg.session} is busy: another turn holds it"
            self.directory.tell(msg.reply_to, TurnFailed(msg.session, FailReason.BUSY, detail))
            return
        self.idle.busy(msg.session)  # held: never passivated while its turn runs
        if self.budgets is not None:
            self.budgets.open(msg.session)
        self._open(hold, self.config.slots.home_slot("main"))

    def _model_request(self, msg: ModelRequest) -> None:
        """With ``loop.token_budget``, every model request passes here: it goes on to the model
        unless its family has spent the budget, when it is refused (``over_budget``)."""
        refusal = self.budgets.refusal(msg.session) if self.budgets is not None else None
        if refusal is None:
            self.directory.tell(MODEL, msg)
            return
        refused = ModelError(msg.session, msg.request_id, refusal, over_budget=True)
        self.directory.tell(msg.reply_to, refused)

    def _scheduled(self, msg: ScheduledTurn) -> None:
        # A job never piles onto a session that is busy, or waiting for its children.
        busy = self.holds.family(msg.session)
        if busy:
            skipped = JobSkipped(session=msg.session, job=msg.job, held=busy)
            self._emit(skipped)
            self.directory.tell(msg.reply_to, skipped)
            return
        self._start_turn(StartTurn(msg.session, msg.text, None, msg.reply_to))

    # A child's turn (SPEC 5, steps 1 to 4).

    def _spawn(self, msg: SubagentRequest) -> None:
        try:
            child = child_id(msg.parent, msg.call_id)
        except ArgumentError as exc:  # the session checks first; answer all the same
            self._deny(msg, denial_message(DenyReason.INVALID_ARGUMENTS, exc.detail))
            return
        limit = self.config.loop.max_children_total
        if self.holds.children() >= limit:
            detail = f"the runtime already runs {limit} children (loop.max_children_total)"
            self._deny(msg, denial_message(DenyReason.LIMIT, detail))
            return
        if msg.agent not in self.agents:  # the session checks first; answer all the same
            detail = f"unknown agent: {msg.agent}"
            self._deny(msg, denial_message(DenyReason.INVALID_ARGUMENTS, detail))
            return
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
        )
        if not self.holds.hold(hold):
            detail = f"session {child} is held already"
            self._answer_failure(hold, FailReason.BUSY, detail, turn_began=False)
            return
        self._emit(SubagentStarted(session=msg.parent, call_id=msg.call_id, child=child))
        timeout = self.config.loop.child_timeout_s
        if timeout is not None:
            message = ChildTimedOut(child, spawn)
            self.timers[child] = self.dispatcher.call_later(timeout, lambda: self._tell_me(message))
        self._create_child(hold, msg.untrusted)

    def _deny(self, msg: SubagentRequest, text: str) -> None:
        reply = ToolDone(msg.parent, ToolResult(msg.call_id, text))
        self.directory.tell(session_address(msg.parent), reply)

    def _create_child(self, hold: Hold, untrusted: bool) -> None:
        """SPEC 5, steps 2 and 4: a child's id is always new, so its actor starts at once on a
        record that holds its first message, and asks the model. The record is stored with
        the child's first write (its CreateChild, which the RunTurn carries): one store
        request and one transaction for a child that answers at once. The store opens a
        stored record only if that parent's spawn created it; the child's turn then starts
        over on it."""
        assert hold.parent is not None
        hold.slot = self.config.slots.home_slot("background")
        agent = hold.agent or DEFAULT_AGENT
        try:
            baseline = self._baseline(hold.session, agent)
        except Exception as exc:
            self._release(hold.session)
            detail = f"could not build the baseline: {type(exc).__name__}: {exc}"
            self._answer_failure(hold, baseline_failure(exc), detail)
            return
        first = ChatMessage(role="user", content=hold.text)
        create = CreateChild(
            hold.session, hold.parent, baseline, hold.slot, untrusted, first, CONTEXT, agent=agent
        )
        record = SessionRecord(
            hold.session,
            baseline,
            hold.slot,
            (first,),
            turns=1,
            next_call_id=1,
            untrusted=untrusted,
            parent=hold.parent,
            agent=agent,
        )
        run = RunTurn(hold.text, stored=True, pool="background", trace=hold.trace, create=create)
        self._start_session(hold, record, run)

    # Opening a session: a live actor, or the store (SPEC 5, step 4).

    def _open(self, hold: Hold, slot: int) -> None:
        hold.slot = slot
        live = self.live.get(hold.session)
        if live is not None:
            if not self._agent_fits(hold, live.agent):
                return
            hold.incarnation = live.incarnation
            if self._tell_live(hold, self._run_turn(hold)):
                return
            hold.incarnation = 0
            self.live.pop(hold.session, None)  # stopped from outside: rebuild it from the store
        # Open first; only a session that is not stored needs a baseline (and so memory).
        self._ask_store(hold, None)

    @staticmethod
    def _run_turn(hold: Hold) -> RunTurn:
        pool: SlotPool = "background" if hold.is_child else "main"
        return RunTurn(hold.text, hold.speaker, pool=pool, trace=hold.trace)

    def _ask_store(self, hold: Hold, baseline: Baseline | None) -> None:
        hold.open_request = next(self.requests)
        request = OpenSession(
            hold.session,
            baseline,
            hold.slot,
            CONTEXT,
            request_id=hold.open_request,
            agent=hold.agent or DEFAULT_AGENT,
        )
        self.directory.tell(STORE, request)

    def _current(self, session: str, request_id: int) -> Hold | None:
        """The hold a store answer belongs to, or None for a late answer."""
        hold = self.holds.get(session)
        if hold is None or hold.open_request != request_id or hold.answered:
            return None
        return hold

    def _store_failed(self, msg: StoreFailed) -> None:
        hold = self._current(msg.session, msg.request_id)
        if hold is None:
            return
        if not msg.missing:
            self._release(msg.session)
            self._answer_failure(hold, store_failure_reason(msg), msg.detail)
            return
        try:
            baseline = self._baseline(hold.session, hold.agent or DEFAULT_AGENT)
        except Exception as exc:
            self._release(hold.session)
            detail = f"could not build the baseline: {type(exc).__name__}: {exc}"
            self._answer_failure(hold, baseline_failure(exc), detail)
            return
        self._ask_store(hold, baseline)

    def _baseline(self, session: str, agent: str) -> Baseline:
        """A new session's baseline for profile ``agent`` (reads memory, maybe a file).

        Built once per profile, system prompt and memory block: every child of a quiet
        runtime gets the same object (which also spares the store encoding it again)."""
        block = self.memory.block()
        self._memory_warnings(session)
        system = self.agents.system_prompt(agent)
        key = (agent, system, block, self.registry.generation)  # MCP tools change it
        baseline = self._baselines.get(key)
        if baseline is None:
            baseline = build_baseline(system, self.agents.get(agent).registry, block)
            if len(self._baselines) >= BASELINES_KEPT:
                self._baselines.clear()
            self._baselines[key] = baseline
        return baseline

    def _agent_fits(self, hold: Hold, stored: str) -> bool:
        """Whether ``hold`` may run a session stored with profile ``stored``; if not, the hold
        is released and answered ``WRONG_AGENT`` (nothing was stored for it)."""
        if stored not in self.agents:
            detail = (
                f"session {hold.session} runs the agent profile {stored}, which the config no "
                f"longer has (add [agents.{stored}] back to resume it)"
            )
        elif hold.agent is not None and hold.agent != stored:
            detail = (
                f"session {hold.session} runs the agent profile {stored}, not {hold.agent}: "
                "a stored session keeps its agent"
            )
        else:
            return True
        self._release(hold.session)
        self._answer_failure(hold, FailReason.WRONG_AGENT, detail, turn_began=False)
        return False

    def _loaded(self, msg: SessionLoaded) -> None:
        session = msg.record.id
        hold = self._current(session, msg.request_id)
        if hold is None:
            return  # answered already (cancelled, or the runtime is stopping)
        if not self._agent_fits(hold, msg.record.agent):
            return
        self._start_session(hold, msg.record, self._run_turn(hold))

    def _start_session(self, hold: Hold, record: SessionRecord, run: RunTurn) -> None:
        """Start the actor of ``record`` for ``hold`` and tell it ``run``."""
        incarnation = next(self.incarnations)
        try:
            ref = SessionActor.start(record, self.session_env, incarnation)
        except Exception as exc:
            self._release(hold.session)
            detail = f"could not start the session actor: {exc}"
            self._answer_failure(hold, FailReason.CRASHED, detail)
            return
        self.live[hold.session] = Live(ref, incarnation, record.agent)
        hold.incarnation = incarnation
        self._tell_live(hold, run)
        for idle in self.idle.over_limit(len(self.live)):
            self._passivate(idle, "sessions.max_live")

    def _tell_live(self, hold: Hold, message: Any) -> bool:
        """Tell ``message`` to the live actor running ``hold``; False if there is none.

        An actor can die between two of our messages; its SessionCrashed (or SessionStopped)
        is then on its way, and the hold is answered when it arrives.
        """
        live = self.live.get(hold.session)
        if live is None or live.incarnation != hold.incarnation:
            return False
        try:
            live.ref.tell(message)
        except pykka.ActorDeadError:
            return False
        return True

    def _release(self, session: str) -> Hold | None:
        timer = self.timers.pop(session, None)
        if timer is not None:
            timer.cancel()
        hold = self.holds.release(session)
        if hold is not None and not hold.is_child and self.budgets is not None:
            self.budgets.close(session)
        return hold

    # Ends (SPEC 5, steps 6 and 7).

    def _turn_ended(self, msg: SessionTurnEnded) -> None:
        hold = self.holds.get(msg.session)
        if hold is None:
            # Answered already (a cancel that found the child's actor retired just before
            # this arrived): a child's actor is gone all the same.
            if msg.session.startswith(CHILD_PREFIX):
                self.live.pop(msg.session, None)
            return
        outcome = msg.outcome
        stale = isinstance(outcome, TurnFailed) and outcome.reason is FailReason.STORE_ERROR
        if hold.parent is not None or stale:
            # A child runs one turn. A session after a store error holds messages the store
            # did not take. Either way its actor goes; the stored session stays.
            live = self.live.pop(msg.session, None)
            if live is not None and hold.parent is None:
                live.ref.stop(block=False)  # a child has stopped itself (SessionActor.retired)
            self._give_back(msg.session)
        self._release(msg.session)
        if hold.parent is None:
            if msg.session in self.live:
                self.idle.idle(msg.session, self.clock().timestamp())
            self.directory.tell(hold.reply_to, outcome)
            return
        try:
            self.memory.updated(msg.session, msg.turns)
        except Exception:
            log.warning("memory.updated failed for %s", msg.session, exc_info=True)
        if hold.answered:
            return
        if isinstance(outcome, TurnCompleted):
            summary = child_summary(outcome.content, self.config.compact.summary_chars)
            reply: SubagentCompleted | SubagentFailed = SubagentCompleted(
                hold.parent, hold.call_id, msg.session, summary, msg.untrusted, outcome.usage
            )
            reason = None
        else:
            reason = outcome.reason
            reply = SubagentFailed(
                hold.parent,
                hold.call_id,
                msg.session,
                reason,
                msg.untrusted,
                outcome.detail,
                outcome.usage,
            )
        # The event first, so it reaches the bus before anything the parent does next.
        self._emit(
            SubagentFinished(
                session=hold.parent,
                call_id=hold.call_id,
                child=msg.session,
                completed=reason is None,
                reason=reason,
            )
        )
        self.directory.tell(session_address(hold.parent), reply)

    def _forget(self, session: str, incarnation: int) -> Hold | None:
        """Drop actor ``incarnation`` of ``session`` and the hold it ran; returns the hold if
        its waiter still needs an answer.

        A message from an earlier actor of the same id (stopped, then replaced) changes nothing.
        """
        live = self.live.get(session)
        if live is not None and live.incarnation == incarnation:
            del self.live[session]
            self.idle.busy(session)
            self._give_back(session)
        hold = self.holds.get(session)
        if hold is None or hold.incarnation != incarnation:
            return None
        self._release(session)
        return None if hold.answered else hold

    def _give_back(self, session: str) -> None:
        """``session``'s actor is gone: a store with per-session locks may now let another
        process run it. Told only to such a store: for SQLite it would be a wake-up of the
        store's thread for nothing, on every child."""
        if self.config.store.locks_sessions:
            self.directory.tell(STORE, ReleaseSession(session))

    def _crashed(self, msg: SessionCrashed) -> None:
        hold = self._forget(msg.session, msg.incarnation)
        if hold is not None:
            self._answer_failure(hold, FailReason.CRASHED, msg.detail)

    def _stopped(self, msg: SessionStopped) -> None:
        hold = self._forget(msg.session, msg.incarnation)
        if hold is not None:
            # It stopped before the RunTurn it was sent could start: that turn will not run.
            detail = "the session actor stopped before its turn began"
            self._answer_failure(hold, FailReason.CRASHED, detail)

    def _memory_warnings(self, session: str) -> None:
        """Emit what the memory source found wrong with its file (damage, a cut), if it says."""
        take = getattr(self.memory, "take_reports", None)
        for detail in take() if take is not None else ():
            self._emit(MemoryWarning(session=session, detail=detail))

    def _remember(self, msg: Remember) -> None:
        # The Context owns the memory source, so it does the write (the session asked).
        write = getattr(self.memory, "remember", None)
        if write is None:
            text = "Error: this runtime's memory source cannot be written"
        else:
            try:
                write(msg.text)
                text = "Remembered."
            except Exception as exc:
                text = f"Error: could not remember: {exc}"
        reply = ToolDone(msg.session, ToolResult(msg.call_id, text))
        self.directory.tell(session_address(msg.session), reply)

    # Passivation: an idle session's actor stops; its next turn rebuilds it from the store.

    def _arm_sweep(self) -> None:
        """Have the dispatcher's timer tell us a Tick when the next look for idle sessions is
        due (one timer pending at a time)."""
        if self.idle.idle_s <= 0:
            return
        if self.sweep is not None:
            self.sweep.cancel()
        period = min(self.idle.idle_s, SWEEP_MAX_S)
        self.sweep = self.dispatcher.call_later(period, lambda: self._tell_me(Tick()))

    def _tell_me(self, message: Any) -> None:
        """Tell ourselves ``message`` from a timer; nothing if we have stopped meanwhile."""
        with contextlib.suppress(pykka.ActorDeadError):
            self.actor_ref.tell(message)

    def _sweep(self, tick: Tick) -> None:
        """Passivate every session idle for ``sessions.idle_s`` at the tick's time (our clock's
        time for a Tick without one, which is also what re-arms the timer)."""
        now = tick.now if tick.now is not None else self.clock()
        for session in self.idle.expired(now.timestamp()):
            self._passivate(session, "sessions.idle_s")
        if tick.now is None:
            self._arm_sweep()

    def _passivate(self, session: str, why: str) -> None:
        """Stop ``session``'s idle actor. Everything of it is stored already (a turn ends only
        after its last write is), and the store answers in order, so the next turn's
        ``OpenSession`` reads it all back."""
        live = self.live.pop(session, None)
        if live is None or self.holds.get(session) is not None:
            log.error("context: %s is not an idle live session; not passivated", session)
            if live is not None:
                self.live[session] = live
            return
        log.debug("context: passivating %s (%s)", session, why)
        live.ref.stop(block=False)
        # A shared store may now let another process run it (its lock goes).
        self._give_back(session)

    # Cancellation and time limits.

    def _cancel(self, session: str, reason: FailReason, detail: str) -> tuple[str, ...]:
        """Cancel the held turns of ``session`` and its descendants; returns their ids."""
        family = self.holds.family(session)
        for held in family:
            hold = self.holds.get(held)
            if hold is None or self._tell_live(hold, Cancel(reason, detail)):
                continue  # a live session answers through SessionTurnEnded
            self._release(held)  # still opening: no actor yet to tell
            if not hold.answered:
                self._answer_failure(hold, reason, detail)
        return family

    def _timed_out(self, msg: ChildTimedOut) -> None:
        hold = self.holds.get(msg.child)
        if hold is None or hold.spawn != msg.spawn or hold.answered:
            return
        self.timers.pop(msg.child, None)
        limit = self.config.loop.child_timeout_s
        detail = f"the child outlived loop.child_timeout_s ({limit} s)"
        # The child's own TurnEnded comes when its cancelled turn winds down.
        self._answer_failure(hold, FailReason.TIMEOUT, detail, turn_began=False)
        hold.answered = True
        self._cancel(msg.child, FailReason.CANCELLED, detail)

    def _answer_failure(
        self, hold: Hold, reason: FailReason, detail: str, *, turn_began: bool = True
    ) -> None:
        """Answer whoever waits on ``hold`` with a failure the Context decided.

        A held turn that ends here ends with a ``TurnEnded`` event like any other; a request
        refused before it held anything (BUSY) has no turn to end. A child that failed this
        way passes no text to its parent, so it passes no untrusted flag either.
        """
        if turn_began:
            self._emit(
                TurnEnded(session=hold.session, completed=False, reason=reason, detail=detail)
            )
        if hold.parent is None:
            self.directory.tell(hold.reply_to, TurnFailed(hold.session, reason, detail))
            return
        self._emit(
            SubagentFinished(
                session=hold.parent,
                call_id=hold.call_id,
                child=hold.session,
                completed=False,
                reason=reason,
            )
        )
        failed = SubagentFailed(hold.parent, hold.call_id, hold.session, reason, False, detail)
        self.directory.tell(session_address(hold.parent), failed)

    def _emit(self, event: Any) -> None:
        self.session_env.tracer.on_event(event, None)
        self.directory.tell(EVENTS, event)
