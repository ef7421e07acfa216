"""The turn's side of approvals: holding a call for a person, and resuming a cut-off turn.

A :class:`~actors.core.turn.Turn` checks each call first, as it always does (arguments, an
allowed tool, the limits, an untrusted session's denials); only a call that would run is held
here when its tool needs approval. Its work (the ``CallPort``, ``WriteMemory`` or ``Spawn`` it
would do) is kept in :class:`ApprovalWait`, the call is stored (``AskApproval``), and once the
store has it the Context is told (``Announce``), which publishes ``ApprovalRequested``. The
other calls of the answer run meanwhile; all results still go back in call order.

:func:`resume` continues a turn whose stored transcript ends in an assistant message with calls
that have no result: the turn a stop or a crash cut off while a call waited for a person. It is
general: decided calls run (or answer their denial), calls still waiting are held again, a
``subagent`` call whose child waited is answered by that child's outcome (or stays open while the
child still waits), and any other call without a result is answered as interrupted, as a crash's
repair does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from actors.core.approvals import ApprovalPolicy, declined_text, stored_approval
from actors.core.dispatch import (
    CALL_TOOL,
    CLOCK,
    Answered,
    ArgumentError,
    Registry,
    Route,
    clock_text,
    unwrap_call_tool,
)
from actors.core.session_state import SessionState, unanswered_text
from actors.core.turn_effects import (
    Announce,
    AskApproval,
    CallPort,
    DropWaiting,
    Effect,
    Emit,
    ForgetApprovals,
    Persist,
    Spawn,
)
from messages import (
    ApprovalDecision,
    CallDecision,
    ChatMessage,
    DenyReason,
    Resume,
    StoredApproval,
    SubagentResult,
    ToolCall,
    ToolResult,
    TurnCompleted,
    TurnOutcome,
    TurnStarted,
    denial_message,
)

__all__ = [
    "ApprovalWait",
    "call_ordered",
    "carry_out",
    "cut_off_results",
    "decision_of",
    "kept",
    "open_calls",
    "park",
    "resume",
    "waits_here",
]


@dataclass
class ApprovalWait:
    """What one turn's approvals stand at."""

    held: dict[int, list[Effect]] = field(default_factory=dict)
    """The work of each call that waits for a person, done once it is approved."""
    storing: dict[int, StoredApproval] = field(default_factory=dict)
    """The store requests of calls being stored, by request id."""
    asked: list[int] = field(default_factory=list)
    """The calls of this answer that were stored, to forget once their results are."""
    decided: dict[int, ApprovalDecision] = field(default_factory=dict)
    """Decisions a resumed turn carries out."""
    rewait: set[int] = field(default_factory=set)
    """Calls a resumed turn holds again: stored, not decided yet."""
    verdicts: dict[int, ApprovalDecision] = field(default_factory=dict)
    """How each call of this answer that waited was decided: kept with its stored result."""

    def clear(self) -> None:
        """A new answer's calls start with nothing held."""
        self.held.clear()
        self.asked.clear()
        self.verdicts.clear()


class Turn(Protocol):
    """What these steps use of :class:`actors.core.turn.Turn` (named here, not imported, so
    the turn machine and its approval steps do not import each other)."""

    state: SessionState
    registry: Registry
    ids: Iterator[int]
    approvals: ApprovalPolicy | None
    wait: ApprovalWait
    _calls: list[ToolCall]
    _results: dict[int, ToolResult]
    _stored: set[int]
    _result_writes: dict[int, list[Effect]]
    _turn_start: int

    @property
    def clock(self) -> Callable[[], datetime]: ...
    def tool_result(self, result: ToolResult, cap: int | None = None) -> list[Effect]: ...
    def finish_turn(self, outcome: TurnOutcome) -> list[Effect]: ...
    def _ask(self) -> list[Effect]: ...
    def _dispatch(self, calls: list[ToolCall] | None = None) -> list[Effect]: ...
    def _maybe_continue(self) -> list[Effect]: ...
    @property
    def event_slot(self) -> int | None: ...
    def subagent_result(self, result: SubagentResult) -> list[Effect]: ...


