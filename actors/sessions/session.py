"""The session actor: owns one session's state and carries out its turn's effects."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Any

import msgspec

from actors.core.agents import Agent, Agents
from actors.core.approvals import ApprovalPolicy
from actors.core.config import DEFAULT_AGENT, AgentConfig
from actors.core.dispatch import Registry
from actors.core.limits import Limits
from actors.core.output import FinalAnswer, OutputTypes
from actors.core.session_state import SessionState, store_failure_reason
from actors.core.turn import Turn, subagent_finished
from actors.core.turn_effects import (
    Announce,
    AskApproval,
    CallPort,
    CancelModel,
    CancelPort,
    Compact,
    DropWaiting,
    Effect,
    Emit,
    Finish,
    ForgetApprovals,
    Persist,
    RequestModel,
    Spawn,
    WriteMemory,
)
from actors.dispatcher import DispatchedActor, Dispatcher
from actors.dispatcher.directory import (
    CONTEXT,
    EVENTS,
    MCP,
    MODEL,
    PORT,
    STORE,
    Directory,
    session_address,
)
from actors.tracing.base import NoTracer, Tracer
from messages import (
    Appended,
    AppendMessages,
    ApprovalDecision,
    BackgroundReport,
    Cancel,
    CancelModelRequest,
    CancelPortCall,
    ChatMessage,
    CompactHistory,
    CreateChild,
    DropApprovals,
    FailReason,
    Inspect,
    ModelAnswer,
    ModelError,
    ModelRequest,
    Park,
    Parked,
    PortCall,
    Remember,
    RequestOptions,
    RunTurn,
    SessionCrashed,
    SessionLoaded,
    SessionRecord,
    SessionStopped,
    SessionTurnEnded,
    SlotPool,
    StoreApproval,
    StoreFailed,
    SubagentCompleted,
    SubagentFailed,
    SubagentRequest,
    TokensSpent,
    ToolDone,
)

__all__ = ["SessionActor", "SessionEnv", "store_failure_reason"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SessionEnv:
    """What every session actor of a runtime shares: addresses, tools, limits, clock, ids, and
    the dispatcher whose threads run them (and the Context)."""

    directory: Directory
    registry: Registry
    limits: Limits
    clock: Callable[[], datetime]
    request_ids: Iterator[int]
    dispatcher: Dispatcher
    agents: Agents | None = None
    """The runtime's agent profiles; None: only ``default``, with ``registry`` and no request
    fields."""
    budgeted: bool = False
    """``loop.token_budget`` is set: model requests go through the Context, which counts each
    family's spend and refuses a request once the budget is spent."""
    tracer: Tracer = field(default_factory=NoTracer)
    """Sees every event this runtime's sessions emit (tracing)."""
    approvals: Mapping[str, ApprovalPolicy] = field(default_factory=dict)
    """Each profile's calls that wait for a person (``[approvals]``); none listed: none."""

    def agent(self, name: str) -> Agent:
        """Profile ``name`` as this runtime has it; ``KeyError`` if there is none."""
        if self.agents is not None:
            return self.agents.get(name)
        if name != DEFAULT_AGENT:
            raise KeyError(name)
        return Agent(DEFAULT_AGENT, AgentConfig(), self.registry, RequestOptions())


