"""The Context actor: the shell that carries out what :class:`ContextState` decides.

The decisions (holds, spawn limits, the live table, where an ended turn's outcome goes,
passivation, cancels, budgets) live in ``actors.core.context_state``. This actor owns what
they need and cannot own: the directory, the session actors it starts, the dispatcher's
timers and the memory source, and it turns each effect into one message or call.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, cast

import pykka

from actors.core.agents import Agents
from actors.core.config import Config
from actors.core.context_effects import (
    ArmApprovalTimer,
    ArmSweep,
    BuildBaseline,
    CancelApprovalTimer,
    CancelTimer,
    ContextEffect,
    Emit,
    Reply,
    Report,
    StartSession,
    StartTimer,
    StopSession,
    TellSession,
    ToModel,
    ToSession,
    ToStore,
    UpdateMemory,
)
from actors.core.context_state import SWEEP_MAX_S, ContextState
from actors.core.dispatch import Registry
from actors.core.output import with_output
from actors.core.spawn import build_baseline
from actors.dispatcher import DispatchedActor, TimerHandle
from actors.dispatcher.directory import CONTEXT, EVENTS, MODEL, STORE, Directory, session_address
from actors.sessions.remote import RemoteSessionActor, is_remote
from actors.sessions.session import SessionActor, SessionEnv
from actors.stores.base import StoreError
from actors.stores.memory import MemorySource
from messages import (
    ApprovalStored,
    ApprovalTimedOut,
    ApproveCall,
    BackgroundLoaded,
    BackgroundSaved,
    Baseline,
    CancelModelRequest,
    CancelTurn,
    ChildTimedOut,
    DenyCall,
    DropApprovals,
    FailReason,
    Inspect,
    ListApprovals,
    MemoryWarning,
    ModelRequest,
    Parked,
    Remember,
    ScheduledTurn,
    SessionCrashed,
    SessionLoaded,
    SessionStopped,
    SessionTurnEnded,
    StartTurn,
    StoreApproval,
    StoredApproval,
    StoreFailed,
    SubagentCompleted,
    SubagentFailed,
    SubagentRequest,
    Tick,
    TokensSpent,
    ToolDone,
    ToolResult,
    WaitFamily,
)

BASELINES_KEPT = 16
"""Baselines the Context keeps built (one per profile and memory block); past it, it starts
over."""

__all__ = ["BASELINES_KEPT", "SWEEP_MAX_S", "ContextActor"]

log = logging.getLogger(__name__)


class ContextActor(DispatchedActor):
    """One per runtime. Owns the configuration, the memory source, the session actors it
    starts and their timers; the only actor that starts sessions or spawns children. What to
    do with each message is its :class:`~actors.core.context_state.ContextState`'s decision.

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
        approvals: Sequence[StoredApproval] = (),
    ) -> None:
        super().__init__(session_env.dispatcher)
        self.config = config
        self.directory = directory
        self.registry = registry
        self.agents = session_env.agents or Agents(config, registry)
        self.memory = memory
        self.session_env = session_env
        self.clock = clock
        self.state = ContextState(config, self.agents, clock, CONTEXT)
        self.sweep: TimerHandle | None = None
        self.timers: dict[str, TimerHandle] = {}
        self.approval_timers: dict[tuple[str, int], TimerHandle] = {}
        self.restored = tuple(approvals)  # read from the store at the start
        self._baselines: dict[tuple[str, str, str, int], Baseline] = {}

    def on_start(self) -> None:
        self.directory.register(CONTEXT, self.actor_ref)
        self._carry_out(self.state.begin())
        restored, self.restored = self.restored, ()
        self._carry_out(self.state.desk.restore(restored))

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
        for timer in (*self.timers.values(), *self.approval_timers.values()):
            timer.cancel()
        self._carry_out(self.state.shut_down(detail))
        self.directory.unregister(CONTEXT, self.actor_ref)

    def on_receive(self, message: Any) -> Any:
        try:
            return self._handle(message)
        except Exception:
            # One bad message must not take down the actor every turn depends on.
            log.exception("context: handling %s failed", type(message).__name__)
            return None

    def _handle(self, message: Any) -> Any:
        state = self.state
        if isinstance(message, StartTurn):
            effects = state.start_turn(message)
        elif isinstance(message, ScheduledTurn):
            effects = state.scheduled(message)
        elif isinstance(message, SubagentRequest):
            effects = state.spawn(message)
        elif isinstance(message, SessionLoaded):
            effects = state.loaded(message)
        elif isinstance(message, StoreFailed):
            effects = state.store_failed(message)
        elif isinstance(message, SessionTurnEnded):
            effects = state.turn_ended(message)
        elif isinstance(message, SessionCrashed):
            effects = state.crashed(message)
        elif isinstance(message, SessionStopped):
            effects = state.stopped(message)
        elif isinstance(message, Remember):
            self._remember(message)
            return None
        elif isinstance(message, CancelTurn):
            family, effects = state.cancel(message.session, FailReason.CANCELLED, message.detail)
            self._carry_out(effects + state.settle())
            return family
        elif isinstance(message, ChildTimedOut):
            effects = state.timed_out(message)
        elif isinstance(message, Tick):
            effects = state.tick(message)
        elif isinstance(message, ModelRequest):
            effects = state.model_request(message)
        elif isinstance(message, CancelModelRequest):
            effects = state.cancel_model_request(message)
        elif isinstance(message, TokensSpent):
            effects = state.tokens_spent(message)
        elif isinstance(message, Inspect):
            return state.status()
        elif isinstance(message, BackgroundSaved):
            effects = state.background_saved(message)
        elif isinstance(message, BackgroundLoaded):
            effects = state.background_loaded(message)
        elif isinstance(message, WaitFamily):
            effects = state.wait_family(message)
        elif isinstance(message, StoreApproval):
            effects = state.desk.store(message)
        elif isinstance(message, StoredApproval):
            effects = state.desk.requested(message)
        elif isinstance(message, ApprovalStored):
            effects = state.desk.settled(message)
        elif isinstance(message, ApproveCall):
            effects = state.desk.approve(message)
        elif isinstance(message, DenyCall):
            effects = state.desk.deny(message)
        elif isinstance(message, ApprovalTimedOut):
            effects = state.desk.timed_out(message)
        elif isinstance(message, DropApprovals):
            effects = state.desk.dropped(message)
        elif isinstance(message, Parked):
            effects = state.desk.parked(message)
        elif isinstance(message, ListApprovals):
            return state.desk.book.pending()
        else:
            log.warning("context: unexpected message %r", message)
            return None
        self._carry_out(effects)
        if state.background.waiters:  # someone waits for a family to go idle
            self._carry_out(state.settle())
        return None

    def _carry_out(self, effects: list[ContextEffect]) -> None:
        """Do each effect in order. A question's answer (a baseline, a started actor, a tell
        that found its actor dead) goes back to the state at once, and what that returns is
        done in the question's place."""
        tell = self.directory.tell
        for effect in effects:
            if isinstance(effect, Emit):
                self._emit(effect.event)
            elif isinstance(effect, Reply):
                tell(effect.to, effect.message)
            elif isinstance(effect, ToSession):
                # A child's outcome for a parent that waits since the start resumes it.
                resumed = (
                    self.state.desk.child_answered(effect.session, effect.message)
                    if isinstance(effect.message, SubagentCompleted | SubagentFailed)
                    else None
                )
                if resumed is None:
                    tell(session_address(effect.session), effect.message)
                else:
                    self._carry_out(resumed)
            elif isinstance(effect, ToStore):
                tell(STORE, effect.message)
            elif isinstance(effect, ToModel):
                tell(MODEL, effect.message)
            elif isinstance(effect, TellSession):
                try:
                    cast("pykka.ActorRef[Any]", effect.ref).tell(effect.message)
                except pykka.ActorDeadError:
                    self._carry_out(self.state.undelivered(effect))
                else:
                    self._carry_out(list(effect.then))
            elif isinstance(effect, StartSession):
                self._carry_out(self._start_session(effect))
            elif isinstance(effect, BuildBaseline):
                self._carry_out(self._build_baseline(effect))
            elif isinstance(effect, StopSession):
                cast("pykka.ActorRef[Any]", effect.ref).stop(block=False)
            elif isinstance(effect, StartTimer):
                message = ChildTimedOut(effect.child, effect.spawn)
                self.timers[effect.child] = self.dispatcher.call_later(
                    effect.seconds, functools.partial(self._tell_me, message)
                )
            elif isinstance(effect, CancelTimer):
                timer = self.timers.pop(effect.child, None)
                if timer is not None and not effect.fired:
                    timer.cancel()
            elif isinstance(effect, ArmApprovalTimer):
                key = (effect.session, effect.call_id)
                timed_out = ApprovalTimedOut(effect.session, effect.call_id)
                self.approval_timers[key] = self.dispatcher.call_later(
                    effect.seconds, functools.partial(self._tell_me, timed_out)
                )
            elif isinstance(effect, CancelApprovalTimer):
                handle = self.approval_timers.pop((effect.session, effect.call_id), None)
                if handle is not None:
                    handle.cancel()
            elif isinstance(effect, ArmSweep):
                if self.sweep is not None:
                    self.sweep.cancel()
                self.sweep = self.dispatcher.call_later(
                    effect.seconds, functools.partial(self._tell_me, Tick())
                )
            elif isinstance(effect, Report):
                self._carry_out(
                    self.state.report(
                        effect.parent,
                        effect.child,
                        effect.call_id,
                        effect.text,
                        effect.untrusted,
                        effect.finished,
                    )
                )
            elif isinstance(effect, UpdateMemory):
                try:
                    self.memory.updated(effect.session, effect.turns)
                except Exception:
                    log.warning("memory.updated failed for %s", effect.session, exc_info=True)

    def _start_session(self, asked: StartSession) -> list[ContextEffect]:
        try:
            # A remote agent's child is a proxy of one remote task (A2A calling out).
            remote = is_remote(self.agents.get(asked.record.agent).profile)
            actor = RemoteSessionActor if remote else SessionActor
            ref = actor.start(asked.record, self.session_env, asked.incarnation)
        except Exception as exc:
            return self.state.start_failed(asked, str(exc))
        return self.state.started(asked, ref)

    def _build_baseline(self, asked: BuildBaseline) -> list[ContextEffect]:
        if asked.known_only:
            try:
                known = self._known_baseline(asked.agent)
                known = None if known is None else with_output(known, asked.output)
            except Exception:  # a stored session must not fail on it: the store decides
                log.debug("a known baseline for %s failed", asked.session, exc_info=True)
                known = None
            if known is None:
                return self.state.baseline_unknown(asked)
            return self.state.baseline_built(asked, known)
        try:
            baseline = with_output(self._baseline(asked.session, asked.agent), asked.output)
        except Exception as exc:
            # Memory kept in a store out of reach (PostgreSQL's entries) is the store's failure.
            store = isinstance(exc, StoreError)
            reason = FailReason.STORE_ERROR if store else FailReason.SPAWN_ERROR
            return self.state.baseline_failed(asked, f"{type(exc).__name__}: {exc}", reason)
        return self.state.baseline_built(asked, baseline)

    def _known_baseline(self, agent: str) -> Baseline | None:
        """Profile ``agent``'s baseline if building it reads nothing, else None: the memory
        source knows its block without a read (``FileMemory.known_block``: no file, or the
        file unchanged since it was read) and the profile has no ``system_file``."""
        known = getattr(self.memory, "known_block", None)
        profile = self.agents.get(agent).profile
        if known is None or (profile.system is None and profile.system_file is not None):
            return None
        block = known()
        return None if block is None else self._cached_baseline(agent, block)

    def _baseline(self, session: str, agent: str) -> Baseline:
        """A new session's baseline for profile ``agent`` (reads memory, maybe a file)."""
        block = self.memory.block()
        self._memory_warnings(session)
        return self._cached_baseline(agent, block)

    def _cached_baseline(self, agent: str, block: str) -> Baseline:
        """Built once per profile, system prompt and memory block: every child of a quiet
        runtime gets the same object (which also spares the store encoding it again)."""
        system = self.agents.system_prompt(agent)
        key = (agent, system, block, self.registry.generation)  # MCP tools change it
        baseline = self._baselines.get(key)
        if baseline is None:
            baseline = build_baseline(system, self.agents.get(agent).registry, block)
            if len(self._baselines) >= BASELINES_KEPT:
                self._baselines.clear()
            self._baselines[key] = baseline
        return baseline

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

    def _tell_me(self, message: Any) -> None:
        """Tell ourselves ``message`` from a timer; nothing if we have stopped meanwhile."""
        with contextlib.suppress(pykka.ActorDeadError):
            self.actor_ref.tell(message)

    def _emit(self, event: Any) -> None:
        self.session_env.tracer.on_event(event, None)
        self.directory.tell(EVENTS, event)