def run_or_wait(
    turn: Turn, call: ToolCall, work: list[Effect], tool: str | None = None
) -> list[Effect]:
    """``work`` (a call that passed every check) now, or held until a person decides.

    ``tool`` is the tool the call routes to (what ``call_tool`` unwraps to): a call waits when
    its own name or that tool needs a person, so wrapping a tool in ``call_tool`` asks too."""
    wait = turn.wait
    decision = wait.decided.pop(call.id, None)
    if decision is not None:
        wait.asked.append(call.id)
        wait.verdicts[call.id] = decision
        if decision.approved:
            return carry_out(turn, call, work)
        return decline(turn, call, decision.reason)
    if call.id in wait.rewait:
        wait.rewait.discard(call.id)
        wait.asked.append(call.id)
        wait.held[call.id] = work
        return []
    policy = turn.approvals
    routed = tool or call.name
    if policy is None or not (policy.needs(call.name) or policy.needs(routed)):
        return carry_out(turn, call, work)
    # Checked first: arguments a port tool's schema refuses are denied now, nobody is asked.
    port = next((w for w in work if isinstance(w, CallPort)), None)
    problem = None if port is None else policy.check(port.name, port.arguments)
    if problem is not None:
        return deny_now(turn, call, denial_message(DenyReason.INVALID_ARGUMENTS, problem))
    # The request shows the call as the model wrote it (``call_tool`` and its inner call).
    entry = stored_approval(
        turn.state.id, call, turn.state.untrusted, turn.clock(), policy.timeout_s
    )
    request_id = next(turn.ids)
    wait.held[call.id] = work
    wait.storing[request_id] = entry
    wait.asked.append(call.id)
    # A spawn's limits are the Context's: it checks them before anyone is asked.
    spawn = next((w for w in work if isinstance(w, Spawn)), None)
    background = spawn is not None and spawn.background
    return [AskApproval(request_id, entry, spawns=spawn is not None, background=background)]


def waits_here(turn: Turn, call: ToolCall, route: Route) -> bool:
    """Whether ``call``, answered here (``route``: the ``clock``, directly or through
    ``call_tool``), is held for a person instead: its tool needs one (``[approvals] tools =
    ["clock"]``, ``["*"]``), or a resumed turn carries out or holds again its decision. Only
    the clock: a denial is never held, and ``final_answer`` is the turn's answer.

    Any call a person declined is answered here too, with the decline, whatever its route says
    now: a resumed turn's MCP server may still be starting, or its tool be gone, and the
    decision told stands."""
    declined = turn.wait.decided.get(call.id)
    if declined is not None and not declined.approved:
        return True
    if not isinstance(route, Answered) or route.denied:
        return False
    name, arguments = call.name, call.as_written
    if name == CALL_TOOL:
        try:
            name, arguments = unwrap_call_tool(arguments)
        except ArgumentError:
            return False
    if name != CLOCK:
        return False
    wait, policy = turn.wait, turn.approvals
    if call.id in wait.decided or call.id in wait.rewait:
        return True
    return policy is not None and (policy.needs(call.name) or policy.needs(CLOCK))


def carry_out(turn: Turn, call: ToolCall, work: list[Effect]) -> list[Effect]:
    """``work`` of a call that runs now; no work: a call answered here (the clock), whose
    answer is made now, at the time it runs."""
    if work:
        return work
    # Stored, then told: its ToolCallFinished waits for the result's commit (SPEC 18).
    return turn.tool_result(ToolResult(call.id, clock_text(turn.clock())))


def deny_now(turn: Turn, call: ToolCall, text: str) -> list[Effect]:
    """``call`` answers the denial ``text`` (during the dispatch of its answer, or once a
    person declined it): stored, then its ``ToolCallFinished`` told."""
    return turn.tool_result(ToolResult(call.id, text, denied=True))


def decline(turn: Turn, call: ToolCall, reason: str) -> list[Effect]:
    """``call`` answers the DECLINED denial (the reason neutralised and capped)."""
    return deny_now(turn, call, declined_text(reason))


def stored(turn: Turn, request_id: int) -> list[Effect]:
    """The store has the waiting call: the Context may announce it (unless it is over)."""
    entry = turn.wait.storing.pop(request_id)
    if entry.request.call_id not in turn.wait.held:
        return []
    return [Announce(entry)]