class SessionActor(DispatchedActor):
    """One live session. It never waits on another actor: a turn waiting for the model, a tool
    or a child is just a state of its :class:`~actors.core.turn.Turn`, and answers arrive as
    messages. It can be stopped at any idle moment and rebuilt from the store. It runs on the
    runtime's dispatcher, so it must never block: every handler only computes and tells."""

    def __init__(self, record: SessionRecord, env: SessionEnv, incarnation: int = 0) -> None:
        super().__init__(env.dispatcher)
        self.state = SessionState.from_record(record)
        self.env = env
        self.incarnation = incarnation  # tells the Context which actor of this id speaks
        self.address = session_address(record.id)
        self.turn: Turn | None = None
        self.pool: SlotPool = "main"  # set by each RunTurn: a child's requests use background
        # The Context checks the profile before it starts a session, so this does not raise.
        self.agent = env.agent(record.agent)
        self.trace: dict[str, str] | None = None  # the running turn's trace context
        self.retired = False  # a child that stopped itself after its one turn
        # A new child's record, not stored yet: its first write creates it (RunTurn.create).
        self.create: CreateChild | None = None
        self.creating: int | None = None  # the request id of that first write, once sent
        self.text = ""  # the running turn's text, to start it over on a stored record

    # Life cycle.

    def on_start(self) -> None:
        self.env.directory.register(self.address, self.actor_ref)

    def on_stop(self) -> None:
        if not self.retired:  # the Context popped a retired child already: nothing to tell
            self._abandon("the session actor was stopped during its turn")
        self.env.directory.unregister(self.address, self.actor_ref)

    def on_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        name = exception_type.__name__ if exception_type else "error"
        self._abandon(f"the session actor failed: {name}: {exception_value}")
        self.env.directory.unregister(self.address, self.actor_ref)

    def _abandon(self, detail: str) -> None:
        # Whoever waits on this turn must hear of it; the Context turns this into an answer.
        # Stopped idle, the Context must still forget this actor (and a RunTurn it may lose).
        if self.turn is None or self.turn.done:
            self.env.directory.tell(CONTEXT, SessionStopped(self.state.id, self.incarnation))
            return
        turn, self.turn = self.turn, None
        # Report first: if the fault that stopped us strikes again below, the Context has
        # still heard, and its waiter is answered.
        crashed = SessionCrashed(
            self.state.id, detail, self.incarnation, tuple(turn.issued_reports)
        )
        self.env.directory.tell(CONTEXT, crashed)
        try:
            effects = turn.cancel(FailReason.CRASHED, detail)
            # Store the results that keep the transcript valid and stop the work in flight;
            # nothing else of the turn.
            kept = (Persist, CancelModel, CancelPort, DropWaiting)
            self._carry_out([e for e in effects if isinstance(e, kept)])
        except Exception:
            log.exception("%s: could not store the repair of its cut-off turn", self.state.id)

    # Messages.

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Inspect):
            return self.record()
        if isinstance(message, RunTurn):
            return self._start(message)
        if isinstance(message, Park):
            return self._park()
        if isinstance(message, ModelAnswer) and self.env.budgeted:
            # Told before anything the answer leads to, so the Context counts it before this
            # session's next request; an answer its turn no longer wants was spent all the same.
            self.env.directory.tell(CONTEXT, TokensSpent(self.state.id, message.usage))
        turn = self.turn
        if turn is None and isinstance(message, SubagentCompleted | SubagentFailed):
            # A child that answers a turn gone already: said as a call that failed.
            self._carry_out([Emit(subagent_finished(self.state.id, message, answered=False))])
            return None
        if turn is None:
            # A background report for a turn that just ended: the Context hears the turn did
            # not store it (SessionTurnEnded.reports) and runs it as a new turn.
            log.debug("%s: no turn for %s", self.state.id, type(message).__name__)
            return None
        if isinstance(message, Appended):
            effects = turn.persisted(message.request_id)
        elif isinstance(message, SessionLoaded):
            effects = self._created(turn, message)
        elif isinstance(message, StoreFailed):
            reason = store_failure_reason(message)
            effects = turn.store_failed(message.request_id, message.detail, reason)
        elif isinstance(message, ModelAnswer):
            effects = turn.model_answer(message)
        elif isinstance(message, ModelError):
            effects = turn.model_error(message)
        elif isinstance(message, ToolDone):
            effects = turn.tool_result(message.result)
        elif isinstance(message, SubagentCompleted | SubagentFailed):
            effects = turn.subagent_result(message)
        elif isinstance(message, Cancel):
            effects = turn.cancel(message.reason, message.detail, message.park, message.keep)
        elif isinstance(message, BackgroundReport):
            effects = turn.report(message)
        elif isinstance(message, ApprovalDecision):
            effects = turn.approval_decided(message)
        else:
            log.warning("%s: unexpected message %r", self.state.id, message)
            return None
        self._carry_out(effects)
        return None

    def _park(self) -> None:
        """The Context passivates this session while its calls wait for a person: park the
        turn if only those are left, and say whether it did."""
        turn = self.turn
        effects = turn.park() if turn is not None else None
        if effects is not None:
            self._carry_out(effects)
            self.turn = None
        parked = Parked(self.state.id, self.incarnation, effects is not None)
        self.env.directory.tell(CONTEXT, parked)

    def _start(self, message: RunTurn) -> None:
        if self.turn is not None:
            # The Context's hold makes this impossible; refuse loudly rather than mix two turns.
            log.error("%s: a turn is already running; RunTurn ignored", self.state.id)
            return
        self.pool = message.pool
        self.trace = message.trace
        self.create = message.create
        self.text = message.text
        self.turn = self._new_turn()
        if message.resume is not None:
            self._carry_out(self.turn.resume(message.resume))
            return
        # A new child's record is its first write; a top-level one is stored running already.
        marked = message.stored and message.create is None
        self._carry_out(
            self.turn.start(
                message.text,
                message.speaker,
                stored=message.stored,
                reports=message.reports,
                marked=marked,
            )
        )

    def _created(self, turn: Turn, message: SessionLoaded) -> list[Effect]:
        """The store's answer to this child's first write (its CreateChild)."""
        if message.request_id != self.creating:
            return []
        self.creating = None
        if message.created:
            return turn.persisted(message.request_id)
        # The id holds a record this parent's spawn made before (a turn a crash cut off):
        # that record is the truth, and the turn starts over on it. What this turn had (an
        # answer not stored) is dropped; the stored turn is repaired first, as on a restart.
        self.state = SessionState.from_record(message.record)
        self.turn = self._new_turn()
        return self.turn.start(self.text)

    def _new_turn(self) -> Turn:
        """A turn of this session, with the calls its profile makes wait for a person; a typed
        one (its baseline lists ``final_answer``) counts its tries, validated with msgspec when
        the runtime knows a Python type for it."""
        turn = Turn(
            self.state,
            self.agent.registry,
            self.env.limits,
            self.env.request_ids,
            self.env.clock,
            agent=self.agent.name,
            approvals=self.env.approvals.get(self.agent.name),
            slots=self.agent.options.backend != "openai",
        )
        types = self.env.agents.output_types if self.env.agents is not None else OutputTypes()
        rule = types.rule(self.state.baseline, self.env.limits.output_retries)
        if rule is not None:
            turn.output = FinalAnswer(rule)
        return turn

    def record(self) -> SessionRecord:
        """The session as it stands now, in the shape the store gives it."""
        return self.state.to_record()

    def _carry_out(self, effects: list[Effect]) -> None:
        tell = self.env.directory.tell
        s = self.state
        for effect in effects:
            if isinstance(effect, Emit):
                if effect.trace:
                    self.env.tracer.on_event(effect.event, self.trace)
                if effect.tell:
                    tell(EVENTS, effect.event)
            elif isinstance(effect, Persist) and self.create is not None:
                running = effect.running is not False
                tell(STORE, self._first_write(effect.request_id, effect.messages, running))
            elif isinstance(effect, Persist):
                tell(
                    STORE,
                    AppendMessages(
                        s.id,
                        effect.request_id,
                        effect.messages,
                        s.turns,
                        s.next_call_id,
                        s.untrusted,
                        self.address,
                        effect.reports,
                        effect.running,
                    ),
                )
            elif isinstance(effect, RequestModel):
                tell(
                    CONTEXT if self.env.budgeted else MODEL,
                    ModelRequest(
                        s.id,
                        effect.request_id,
                        effect.slot,
                        effect.messages,
                        s.baseline.tools,
                        self.address,
                        self.pool,
                        effect.prefer_slot,
                        self.agent.name,
                        self.agent.options,
                    ),
                )
            elif isinstance(effect, CancelModel):
                # Through the Context when the requests go that way, so a cancel never passes
                # the request it cancels.
                to = CONTEXT if self.env.budgeted else MODEL
                tell(to, CancelModelRequest(s.id, effect.request_id))
            elif isinstance(effect, CancelPort):
                tell(PORT, CancelPortCall(s.id, effect.call_id))
                if self.agent.registry.has_mcp:  # it may be an MCP call: nothing if not
                    tell(MCP, CancelPortCall(s.id, effect.call_id))
            elif isinstance(effect, CallPort):
                tell(
                    MCP if self.agent.registry.is_mcp(effect.name) else PORT,
                    PortCall(
                        s.id,
                        effect.call_id,
                        effect.name,
                        effect.arguments,
                        self.address,
                        s.untrusted,
                    ),
                )
            elif isinstance(effect, WriteMemory):
                tell(CONTEXT, Remember(s.id, effect.call_id, effect.text))
            elif isinstance(effect, Spawn):
                trace = self.env.tracer.call_trace(s.id, effect.call_id)
                request = SubagentRequest(
                    s.id,
                    effect.call_id,
                    effect.task,
                    s.untrusted,
                    effect.agent,
                    trace,
                    effect.background,
                )
                tell(CONTEXT, request)
            elif isinstance(effect, AskApproval):
                spawns, background = effect.spawns, effect.background
                ask = StoreApproval(
                    s.id, effect.request_id, effect.approval, self.address, spawns, background
                )
                tell(CONTEXT, ask)  # which adds what its family spent, and sends it on
            elif isinstance(effect, Announce):
                tell(CONTEXT, effect.approval)  # stored: the Context publishes the request
            elif isinstance(effect, ForgetApprovals):
                tell(STORE, DropApprovals(s.id, effect.call_ids))
            elif isinstance(effect, DropWaiting):
                tell(CONTEXT, DropApprovals(s.id, effect.call_ids))
            elif isinstance(effect, Compact):
                tell(STORE, CompactHistory(s.id, effect.request_id, effect.summary, self.address))
            elif isinstance(effect, Finish):
                delivered = tuple(self.turn.issued_reports) if self.turn is not None else ()
                self.turn = None
                if self.create is not None:  # it ends before it stored anything: store that
                    tell(STORE, self._first_write(0, ()))
                ended = SessionTurnEnded(s.id, effect.outcome, s.turns, s.untrusted, delivered)
                tell(CONTEXT, ended)
                if s.parent is not None:
                    # A child runs one turn. It stops itself here, on this thread, rather than
                    # wait for a stop from the Context (a message each way for nothing).
                    self.retired = True
                    self._stop()
                    return

    def _first_write(
        self, request_id: int, messages: tuple[ChatMessage, ...], running: bool = False
    ) -> CreateChild:
        """This new child's CreateChild, with ``messages`` to store after its first one."""
        create, self.create = self.create, None
        assert create is not None
        s = self.state
        self.creating = request_id
        return msgspec.structs.replace(
            create,
            untrusted=s.untrusted,
            reply_to=self.address,
            request_id=request_id,
            more=messages,
            next_call_id=s.next_call_id,
            running=running,
        )
