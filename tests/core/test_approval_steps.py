"""The turn's side of approvals (actors/core/approval_steps.py), pinned at the core: which
calls wait for a person, what a decision does to them, what a stop keeps and a resume carries
out, and the order the model reads an answer's results in. The turn machine alone, no threads."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from actors.core.approvals import ApprovalPolicy
from actors.core.dispatch import Registry
from actors.core.limits import Limits
from actors.core.session_state import SessionState
from actors.core.turn import Turn
from actors.core.turn_effects import (
    Announce,
    AskApproval,
    CallPort,
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
from messages import (
    ApprovalDecision,
    Baseline,
    CallDecision,
    ChatMessage,
    FailReason,
    ModelAnswer,
    ProposedCall,
    Resume,
    SubagentCompleted,
    ToolCall,
    ToolCallFinished,
    ToolResult,
    ToolSpec,
    TurnCompleted,
    TurnEnded,
    TurnStarted,
)

REGISTRY = Registry([ToolSpec("deploy", "a port tool", {}), ToolSpec("status", "a port tool", {})])
NOW = datetime(2026, 12, 6, 2, 0, tzinfo=UTC)
CLOCK_TEXT = "2026-12-06T02:00:00Z"


def only(effects: list[Effect], kind: type) -> list:
    return [e for e in effects if isinstance(e, kind)]


def one(effects: list[Effect], kind: type):
    found = only(effects, kind)
    assert len(found) == 1, f"expected one {kind.__name__} in {effects}"
    return found[0]


def events(effects: list[Effect], kind: type) -> list:
    return [e.event for e in only(effects, Emit) if isinstance(e.event, kind)]


def new_turn(
    tools: tuple[str, ...] = ("deploy",),
    state: SessionState | None = None,
    checks: dict | None = None,
    untrusted: bool = False,
    registry: Registry = REGISTRY,
) -> Turn:
    state = state or SessionState("s", Baseline("system", REGISTRY.specs()), 0, [])
    state.untrusted = untrusted
    policy = ApprovalPolicy.of(tools, 60.0, checks) if tools else None
    return Turn(
        state,
        registry,
        Limits(8, 1000, 50, 1_000_000),
        itertools.count(1),
        lambda: NOW,
        approvals=policy,
    )


def answered(turn: Turn, *calls: tuple[str, str]) -> list[Effect]:
    """Start ``turn``, store its first write, and give it a model answer with ``calls``
    (stored too): the effects of its dispatch."""
    request = one(turn.persisted(one(turn.start("go"), Persist).request_id), RequestModel)
    proposed = tuple(ProposedCall(name, args) for name, args in calls)
    effects = turn.model_answer(ModelAnswer("s", request.request_id, None, proposed))
    return turn.persisted(one(effects, Persist).request_id)


def stored_results(turn: Turn, effects: list[Effect]) -> list[Effect]:
    """Answer each result write in ``effects`` as stored; what follows."""
    out: list[Effect] = []
    for persist in only(effects, Persist):
        out += turn.persisted(persist.request_id)
    return out


# Which calls wait.


def test_a_listed_tool_waits_and_the_others_run_meanwhile() -> None:
    turn = new_turn()
    effects = answered(turn, ("deploy", '{"env": "prod"}'), ("status", "{}"))
    ask = one(effects, AskApproval)
    assert (ask.spawns, ask.background) == (False, False)
    request = ask.approval.request
    assert (request.session, request.call_id, request.tool) == ("s", 1, "deploy")
    assert request.arguments == '{"env": "prod"}' and request.at == NOW
    assert request.untrusted is False
    assert ask.approval.deadline == NOW + timedelta(seconds=60)
    assert one(effects, CallPort) == CallPort(2, "status", "{}")  # not held
    assert turn.wait.held == {1: [CallPort(1, "deploy", '{"env": "prod"}')]}
    assert turn.wait.asked == [1]
    # Once the store has it the Context may announce it; a second answer changes nothing.
    assert turn.persisted(ask.request_id) == [Announce(ask.approval)]
    assert turn.persisted(ask.request_id) == []


def test_an_untrusted_sessions_request_says_so() -> None:
    turn = new_turn(untrusted=True)
    ask = one(answered(turn, ("deploy", "{}")), AskApproval)
    assert ask.approval.request.untrusted is True


def test_no_policy_or_an_unlisted_tool_runs_at_once() -> None:
    for tools in ((), ("status",), ("dep",)):
        turn = new_turn(tools)
        effects = answered(turn, ("deploy", "{}"))
        assert not only(effects, AskApproval), tools
        assert one(effects, CallPort) == CallPort(1, "deploy", "{}")
        assert turn.wait.held == {} and turn.wait.asked == []


def test_a_prefix_pattern_holds_every_tool_it_begins() -> None:
    turn = new_turn(("dep*",))
    effects = answered(turn, ("deploy", "{}"), ("status", "{}"))
    assert one(effects, AskApproval).approval.request.tool == "deploy"
    assert one(effects, CallPort).name == "status"


def test_a_tool_reached_through_call_tool_waits_as_if_called_directly() -> None:
    turn = new_turn()
    inner = '{"name": "deploy", "arguments": {"env": "prod"}}'
    effects = answered(turn, ("call_tool", inner))
    ask = one(effects, AskApproval)
    assert ask.approval.request.tool == "call_tool"  # shown as the model wrote it
    assert ask.approval.request.arguments == inner
    assert not only(effects, CallPort)
    assert turn.wait.held[1] == [CallPort(1, "deploy", '{"env":"prod"}')]


def test_call_tool_itself_listed_holds_its_calls() -> None:
    turn = new_turn(("call_tool",))
    effects = answered(turn, ("call_tool", '{"name": "status", "arguments": {}}'), ("status", "{}"))
    assert one(effects, AskApproval).approval.request.call_id == 1
    assert one(effects, CallPort).call_id == 2


def test_arguments_the_tools_schema_refuses_are_denied_and_nobody_is_asked() -> None:
    def check(arguments: str) -> str | None:
        return None if "env" in arguments else "env is required"

    turn = new_turn(checks={"deploy": check})
    effects = answered(turn, ("deploy", "{}"))
    assert not only(effects, AskApproval) and not only(effects, CallPort)
    saved = one(effects, Persist)
    assert (
        saved.messages[0].content
        == "Denied: the arguments are not valid for this tool: env is required."
    )
    assert turn.wait.held == {} and turn.wait.asked == []
    assert not events(effects, ToolCallFinished)  # told once its result is stored (SPEC 18)
    finished = events(stored_results(turn, effects), ToolCallFinished)
    assert [(f.call_id, f.name, f.denied) for f in finished] == [(1, "deploy", True)]
    # Valid arguments are asked about as usual.
    turn = new_turn(checks={"deploy": check})
    assert one(answered(turn, ("deploy", '{"env": "x"}')), AskApproval)


def test_a_held_subagent_call_tells_the_store_it_spawns() -> None:
    turn = new_turn(("subagent",))
    effects = answered(turn, ("subagent", '{"task": "t"}'))
    ask = one(effects, AskApproval)
    assert (ask.spawns, ask.background) == (True, False)
    assert [type(w) for w in turn.wait.held[1]] == [Spawn]
    turn = new_turn(("subagent",), registry=REGISTRY.for_agent(None, background=True))
    ask = one(answered(turn, ("subagent", '{"task": "t", "background": true}')), AskApproval)
    assert (ask.spawns, ask.background) == (True, True)


def test_remember_listed_holds_the_memory_write() -> None:
    turn = new_turn(("remember",))
    effects = answered(turn, ("remember", '{"text": "the sky is blue"}'))
    one(effects, AskApproval)
    assert turn.wait.held[1] == [WriteMemory(1, "the sky is blue")]


def test_the_clock_listed_waits_and_tells_the_time_it_runs_at() -> None:
    turn = new_turn(("clock",))
    effects = answered(turn, ("clock", "{}"))
    ask = one(effects, AskApproval)
    assert turn.wait.held == {1: []} and not only(effects, Persist)
    turn.persisted(ask.request_id)
    effects = turn.approval_decided(ApprovalDecision(1, True, note="fine"))
    saved = one(effects, Persist)
    assert saved.messages == (
        ChatMessage(
            role="tool",
            content=CLOCK_TEXT,
            tool_call_id=1,
            decision=CallDecision(True, "fine", None),
        ),
    )
    assert not events(effects, ToolCallFinished)  # told once its result is stored (SPEC 18)
    finished = events(stored_results(turn, effects), ToolCallFinished)
    assert [(f.call_id, f.name, f.denied) for f in finished] == [(1, "clock", False)]


def test_the_clock_through_call_tool_waits_when_the_clock_is_listed() -> None:
    turn = new_turn(("clock",))
    effects = answered(turn, ("call_tool", '{"name": "clock", "arguments": {}}'))
    assert one(effects, AskApproval).approval.request.tool == "call_tool"


def test_the_clock_unlisted_or_a_broken_call_tool_answers_at_once() -> None:
    turn = new_turn(("deploy",))
    effects = answered(turn, ("clock", "{}"), ("call_tool", '{"name": 5}'))
    assert not only(effects, AskApproval)
    saved = one(effects, Persist)
    assert saved.messages[0].content == CLOCK_TEXT
    assert saved.messages[1].content.startswith("Denied: the arguments are not valid")
    turn = new_turn(("call_tool", "clock"))
    effects = answered(turn, ("call_tool", '{"name": 5}'))
    assert not only(effects, AskApproval)  # a denial is never held
    turn = new_turn(("clock",))
    effects = answered(turn, ("call_tool", '{"name": "status", "arguments": {}}'))
    assert not only(effects, AskApproval) and one(effects, CallPort).name == "status"


# Decisions.


def held(turn: Turn, *calls: tuple[str, str]) -> list[Effect]:
    effects = answered(turn, *calls)
    for ask in only(effects, AskApproval):
        turn.persisted(ask.request_id)
    return effects


def test_an_approved_call_runs_its_held_work() -> None:
    turn = new_turn()
    held(turn, ("deploy", "{}"))
    assert turn.approval_decided(ApprovalDecision(1, True)) == [CallPort(1, "deploy", "{}")]
    assert turn.wait.held == {}
    assert turn.approval_decided(ApprovalDecision(1, True)) == []  # decided once
    saved = one(turn.tool_result(ToolResult(1, "deployed")), Persist)
    assert saved.messages[0].decision == CallDecision(True, None, None)
    # Its result stored, the model is asked again and the request forgotten.
    after = turn.persisted(saved.request_id)
    assert one(after, ForgetApprovals) == ForgetApprovals((1,))
    assert one(after, RequestModel)


def test_a_declined_call_answers_the_denial_with_its_reason() -> None:
    turn = new_turn()
    held(turn, ("deploy", "{}"), ("status", "{}"))
    effects = turn.approval_decided(ApprovalDecision(1, False, "not on a friday\x1b[2J"))
    saved = one(effects, Persist)
    message = saved.messages[0]
    assert message.content == "Denied: a person declined this call: not on a friday."
    assert message.decision == CallDecision(False, None, "not on a friday\x1b[2J")
    assert not events(effects, ToolCallFinished)  # told once its result is stored (SPEC 18)
    finished = events(stored_results(turn, effects), ToolCallFinished)
    assert [(f.call_id, f.denied) for f in finished] == [(1, True)]
    # The other call still runs: the model is asked once its result is stored too.
    saved = one(turn.tool_result(ToolResult(2, "green")), Persist)
    after = turn.persisted(saved.request_id)
    assert one(after, ForgetApprovals) == ForgetApprovals((1,))
    request = one(after, RequestModel)
    assert [m.tool_call_id for m in request.messages if m.role == "tool"] == [1, 2]


def test_a_decision_for_an_unknown_call_changes_nothing() -> None:
    turn = new_turn()
    held(turn, ("deploy", "{}"))
    assert turn.approval_decided(ApprovalDecision(7, True)) == []
    assert turn.wait.held.keys() == {1}


def test_a_call_the_store_could_not_keep_fails_naming_the_stores_words() -> None:
    turn = new_turn()
    effects = answered(turn, ("deploy", "{}"))
    ask = one(effects, AskApproval)
    failed = turn.store_failed(ask.request_id, "disk full")
    saved = one(failed, Persist)
    assert saved.messages[0].content == (
        "Error: the call could not be stored to wait for a person: disk full"
    )
    assert saved.messages[0].decision is None
    assert turn.wait.held == {} and turn.wait.asked == [] and turn.wait.storing == {}
    after = turn.persisted(saved.request_id)
    assert not only(after, ForgetApprovals)  # nothing stored to forget
    assert one(after, RequestModel)


def test_a_call_the_context_denies_at_once_answers_its_denial_and_nothing_is_forgotten() -> None:
    turn = new_turn(("subagent",))
    effects = answered(turn, ("subagent", '{"task": "t"}'))
    one(effects, AskApproval)
    denial = "Denied (limit): loop.max_children is 0"
    saved = one(turn.approval_decided(ApprovalDecision(1, False, denial=denial)), Persist)
    assert saved.messages[0].content == denial and saved.messages[0].decision is None
    assert turn.wait.storing == {} and turn.wait.asked == []
    after = turn.persisted(saved.request_id)
    assert not only(after, ForgetApprovals)
    assert one(after, RequestModel)
    assert turn.approval_decided(ApprovalDecision(1, False, denial=denial)) == []


def test_a_call_denied_at_once_is_told_denied_and_a_second_denial_changes_nothing() -> None:
    turn = new_turn(("subagent",))
    effects = answered(turn, ("subagent", '{"task": "t"}'), ("subagent", '{"task": "u"}'))
    assert len(only(effects, AskApproval)) == 2
    denial = "Denied: a limit of this runtime was reached: loop.max_children_total."
    saved = one(turn.approval_decided(ApprovalDecision(1, False, denial=denial)), Persist)
    finished = events(turn.persisted(saved.request_id), ToolCallFinished)
    assert [(f.call_id, f.name, f.denied) for f in finished] == [(1, "subagent", True)]
    assert turn.approval_decided(ApprovalDecision(1, False, denial=denial)) == []  # 2 waits
    assert turn.wait.held.keys() == {2}


def test_an_untrusted_result_of_a_held_call_is_stored_untrusted() -> None:
    turn = new_turn()
    held(turn, ("deploy", "{}"))
    turn.approval_decided(ApprovalDecision(1, True))
    saved = one(turn.tool_result(ToolResult(1, "from the web", untrusted=True)), Persist)
    assert saved.messages[0].untrusted is True


def test_listing_call_tool_holds_the_clock_reached_through_it() -> None:
    turn = new_turn(("call_tool",))
    effects = answered(turn, ("call_tool", '{"name": "clock", "arguments": {}}'))
    assert one(effects, AskApproval).approval.request.tool == "call_tool"


# Ends: a cancel, a stop, a park.


def test_a_cancel_drops_the_waiting_calls_and_the_decided_ones_go_with_their_results() -> None:
    turn = new_turn(("deploy", "status"))
    held(turn, ("deploy", "{}"), ("status", "{}"))
    turn.approval_decided(ApprovalDecision(2, True))  # running now
    effects = turn.cancel(FailReason.CANCELLED, "stop")
    # The decided call's request is not forgotten apart: its made-up result carries the
    # decision, and the store forgets the request in the write that stores it.
    assert not only(effects, ForgetApprovals)
    assert one(effects, DropWaiting) == DropWaiting((1,))
    repairs = [m for p in only(effects, Persist) for m in p.messages]
    assert [(m.tool_call_id, m.decision) for m in repairs] == [
        (1, None),
        (2, CallDecision(True)),
    ]
    assert events(effects, TurnEnded)[0].reason is FailReason.CANCELLED


def test_a_stop_keeps_the_waiting_calls_stored_and_unanswered() -> None:
    turn = new_turn(("deploy",))
    held(turn, ("deploy", "{}"), ("status", "{}"))
    effects = turn.cancel(FailReason.CANCELLED, "stopping", park=True)
    assert not only(effects, DropWaiting) and not only(effects, ForgetApprovals)
    repairs = [m for p in only(effects, Persist) for m in p.messages]
    assert [m.tool_call_id for m in repairs] == [2]  # the waiting call stays open
    assert not events(effects, TurnEnded)
    assert one(effects, Finish).outcome.reason is FailReason.CANCELLED


def test_a_turn_parks_only_once_every_other_call_has_its_result() -> None:
    turn = new_turn(("deploy", "status"))
    effects = answered(turn, ("deploy", "{}"), ("status", "{}"), ("clock", "{}"))
    asks = only(effects, AskApproval)
    assert turn.park() is None  # the requests are not stored yet
    for ask in asks:
        turn.persisted(ask.request_id)
    clock_write = one(effects, Persist)
    assert turn.park() is None  # the clock's result is being written
    turn.persisted(clock_write.request_id)
    decided = turn.approval_decided(ApprovalDecision(2, True))
    assert decided == [CallPort(2, "status", "{}")]
    assert turn.park() is None  # call 2 runs
    saved = one(turn.tool_result(ToolResult(2, "green")), Persist)
    turn.persisted(saved.request_id)
    assert saved.messages[0].decision == CallDecision(True)  # its request goes with it
    parked = turn.park()
    assert parked == []  # results stored already; 1 stays waiting
    assert turn.done and turn.wait.held == {}
    assert turn.cancel(FailReason.CANCELLED, "late") == []


def test_a_park_stores_the_results_not_stored_yet() -> None:
    turn = new_turn(("deploy",))
    held(turn, ("deploy", "{}"), ("status", "{}"))
    turn.tool_result(ToolResult(2, "green"))
    assert turn.park() is None  # its write is in flight
    turn = new_turn(("deploy",))
    held(turn, ("deploy", "{}"))
    turn._results[9] = ToolResult(9, "x")
    turn._calls.append(ToolCall(9, "status", "{}"))
    parked = turn.park()
    assert parked is not None
    saved = one(parked, Persist)
    assert [m.tool_call_id for m in saved.messages] == [9]
    assert isinstance(saved.request_id, int) and saved.request_id > 0  # numbered: answered
    assert not only(parked, ForgetApprovals)


def test_a_turn_never_parks_while_a_request_is_being_stored() -> None:
    turn = new_turn(("deploy",))
    answered(turn, ("deploy", "{}"))
    assert turn.park() is None  # nothing else in flight, but the request is not stored yet


def test_nothing_held_never_parks() -> None:
    turn = new_turn(())
    answered(turn, ("deploy", "{}"))
    assert turn.park() is None


# The order the model reads results in.


def test_results_stored_out_of_order_are_read_in_call_order() -> None:
    turn = new_turn()
    held(turn, ("deploy", "{}"), ("status", "{}"))
    stored_results(turn, turn.tool_result(ToolResult(2, "green")))
    approved = turn.approval_decided(ApprovalDecision(1, True))
    assert approved == [CallPort(1, "deploy", "{}")]
    saved = one(turn.tool_result(ToolResult(1, "deployed")), Persist)
    request = one(turn.persisted(saved.request_id), RequestModel)
    tools = [m for m in request.messages if m.role == "tool"]
    assert [(m.tool_call_id, m.content) for m in tools] == [(1, "deployed"), (2, "green")]
    # The transcript keeps them as stored.
    assert [m.tool_call_id for m in turn.state.transcript if m.role == "tool"] == [2, 1]


def test_call_ordered_sorts_each_answers_run_of_results_only() -> None:
    from actors.core.approval_steps import call_ordered

    def calls(*ids: int) -> ChatMessage:
        return ChatMessage(role="assistant", tool_calls=tuple(ToolCall(i, "t", "{}") for i in ids))

    def result(i: int | None) -> ChatMessage:
        return ChatMessage(role="tool", content=f"r{i}", tool_call_id=i)

    user = ChatMessage(role="user", content="go")
    in_order = (user, calls(1, 2), result(1), result(2), user)
    assert call_ordered(in_order) is in_order
    single = (user, calls(3), result(3), user)
    assert call_ordered(single) is single
    messages = (
        user,
        calls(1, 2, 3),
        result(3),
        result(1),
        result(2),
        user,
        calls(5, 4),
        result(4),
        result(None),
        result(5),
        ChatMessage(role="assistant", content="done"),
    )
    ordered = call_ordered(messages)
    assert [m.tool_call_id for m in ordered] == [None, None, 1, 2, 3, None, None, 5, 4, None, None]
    assert ordered[5] is user and ordered[-1] is messages[-1]
    assert len(ordered) == len(messages)


# Resuming a turn the store cut off.


def cut_off(*results: int) -> SessionState:
    state = SessionState("s", Baseline("system", REGISTRY.specs()), 0, [])
    calls = (ToolCall(1, "deploy", "{}"), ToolCall(2, "status", "{}"), ToolCall(3, "clock", "{}"))
    state.transcript += [
        ChatMessage(role="user", content="earlier"),
        ChatMessage(role="assistant", content="ok"),
        ChatMessage(role="user", content="go"),
        ChatMessage(role="assistant", tool_calls=calls),
        *(ChatMessage(role="tool", content=f"r{i}", tool_call_id=i) for i in results),
    ]
    state.next_call_id = 4
    return state


def test_open_calls_are_those_of_the_last_answer_without_a_result() -> None:
    from actors.core.approval_steps import open_calls

    calls, start = open_calls(cut_off(2).transcript)
    assert [c.id for c in calls] == [1, 3] and start == 2
    calls, start = open_calls([*cut_off(1, 2, 3).transcript])
    assert calls == [] and start == 2
    ended = [*cut_off(1, 2, 3).transcript, ChatMessage(role="assistant", content="done")]
    assert open_calls(ended) == ([], 2)
    assert open_calls([]) == ([], 0)
    assert open_calls([ChatMessage(role="assistant", content="hi")]) == ([], 0)
    hello = ChatMessage(role="assistant", content="hello")
    go = ChatMessage(role="user", content="go")
    asked = ChatMessage(role="assistant", tool_calls=(ToolCall(1, "clock", "{}"),))
    assert open_calls([hello, go, asked]) == ([ToolCall(1, "clock", "{}")], 1)


def test_a_resumed_turn_carries_out_decisions_holds_waits_and_answers_the_rest() -> None:
    turn = new_turn(("deploy", "clock"), state=cut_off(2))
    order = Resume(decisions=(ApprovalDecision(1, True, note="go ahead"),), waiting=(3,))
    effects = turn.resume(order)
    started = events(effects, TurnStarted)
    assert [s.session for s in started] == ["s"]
    assert one(effects, CallPort) == CallPort(1, "deploy", "{}")
    assert turn.wait.held == {3: []} and sorted(turn.wait.asked) == [1, 3]
    assert not only(effects, AskApproval)  # stored already: not asked again
    saved = one(turn.tool_result(ToolResult(1, "deployed")), Persist)
    assert saved.messages[0].decision == CallDecision(True, "go ahead", None)
    after = turn.persisted(saved.request_id)
    assert not only(after, RequestModel) and not only(after, ForgetApprovals)  # 3 still waits
    effects = turn.approval_decided(ApprovalDecision(3, False, "no"))
    after = stored_results(turn, effects)
    assert one(after, ForgetApprovals) == ForgetApprovals((1, 3))
    request = one(after, RequestModel)
    assert [m.tool_call_id for m in request.messages if m.role == "tool"] == [1, 2, 3]


def test_a_resumed_declined_call_answers_its_denial() -> None:
    turn = new_turn(("deploy",), state=cut_off(2, 3))
    effects = turn.resume(Resume(decisions=(ApprovalDecision(1, False, "nope"),)))
    saved = one(effects, Persist)
    assert saved.messages[0].content == "Denied: a person declined this call: nope."
    assert saved.messages[0].decision == CallDecision(False, None, "nope")


def test_a_resumed_call_nobody_waits_for_is_answered_interrupted() -> None:
    turn = new_turn(("deploy",), state=cut_off(3))
    effects = turn.resume(Resume(waiting=(1,)))
    saved = one(effects, Persist)
    assert [(m.tool_call_id, m.content) for m in saved.messages] == [
        (2, "Denied: the turn ended before this call returned a result.")
    ]
    assert saved.messages[0].decision is None
    assert not only(effects, CallPort)  # the interrupted call is not run again
    stored_results(turn, effects)
    assert turn.wait.held == {1: [CallPort(1, "deploy", "{}")]}


def test_a_resumed_open_clock_or_child_call_nobody_asked_about_is_answered() -> None:
    state = cut_off(1, 2)  # the clock's call 3 has no result
    state.transcript += [ChatMessage(role="user", content="next")]
    state.transcript += [
        ChatMessage(
            role="assistant",
            tool_calls=(ToolCall(4, "clock", "{}"), ToolCall(5, "subagent", '{"task": "t"}')),
        )
    ]
    state.slot = 3
    turn = new_turn(state=state)
    effects = turn.resume(Resume())
    assert [e.slot for e in events(effects, TurnStarted)] == [3]
    saved = one(effects, Persist)
    assert [(m.tool_call_id, m.content) for m in saved.messages] == [
        (4, "Denied: the turn ended before this call returned a result."),
        (5, "sub-s-5 failed"),
    ]


def test_a_resumed_clock_call_a_person_decided_is_carried_out_without_a_policy() -> None:
    turn = new_turn((), state=cut_off(1, 2))
    effects = turn.resume(Resume(decisions=(ApprovalDecision(3, True),)))
    assert one(effects, Persist).messages[0].content == CLOCK_TEXT
    turn = new_turn((), state=cut_off(1, 2))
    effects = turn.resume(Resume(decisions=(ApprovalDecision(3, False, "no"),)))
    assert one(effects, Persist).messages[0].content == "Denied: a person declined this call: no."


def test_requests_whose_calls_have_results_are_dropped_as_stale() -> None:
    turn = new_turn(("deploy",), state=cut_off(2, 3))
    order = Resume(decisions=(ApprovalDecision(2, True),), waiting=(1, 3, 9))
    effects = turn.resume(order)
    assert one(effects, DropWaiting) == DropWaiting((2, 3, 9))


def test_a_resume_with_nothing_open_asks_or_ends() -> None:
    turn = new_turn(state=cut_off(1, 2, 3))
    effects = turn.resume(Resume())
    assert not only(effects, DropWaiting)
    assert one(effects, RequestModel)
    state = cut_off(1, 2, 3)
    state.transcript.append(ChatMessage(role="assistant", content="all done"))
    turn = new_turn(state=state)
    effects = turn.resume(Resume(waiting=(1,)))
    assert one(effects, DropWaiting) == DropWaiting((1,))
    assert not events(effects, TurnEnded)  # told once its end is stored
    end = one(effects, Persist)
    assert (end.messages, end.running) == ((), False)
    effects = turn.persisted(end.request_id)
    assert [e.completed for e in events(effects, TurnEnded)] == [True]
    assert one(effects, Finish).outcome == TurnCompleted("s", "all done")
    # An answer stored with no text (and no calls) ends the resumed turn with no text.
    state = cut_off(1, 2, 3)
    state.transcript.append(ChatMessage(role="assistant", content=""))
    turn = new_turn(state=state)
    end = one(turn.resume(Resume()), Persist)
    assert one(turn.persisted(end.request_id), Finish).outcome == TurnCompleted("s", "")
    empty = SessionState("s", Baseline("system", REGISTRY.specs()), 0, [])
    assert one(new_turn(state=empty).resume(Resume()), RequestModel)


def test_a_resumed_childs_outcome_answers_its_subagent_call() -> None:
    state = cut_off(1, 2, 3)
    state.transcript += [
        ChatMessage(role="assistant", tool_calls=(ToolCall(4, "subagent", '{"task": "t"}'),))
    ]
    turn = new_turn(state=state)
    done = SubagentCompleted("s", 4, "sub-s-4", "deployed", False)
    effects = turn.resume(Resume(answers=(done,)))
    assert [e.session for e in events(effects, TurnStarted)] == ["s"]
    saved = one(effects, Persist)
    assert saved.messages[0].content == "sub-s-4 completed\ndeployed"