def not_stored(turn: Turn, request_id: int, detail: str) -> list[Effect]:
    """The waiting call could not be stored: it fails, and nobody is asked."""
    entry = turn.wait.storing.pop(request_id)
    call_id = entry.request.call_id
    if turn.wait.held.pop(call_id, None) is None:
        return []
    turn.wait.asked.remove(call_id)
    text = f"Error: the call could not be stored to wait for a person: {detail}"
    return turn.tool_result(ToolResult(call_id, text))


def denied_at_once(turn: Turn, decision: ApprovalDecision) -> list[Effect]:
    """The Context denied a held call instead of storing it (a ``subagent`` call a spawn
    limit denies anyway): nobody was asked, and it answers ``decision.denial``."""
    call_id = decision.call_id
    for request_id, entry in list(turn.wait.storing.items()):
        if entry.request.call_id == call_id:
            del turn.wait.storing[request_id]  # no store answer comes: nothing was stored
    if turn.wait.held.pop(call_id, None) is None:
        return []
    turn.wait.asked.remove(call_id)  # no row to forget
    return turn.tool_result(ToolResult(call_id, decision.denial, denied=True))


def decided(turn: Turn, decision: ApprovalDecision) -> list[Effect]:
    """A person (or the timeout) settled a held call: its work runs, or it is declined."""
    work = turn.wait.held.pop(decision.call_id, None)
    call = next((c for c in turn._calls if c.id == decision.call_id), None)
    if work is None or call is None:
        return []
    turn.wait.verdicts[call.id] = decision
    if decision.approved:
        return work if work else carry_out(turn, call, work) + turn._maybe_continue()
    return decline(turn, call, decision.reason) + turn._maybe_continue()


def settled_effects(turn: Turn) -> list[Effect]:
    """Once an answer's results are stored: forget the requests of its calls."""
    asked, turn.wait.asked = tuple(turn.wait.asked), []
    turn.wait.held.clear()
    return [ForgetApprovals(asked)] if asked else []


def dropped(turn: Turn, park: bool) -> list[Effect]:
    """The turn ends early (a cancel, a stop): the Context drops the calls that wait, unless
    the runtime stops (``park``), when they stay stored for the next start. The requests of
    calls decided already go with their results (stored, or being made up now, with the
    decision): never before, so a write that fails leaves the decision stored."""
    held = tuple(sorted(turn.wait.held))
    return [DropWaiting(held)] if held and not park else []


def result_message(turn: Turn, call_id: int) -> ChatMessage:
    """The stored tool message of call ``call_id``'s result: its text, whether it came from an
    untrusted source, and how a person decided the call if it waited (never sent)."""
    result = turn._results[call_id]
    return ChatMessage(
        role="tool",
        content=result.text,
        tool_call_id=call_id,
        untrusted=result.untrusted,
        decision=decision_of(turn, call_id),
    )


def decision_of(turn: Turn, call_id: int) -> CallDecision | None:
    """How a person decided call ``call_id`` of this answer, if it waited for one. Its result
    carries it, and the store forgets the call's row in the transaction that stores it."""
    verdict = turn.wait.verdicts.get(call_id)
    if verdict is None or verdict.denial:
        return None
    return CallDecision(
        verdict.approved, verdict.note, None if verdict.approved else verdict.reason
    )


def cut_off_results(turn: Turn, kept: set[int], now: datetime) -> tuple[ChatMessage, ...]:
    """The results made up for the calls of a turn cut off while it called (a cancel, a
    stop): every call without one but those ``kept`` unanswered. The results that arrived are
    stored already; a call a person decided carries the decision."""
    return tuple(
        ChatMessage(
            role="tool",
            content=unanswered_text(turn.state, turn.registry, c, now),
            tool_call_id=c.id,
            decision=decision_of(turn, c.id),
        )
        for c in turn._calls
        if c.id not in kept and c.id not in turn._stored
    )


def kept(turn: Turn, children: Sequence[int]) -> set[int]:
    """At a stop: the calls that stay unanswered for the next start, those waiting for a
    person and the ``children`` (``subagent`` calls whose child waits for one) still open."""
    open_ids = {c.id for c in turn._calls if c.id not in turn._results}
    return set(turn.wait.held) | (open_ids & set(children))


