"""One turn of one session, as a state machine with no I/O (SPEC 4, 5 and 7).

The :class:`Turn` takes inputs (``start``, ``persisted``, ``model_answer``, ``tool_result``...)
and returns effects (``actors.core.turn_effects``: ``Persist``, ``RequestModel``, ``CallPort``,
``Spawn``, ``Emit``, ``Finish``...) for its session actor to carry out, on the session's
:class:`~actors.core.session_state.SessionState`. A test can drive a whole turn, compaction
included, without a thread. The rules it keeps:

- every message is made durable (``Persist``, answered by ``persisted``) before the next model
  request, and a tool call is only dispatched once the answer that numbers it is durable;
- tool calls take the next call ids in the model's order, run concurrently, and go back to the
  model in call order, whatever finished first;
- ``loop.max_steps`` model requests at most; calls still asked for at the limit are answered
  with a step-limit denial so the transcript stays valid, and the turn fails with TURN_LIMIT;
- after the turn, a transcript past ``compact.threshold_chars`` is summarised on the session's
  own slot; a failed compaction never changes the turn's outcome;
- when a slot's context size is known, a request whose prompt would fill more than
  ``compact.threshold_ratio`` of it first compacts the history before this turn (this turn's
  messages are kept as they are), and a request the server refuses as too long is compacted and
  sent once more. Prompt sizes are the tokens the server reported for the last request, plus
  the new messages counted at ``session_state.CHARS_PER_TOKEN``;
- an answer cut off at ``max_tokens`` never runs its tool calls, and a cut-off final answer
  fails the turn unless ``model.on_length`` keeps it;
- tool-call arguments that are not a JSON object are stored as ``{}`` with the model's text in
  ``raw_arguments``: servers refuse a history holding unparseable arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import msgspec

from actors.core import approval_steps, compaction_steps, ending_steps, output_steps
from actors.core.approval_steps import ApprovalWait
from actors.core.approvals import ApprovalPolicy
from actors.core.compaction_steps import COMPACT_INSTRUCTION, SUMMARY_PREFIX
from actors.core.dispatch import (
    CLOCK,
    REMEMBER,
    SUBAGENT,
    Answered,
    Registry,
    Remember,
    SpawnChild,
    ToPort,
    is_json_object,
)
from actors.core.dispatch import dispatch as route_call
from actors.core.limits import Limits
from actors.core.mcp_tools import untrusted_denial
from actors.core.output import Done, FinalAnswer
from actors.core.session_state import (
    SessionState,
    repair_results,
)
from actors.core.spawn import report_message, spawn_check, subagent_result_text
from actors.core.text import cap_chars
from actors.core.turn_effects import (
    CallPort,
    CancelModel,
    CancelPort,
    Effect,
    Emit,
    Finish,
    Persist,
    RequestModel,
    Spawn,
    WriteMemory,
)
from actors.core.turn_effects import TurnPhase as _Phase
from actors.core.usage import add_usage
from messages import (
    ApprovalDecision,
    BackgroundReport,
    ChatMessage,
    DataClass,
    DenyReason,
    FailReason,
    ModelAnswer,
    ModelAnswered,
    ModelError,
    ModelRequestSent,
    ProposedCall,
    Resume,
    SubagentCompleted,
    SubagentFailed,
    SubagentFinished,
    SubagentResult,
    ToolCall,
    ToolCallFinished,
    ToolCallStarted,
    ToolResult,
    TurnCompleted,
    TurnFailed,
    TurnOutcome,
    TurnStarted,
    Usage,
    denial_message,
)

__all__ = [
    "COMPACT_INSTRUCTION",
    "SUMMARY_PREFIX",
    "Limits",
    "Turn",
    "subagent_finished",
]


def subagent_finished(session: str, result: SubagentResult, *, answered: bool) -> SubagentFinished:
    """The event of a child's answer to ``session``'s call, told once the parent's turn has
    stored it (``answered``). A parent that no longer waits for the call (its turn ended, was
    cancelled, or answered the call otherwise) stored something else for it: the event then
    says the call failed, with the child's reason, or ``CANCELLED`` for a child that
    completed too late, so a subscriber is never told an outcome the parent does not hold."""
    completed = isinstance(result, SubagentCompleted)
    if isinstance(result, SubagentCompleted):
        reason = None if answered else FailReason.CANCELLED
    else:
        reason = result.reason
    return SubagentFinished(
        session=session,
        call_id=result.call_id,
        child=result.child,
        completed=answered and completed,
        reason=reason,
        detail=result.detail if isinstance(result, SubagentFailed) else "",
    )


def _stored(usage: Usage) -> Usage | None:
    """What an assistant message stores of its request's usage: nothing when the server said
    nothing (a scripted model, a server that sends no ``usage``)."""
    return usage if usage != Usage() else None


@dataclass
class Turn:
    """One turn of ``state``'s session. Create, call :meth:`start`, then feed it answers."""

    state: SessionState
    registry: Registry
    limits: Limits
    ids: Iterator[int]
    clock: Callable[[], datetime]
    agent: str = "default"  # the session's profile, named in its TurnStarted
    slots: bool = True
    """The profile's server has slots (not the ``openai`` backend): events name them."""
    step: int = 0
    phase: _Phase = _Phase.IDLE
    outcome: TurnOutcome | None = None
    _waiting_for: int | None = None
    _after_save: Callable[[], list[Effect]] | None = None
    _calls: list[ToolCall] = field(default_factory=list)
    _results: dict[int, ToolResult] = field(default_factory=dict)
    # Nothing is told before it is durable: events that wait for the next commit of _save,
    # and the result writes in flight (request id -> what each tells once it is stored).
    _told: list[Effect] = field(default_factory=list)
    _result_writes: dict[int, list[Effect]] = field(default_factory=dict)
    _stored: set[int] = field(default_factory=set)  # calls whose result is stored or storing
    _summary: ChatMessage | None = None
    _sent_first: bool = False  # its first write is sent: it marks the turn running
    _marked: bool = False  # the store holds the turn as running (a write of it is durable)
    _end_stored: bool = False  # the turn's last write stored its end (ending_steps)
    _end_told: Emit | None = None  # its TurnEnded, told once its end write is durable
    _finished: bool = False
    _turn_start: int = 0  # index of this turn's user message in the transcript
    _asked_len: int = 0  # transcript messages the request in flight carries
    _truncated: bool = False  # the answer being dispatched was cut off at max_tokens
    # A compaction in the middle of the turn: what follows it, and what follows its failure.
    _keep: tuple[ChatMessage, ...] = ()
    _after_compact: Callable[[], list[Effect]] | None = None
    _if_not_compacted: Callable[[str], list[Effect]] | None = None
    _compacted_early: bool = False
    _retried_too_long: bool = False
    usage: Usage = field(default_factory=Usage)
    """What the turn has spent so far: its own requests and its children's turns."""
    output: FinalAnswer | None = None
    """A typed session's tries (``actors.core.output``); None: the turn ends in text."""
    _reports: list[BackgroundReport] = field(default_factory=list)  # told, not yet stored
    issued_reports: list[str] = field(default_factory=list)
    """Background children whose reports this turn has sent to the store in its transcript."""
    approvals: ApprovalPolicy | None = None
    """Which calls wait for a person (``[approvals]``); None: none."""
    wait: ApprovalWait = field(default_factory=ApprovalWait)

    @property
    def event_slot(self) -> int | None:
        """The slot events name: the session's, or None where the server has no slots."""
        return self.state.slot if self.slots else None

    # Inputs.

    def start(
        self,
        text: str,
        speaker: str | None = None,
        *,
        stored: bool = False,
        reports: tuple[BackgroundReport, ...] = (),
        marked: bool = False,
    ) -> list[Effect]:
        """Begin the turn with the user's ``text``.

        ``stored``: the session was created with ``text`` as its last message and this turn
        counted (a new child), so the turn asks the model at once; ``marked``: that creation
        also stored it running (a top-level session's). ``reports``: background reports this
        turn delivers, ``text`` being the first one's (the others follow it).
        """
        if self.phase is not _Phase.IDLE:
            raise RuntimeError("a turn can only start once")
        # Traced now; told once the turn is stored as running (its first write), never before.
        started = TurnStarted(session=self.state.id, slot=self.event_slot, agent=self.agent)
        self._told.append(Emit(started, trace=False))
        traced = Emit(started, tell=False)
        if stored:  # a new child asks at once; its first write (its record) tells it started
            self._turn_start = len(self.state.transcript) - 1
            if marked:  # a new top-level session, stored running with its first message
                self._marked = self._sent_first = True
                self._told = []
                return [Emit(started), *self._ask()]
            return [traced, *self._ask()]
        self.state.turns += 1
        # A turn cut off by a crash left calls without results: answer them first.
        repairs = repair_results(self.state, self.registry, self.clock())
        self.state.decided.clear()  # answered by the repairs
        user = ChatMessage(role="user", content=text, name=speaker)
        self._turn_start = len(self.state.transcript) + len(repairs)
        more = tuple(report_message(r) for r in reports[1:])
        children = self._take_reports(reports)
        return [traced, *self._save((*repairs, user, *more), self._ask, children, running=True)]

    def report(self, report: BackgroundReport) -> list[Effect]:
        """A background child's outcome for this running turn: it goes into the transcript
        before the next model request. A turn that asks the model no more leaves it out of
        :attr:`issued_reports` (the Context then runs it as a new turn)."""
        if self.outcome is None and not self.done:
            self._reports.append(report)
        return []

    def _take_reports(self, reports: Iterable[BackgroundReport]) -> tuple[str, ...]:
        children = tuple(r.child for r in reports)
        if any(r.untrusted for r in reports):
            self.state.untrusted = True  # the child's text is in the parent's context now
        self.issued_reports += children
        return children

    def resume(self, order: Resume) -> list[Effect]:
        """Continue the turn the stored transcript cut off (``actors.core.approval_steps``)."""
        if self.phase is not _Phase.IDLE:
            raise RuntimeError("a turn can only start once")
        self._marked = self._sent_first = True  # stored as running before the crash or stop
        return approval_steps.resume(self, order)

    def approval_decided(self, decision: ApprovalDecision) -> list[Effect]:
        """A person (or the timeout) settled a call that waits: it runs, or is declined."""
        if self.phase is not _Phase.CALLING:
            return []
        if decision.denial:  # denied at once by the Context, nobody asked
            return approval_steps.denied_at_once(self, decision)
        return approval_steps.decided(self, decision)

    def park(self) -> list[Effect] | None:
        """Stop for now while only calls waiting for a person are left, to be resumed from
        the store (``approval_steps.park``); None if the turn cannot park now."""
        effects = approval_steps.park(self) if self.phase is _Phase.CALLING else None
        if effects is not None:
            self.phase = _Phase.DONE
            self._finished = True
        return effects

    def persisted(self, request_id: int) -> list[Effect]:
        """The store made ``request_id`` durable."""
        self._marked = True  # its first write, which marks it running, came first
        told = self._result_writes.pop(request_id, None)
        if told is not None:  # a result is durable: tell it, and go on once all are
            return [*told, *self._maybe_continue()] if self.phase is _Phase.CALLING else told
        if request_id in self.wait.storing:
            return approval_steps.stored(self, request_id)
        if request_id != self._waiting_for:
            return []
        self._waiting_for = None
        if self.phase is _Phase.COMPACTING:
            return compaction_steps.compacted(self)
        if self.phase is not _Phase.SAVING or self._after_save is None:
            return []
        after, self._after_save = self._after_save, None
        return after()

    def store_failed(
        self, request_id: int, detail: str, reason: FailReason = FailReason.STORE_ERROR
    ) -> list[Effect]:
        """The store could not do ``request_id``; the turn fails with ``reason`` (a new
        child's first write can also find its id taken, ``spawn_error``, or run elsewhere,
        ``busy``)."""
        if self._result_writes.pop(request_id, None) is not None:
            if self.done or self.outcome is not None:
                return []
            failed = TurnFailed(self.state.id, reason, detail)  # nobody is asked any more
            stop = [*self._stop_work(), *approval_steps.dropped(self, False)]
            return [*stop, *self.finish_turn(failed)]
        if request_id in self.wait.storing:
            return approval_steps.not_stored(self, request_id, detail)
        if request_id != self._waiting_for:
            return []
        self._waiting_for = None
        if self.phase is _Phase.COMPACTING:
            return compaction_steps.failed(self, f"the store could not compact: {detail}")
        if self.outcome is not None and self._after_save is not None:
            # Its end write failed: it ends all the same (the next start may end it again).
            after, self._after_save = self._after_save, None
            return after()
        return self.finish_turn(TurnFailed(self.state.id, reason, detail))

    def model_answer(self, answer: ModelAnswer) -> list[Effect]:
        """The model answered; a stale answer (another request id) is ignored."""
        if answer.request_id != self._waiting_for:
            return []
        self._waiting_for = None
        if answer.slot is not None:  # its prompt is cached there now: ask for it next time
            self.state.slot = answer.slot
            self.state.slot_cached = True
        self.usage = add_usage(self.usage, answer.usage)  # a summary request costs tokens too
        if self.phase is _Phase.SUMMARISING:
            if answer.tool_calls or not (answer.content or "").strip():
                got = "tool calls" if answer.tool_calls else "no text"
                return compaction_steps.failed(self, f"the summary request was answered with {got}")
            return compaction_steps.summarised(self, answer.content or "")
        if self.phase is not _Phase.ASKING:
            return []
        if answer.usage.prompt_tokens > 0:
            self.state.known_tokens = answer.usage.prompt_tokens
            self.state.known_messages = self._asked_len
        names = tuple(call.name for call in answer.tool_calls)
        # Told once the answer is stored (the next _save's commit), never before.
        self._told.append(
            Emit(
                ModelAnswered(
                    session=self.state.id,
                    step=self.step,
                    content=answer.content,
                    tools=names,
                    slot=answer.slot if self.slots else None,
                    slot_wait_s=answer.slot_wait_s,
                    usage=answer.usage,
                )
            )
        )
        effects: list[Effect] = []
        if not answer.tool_calls:
            content = answer.content or ""
            if answer.truncated and not self.limits.keep_truncated:
                # Not stored: the next turn should not read a half answer as said.
                effects, self._told = self._told, []
                return effects + self.finish_turn(
                    TurnFailed(self.state.id, FailReason.MODEL_ERROR, self._cut_off_detail())
                )
            done = TurnCompleted(self.state.id, content, truncated=answer.truncated)
            final = ChatMessage(role="assistant", content=content, usage=_stored(answer.usage))
            if self.output is not None:
                return effects + output_steps.answered_in_text(self, self.output, final)
            return effects + ending_steps.save_last(self, (final,), done)
        calls = []
        for proposed in answer.tool_calls:
            calls.append(self._number(proposed))
            self.state.next_call_id += 1
        self._calls = calls
        self._results = {}
        self._truncated = answer.truncated
        assistant = ChatMessage(
            role="assistant",
            content=answer.content,
            tool_calls=tuple(calls),
            usage=_stored(answer.usage),
        )
        if self.step >= self.limits.max_steps:
            return effects + self._refuse_at_limit(assistant)
        return effects + self._save((assistant,), self._dispatch)

    def model_error(self, error: ModelError) -> list[Effect]:
        """The model request failed; a prompt the server found too long is compacted and sent
        once more."""
        if error.request_id != self._waiting_for:
            return []
        self._waiting_for = None
        if self.phase is _Phase.SUMMARISING:
            return compaction_steps.failed(self, f"the model could not summarise: {error.detail}")
        if error.over_budget:
            return self.finish_turn(TurnFailed(self.state.id, FailReason.BUDGET, error.detail))
        failed = TurnFailed(self.state.id, FailReason.MODEL_ERROR, error.detail)
        if error.context_exceeded and not self._retried_too_long and self._turn_start > 0:
            self._retried_too_long = True
            if error.context_tokens:
                self.state.context_tokens = error.context_tokens
            self.step -= 1  # the refused request is sent again, as the same step
            return compaction_steps.compact_in_turn(
                self, self._send, lambda _detail: self.finish_turn(failed)
            )
        return self.finish_turn(failed)

    def tool_result(
        self, result: ToolResult, cap: int | None = None, told: tuple[Effect, ...] = ()
    ) -> list[Effect]:
        """A dispatched call has its result: it is stored, then ``told`` and its
        ``ToolCallFinished`` are published; once all results are stored the turn goes on (the
        model reads them in call order). Its text is capped at ``cap`` characters
        (``loop.tool_result_cap`` unless given)."""
        if self.phase is not _Phase.CALLING or result.call_id in self._results:
            return []
        call = next((c for c in self._calls if c.id == result.call_id), None)
        if call is None:
            return []
        if result.untrusted:
            self.state.untrusted = True
        text = cap_chars(result.text, self.limits.tool_result_cap if cap is None else cap)
        self._results[call.id] = msgspec.structs.replace(result, text=text)
        finished = ToolCallFinished(
            session=self.state.id,
            call_id=call.id,
            name=call.name,
            denied=result.denied,
            untrusted=result.untrusted,
        )
        return self._store_results((call.id,), [*told, Emit(finished)])

    def subagent_result(self, result: SubagentResult) -> list[Effect]:
        """A child answered the ``subagent`` call ``result.call_id``; what it spent is added to
        this turn's usage."""
        pending = result.call_id not in self._results
        if (
            self.phase is _Phase.CALLING
            and pending
            and any(c.id == result.call_id for c in self._calls)
        ):
            self.usage = add_usage(self.usage, result.usage)
        text = subagent_result_text(result)
        # The cap is the summary's: a typed child's JSON (at most the cap) is never cut.
        cap = self.limits.tool_result_cap + len(text) - len(getattr(result, "summary", text))
        finished = Emit(subagent_finished(self.state.id, result, answered=True))
        effects = self.tool_result(
            ToolResult(result.call_id, text, DataClass.PUBLIC, result.untrusted), cap, (finished,)
        )
        if effects:
            return effects
        return [Emit(subagent_finished(self.state.id, result, answered=False))]

    def cancel(
        self, reason: FailReason, detail: str, park: bool = False, keep: tuple[int, ...] = ()
    ) -> list[Effect]:
        """End the turn now: whatever was awaited is dropped, and answers that come later are
        ignored. Calls still without a result get one (stored, not waited for), so the
        transcript stays valid. A turn whose outcome is decided (it is compacting) keeps it.

        ``park`` (the runtime stops): calls waiting for a person, and ``subagent`` calls ``keep``
        whose child waits for one, stay unanswered; it ends with no ``TurnEnded``, to resume.
        """
        if self.done:
            return []
        effects: list[Effect] = self._stop_work()
        self._waiting_for = None
        if self.outcome is not None:  # told at once if its end write is still in flight
            told, self._end_told = ([self._end_told] if self._end_told else []), None
            return [*effects, *told, *self._finish()]
        now = self.clock()
        if self.phase is _Phase.COMPACTING and self._summary is not None and self._keep:
            # The store compacts whatever happens now: hold what it will hold, this turn's
            # messages after the summary, so the transcript and the store stay one.
            self.state.replace([self._summary, *self._keep])
            self.state.forget_counts()
            effects.append(Persist(next(self.ids), self._keep))
            self._keep = ()
        kept = approval_steps.kept(self, keep) if park and self.phase is _Phase.CALLING else set()
        effects += approval_steps.dropped(self, park)
        if self.phase is _Phase.CALLING:
            repairs = approval_steps.cut_off_results(self, kept, now)
        else:
            repairs = repair_results(self.state, self.registry, now)
        if repairs:
            self.state.extend(repairs)
            effects.append(Persist(next(self.ids), repairs))
        outcome = TurnFailed(self.state.id, reason, detail)
        if kept:
            self.outcome = outcome
            return [*effects, *self._finish()]
        return [*ending_steps.end_at_once(self, outcome, effects), *self._finish()]

    def _stop_work(self) -> list[Effect]:
        """What stops the work in flight: the model request, the port calls without a result."""
        if self.phase in (_Phase.ASKING, _Phase.SUMMARISING) and self._waiting_for is not None:
            return [CancelModel(self._waiting_for)]
        if self.phase is not _Phase.CALLING:
            return []
        now = self.clock()
        return [
            CancelPort(c.id)
            for c in self._calls
            if c.id not in self._results
            and c.id not in self.wait.held
            and isinstance(route_call(self.registry, c.name, c.arguments, now), ToPort)
        ]

    @property
    def done(self) -> bool:
        """True once :class:`Finish` has been returned."""
        return self._finished

    # Steps.

    def _next_id(self) -> int:
        request_id = next(self.ids)
        self._waiting_for = request_id
        return request_id

    def _save(
        self,
        messages: tuple[ChatMessage, ...],
        then: Callable[[], list[Effect]],
        reports: tuple[str, ...] = (),
        running: bool | None = None,
    ) -> list[Effect]:
        self.state.extend(messages)
        self.phase = _Phase.SAVING
        told, self._told = self._told, []
        self._after_save = (lambda: [*told, *then()]) if told else then
        return [Persist(self._next_id(), messages, reports, self._running(running))]

    def _running(self, running: bool | None) -> bool | None:
        """What a write says of the turn: its first marks it running (ending_steps)."""
        first, self._sent_first = not self._sent_first, True
        return True if first and running is None else running

    def _store_results(self, call_ids: Sequence[int], told: list[Effect]) -> list[Effect]:
        """Store the results of ``call_ids`` now, each as it comes (the model still reads an
        answer's results in call order: :func:`approval_steps.call_ordered`); ``told`` is told
        once they are durable, and the turn goes on once every result is."""
        messages = tuple(approval_steps.result_message(self, i) for i in call_ids)
        self.state.extend(messages)
        self._stored.update(call_ids)
        request_id = next(self.ids)
        self._result_writes[request_id] = told
        return [Persist(request_id, messages, running=self._running(None))]

    def _number(self, proposed: ProposedCall) -> ToolCall:
        """The next call id for ``proposed``; arguments a server could not parse are kept aside."""
        call_id = self.state.next_call_id
        if is_json_object(proposed.arguments):
            return ToolCall(call_id, proposed.name, proposed.arguments)
        return ToolCall(call_id, proposed.name, "{}", raw_arguments=proposed.arguments)

    def _cut_off_detail(self) -> str:
        return (
            f"the model's answer hit max_tokens ({self.limits.max_tokens} tokens, "
            "model.max_tokens) and was cut off; see docs/runbook.md#max-tokens"
        )

    def _context(self) -> int | None:
        return self.state.context_tokens or self.limits.context_tokens

    def _over_context(self, extra: tuple[ChatMessage, ...] = ()) -> bool:
        context = self._context()
        if context is None:
            return False
        return self.state.prompt_tokens(extra) > self.limits.threshold_ratio * context

    def _ask(self) -> list[Effect]:
        # Only the history before this turn can be summarised; once per turn is enough.
        if not self._compacted_early and self._turn_start > 0 and self._over_context():
            self._compacted_early = True
            return compaction_steps.compact_in_turn(self, self._send, lambda _detail: self._send())
        return self._send()

    def _send(self) -> list[Effect]:
        if self._reports:  # background reports go in first: the prompt is only extended
            reports, self._reports = tuple(self._reports), []
            messages = tuple(report_message(r) for r in reports)
            return self._save(messages, self._send, self._take_reports(reports))
        self.step += 1
        self.phase = _Phase.ASKING
        self._asked_len = len(self.state.transcript)
        sent = ModelRequestSent(session=self.state.id, slot=self.event_slot, step=self.step)
        request = self._request(approval_steps.call_ordered(self.state.messages()))
        return [Emit(sent), request]

    def _request(self, messages: tuple[ChatMessage, ...]) -> RequestModel:
        s = self.state
        return RequestModel(self._next_id(), s.slot, messages, prefer_slot=s.slot_cached)

    def _dispatch(self, calls: list[ToolCall] | None = None) -> list[Effect]:
        self.phase = _Phase.CALLING
        effects: list[Effect] = []
        now = self.clock()
        spawned = 0
        answered: list[tuple[int, Effect]] = []
        for call in self._calls if calls is None else calls:
            effects.append(
                Emit(ToolCallStarted(session=self.state.id, call_id=call.id, name=call.name))
            )
            route = route_call(self.registry, call.name, call.as_written, now)
            if self._truncated:
                detail = f"the call was cut off at max_tokens ({self.limits.max_tokens} tokens)"
                route = Answered(denial_message(DenyReason.INVALID_ARGUMENTS, detail), True)
            if self.output is not None:
                route = output_steps.final_answer_route(self, self.output, call, route)
            if isinstance(route, ToPort) and self.state.untrusted:
                denial = untrusted_denial(self.registry.mcp_tool(route.name))
                route = route if denial is None else Answered(denial, True)
            # A call that passed every check runs now, or waits for a person.
            if approval_steps.waits_here(self, call, route):  # the clock, listed to wait
                effects += approval_steps.run_or_wait(self, call, [], CLOCK)
                continue
            if isinstance(route, ToPort):
                work: list[Effect] = [CallPort(call.id, route.name, route.arguments)]
                effects += approval_steps.run_or_wait(self, call, work, route.name)
                continue
            if isinstance(route, Remember):
                if not self.state.untrusted or self.limits.untrusted_may_remember:
                    work = [WriteMemory(call.id, route.text)]
                    effects += approval_steps.run_or_wait(self, call, work, REMEMBER)
                    continue
                detail = "it may not write to memory (memory.allow_untrusted_writes is false)"
                route = Answered(denial_message(DenyReason.UNTRUSTED, detail), True)
            if isinstance(route, SpawnChild):
                spawned += 1
                child = spawn_check(self.state.id, call.id, route, spawned, self.limits)
                if isinstance(child, str):
                    work = [Spawn(call.id, child, route.task, route.agent, route.background)]
                    effects += approval_steps.run_or_wait(self, call, work, SUBAGENT)
                    continue
                route = child
            self._results[call.id] = ToolResult(call.id, route.text, denied=route.denied)
            finished = ToolCallFinished(
                session=self.state.id, call_id=call.id, name=call.name, denied=route.denied
            )
            answered.append((call.id, Emit(finished)))
        if answered:  # the calls answered here are stored together, then told
            effects += self._store_results([i for i, _ in answered], [e for _, e in answered])
        return effects + self._maybe_continue()

    def _maybe_continue(self) -> list[Effect]:
        # Results made up before dispatch (a resumed turn's) are stored like any other.
        unstored = [c.id for c in self._calls if c.id in self._results and c.id not in self._stored]
        if unstored:
            return self._store_results(unstored, [])
        if len(self._results) < len(self._calls) or self._result_writes:
            return []
        self._calls, self._results, self._stored = [], {}, set()
        output = self.output
        then = (
            self._ask if output is None else output_steps.after_final_answer(self, output.settle())
        )
        return then() + approval_steps.settled_effects(self)

    def _refuse_at_limit(self, assistant: ChatMessage) -> list[Effect]:
        detail = f"loop.max_steps is {self.limits.max_steps}"
        text = denial_message(DenyReason.STEP_LIMIT, detail)
        refusals = tuple(
            ChatMessage(
                role="tool", content=output_steps.at_limit(self, c, text), tool_call_id=c.id
            )
            for c in self._calls
        )
        if self.output is not None and isinstance(verdict := self.output.settle(), Done):
            return self._save(
                (assistant, *refusals), output_steps.after_final_answer(self, verdict)
            )
        failed = TurnFailed(
            self.state.id,
            FailReason.TURN_LIMIT,
            f"the model still called tools after {self.step} requests ({detail})",
        )
        return ending_steps.save_last(self, (assistant, *refusals), failed)

    def finish_turn(self, outcome: TurnOutcome) -> list[Effect]:
        """Every turn ends here, children's included (SPEC 7): the turn's outcome is decided,
        and a transcript past ``compact.threshold_chars`` is summarised before ``Finish``."""
        return ending_steps.end(
            self, outcome, lambda: compaction_steps.after_outcome(self, outcome, self._finish)
        )

    def _finish(self) -> list[Effect]:
        assert self.outcome is not None
        self.phase = _Phase.DONE
        self._finished = True
        # Everything the turn spent, a compaction after its outcome included.
        if self.usage != Usage():  # zero stays the default, which a repr leaves out
            self.outcome = msgspec.structs.replace(self.outcome, usage=self.usage)
        return [Finish(self.outcome)]