def park(turn: Turn) -> list[Effect] | None:
    """Stop the turn for now, if only calls waiting for a person are left (every other call
    has its result and every request is stored): store those results, keep the waiting calls
    unanswered (their requests stay stored), and end unpublished. None: it cannot park now."""
    held = turn.wait.held
    if not held or turn.wait.storing or turn._result_writes:  # a write in flight: not yet
        return None
    if any(c.id not in turn._results and c.id not in held for c in turn._calls):
        return None
    results = tuple(  # those not stored yet (a result is stored as it comes)
        result_message(turn, c.id)
        for c in turn._calls
        if c.id in turn._results and c.id not in turn._stored
    )
    # The requests of decided calls go with their results (which carry the decision).
    held.clear()
    if not results:  # every other result is stored already
        return []
    turn.state.extend(results)
    return [Persist(next(turn.ids), results)]


def call_ordered(messages: tuple[ChatMessage, ...]) -> tuple[ChatMessage, ...]:
    """``messages`` with the results of each answer in its calls' order.

    A turn parked or cut off while a call waited for a person stores the other results first
    and the decided one later; the model still reads them in call order. ``messages`` itself
    when every run of results is in order (the usual case: nothing is copied).
    """
    out: list[ChatMessage] | None = None
    i = 0
    while i < len(messages):
        message = messages[i]
        i += 1
        if message.role != "assistant" or len(message.tool_calls) < 2:
            continue
        end = i
        while end < len(messages) and messages[end].role == "tool":
            end += 1
        order = {c.id: n for n, c in enumerate(message.tool_calls)}
        run = messages[i:end]
        ranked = sorted(run, key=lambda m: order.get(m.tool_call_id or 0, len(order)))
        if ranked != list(run):
            out = list(messages) if out is None else out
            out[i:end] = ranked
        i = end
    return messages if out is None else tuple(out)


def open_calls(transcript: Sequence[ChatMessage]) -> tuple[list[ToolCall], int]:
    """The calls of the last answer that have no result, and the index of the last user
    message (where that turn began); no calls when the transcript does not end in an
    answer's calls."""
    answered: set[int] = set()
    calls: list[ToolCall] = []
    for message in reversed(transcript):
        if message.role == "tool" and message.tool_call_id is not None:
            answered.add(message.tool_call_id)
            continue
        if message.role == "assistant":
            calls = [c for c in message.tool_calls if c.id not in answered]
        break
    start = next((i for i in range(len(transcript) - 1, -1, -1) if transcript[i].role == "user"), 0)
    return calls, start


def resume(turn: Turn, order: Resume) -> list[Effect]:
    """Continue the turn the stored transcript cut off (see the module's doc)."""
    state = turn.state
    started: list[Effect] = [Emit(TurnStarted(session=state.id, slot=turn.event_slot))]
    calls, turn._turn_start = open_calls(state.transcript)
    # A request whose call has its result stored (a crash between the two writes) is stale.
    open_ids = {c.id for c in calls}
    asked = {d.call_id for d in order.decisions} | set(order.waiting)
    stale = sorted(asked - open_ids)
    if stale:
        started.append(DropWaiting(tuple(stale)))
    if not calls:
        last = state.transcript[-1] if state.transcript else None
        if last is None or last.role != "assistant":
            return [*started, *turn._ask()]
        return [*started, *turn.finish_turn(TurnCompleted(state.id, last.content or ""))]
    turn.wait.decided = {d.call_id: d for d in order.decisions}
    turn.wait.rewait = set(order.waiting)
    turn._calls, turn._results = calls, {}
    now = turn.clock()
    # A child's outcome answers its subagent call; a child still waiting keeps its call open.
    children = set(order.children) | {a.call_id for a in order.answers}
    todo = []
    for call in calls:
        if call.id in asked:
            todo.append(call)
        elif call.id not in children:
            text = unanswered_text(state, turn.registry, call, now)
            turn._results[call.id] = ToolResult(call.id, text, denied=text.startswith("Denied"))
    effects = [*started, *turn._dispatch(todo)]
    for answer in order.answers:
        effects += turn.subagent_result(answer)
    return effects
