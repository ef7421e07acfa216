"""A parent's turn parked at a stop while its child waits for a person, and resumed by the
child's outcome: the turn machine alone, without threads or actors."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

from actors.core.dispatch import Registry
from actors.core.limits import Limits
from actors.core.session_state import SessionState
from actors.core.turn import Turn
from actors.core.turn_effects import CallPort, Effect, Emit, Finish, Persist, RequestModel
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
    ToolResult,
    ToolSpec,
    TurnEnded,
)

REGISTRY = Registry([ToolSpec("lookup", "a port tool", {})])
NOW = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)


def new_turn(state: SessionState | None = None) -> Turn:
    state = state or SessionState("mm-thread", Baseline("system", REGISTRY.specs()), 0, [])
    return Turn(state, REGISTRY, Limits(8, 1000, 50, 1_000_000), itertools.count(1), lambda: NOW)


def only(effects: list[Effect], kind: type) -> list:
    return [e for e in effects if isinstance(e, kind)]


def one(effects: list[Effect], kind: type):
    found = only(effects, kind)
    assert len(found) == 1, f"expected one {kind.__name__} in {effects}"
    return found[0]


CALLS = (
    ToolCall(1, "lookup", "{}"),
    ToolCall(2, "subagent", '{"task": "t"}'),
)


def test_a_stop_keeps_the_subagent_call_of_a_waiting_child_open() -> None:
    turn = new_turn()
    request = one(turn.persisted(one(turn.start("go"), Persist).request_id), RequestModel)
    proposed = (ProposedCall("lookup", "{}"), ProposedCall("subagent", '{"task": "t"}'))
    effects = turn.model_answer(ModelAnswer("mm-thread", request.request_id, None, proposed))
    turn.persisted(one(effects, Persist).request_id)
    # The sibling's result is stored as it comes, while the child still runs.
    saved = one(turn.tool_result(ToolResult(1, "found")), Persist)
    assert saved.messages == (ChatMessage(role="tool", content="found", tool_call_id=1),)
    turn.persisted(saved.request_id)
    effects = turn.cancel(FailReason.CANCELLED, "the runtime stopped", park=True, keep=(2,))
    assert only(effects, Persist) == []  # nothing more to store: the child's call stays open
    assert not [e for e in only(effects, Emit) if isinstance(e.event, TurnEnded)]
    assert one(effects, Finish).outcome.reason is FailReason.CANCELLED


def parked_state() -> SessionState:
    state = SessionState("mm-thread", Baseline("system", REGISTRY.specs()), 0, [])
    state.transcript += [
        ChatMessage(role="user", content="go"),
        ChatMessage(role="assistant", tool_calls=CALLS),
        ChatMessage(role="tool", content="found", tool_call_id=1),
    ]
    state.next_call_id = 3
    return state


def test_the_childs_outcome_answers_the_open_call_and_the_turn_asks_on() -> None:
    turn = new_turn(parked_state())
    done = SubagentCompleted("mm-thread", 2, "sub-mm-thread-2", "deployed", False)
    effects = turn.resume(Resume(answers=(done,)))
    saved = one(effects, Persist)
    assert saved.messages == (
        ChatMessage(role="tool", content="sub-mm-thread-2 completed\ndeployed", tool_call_id=2),
    )
    request = one(turn.persisted(saved.request_id), RequestModel)
    assert [m.tool_call_id for m in request.messages if m.role == "tool"] == [1, 2]


def test_a_call_whose_child_still_waits_stays_open_until_its_answer() -> None:
    turn = new_turn(parked_state())
    effects = turn.resume(Resume(children=(2,)))
    assert not only(effects, Persist)  # not answered as interrupted
    done = SubagentCompleted("mm-thread", 2, "sub-mm-thread-2", "deployed", False)
    saved = one(turn.subagent_result(done), Persist)
    assert saved.messages[0].content == "sub-mm-thread-2 completed\ndeployed"


def test_a_declined_call_is_answered_declined_whatever_its_route_says_now() -> None:
    # The decline was told before a crash; after it, the call's tool is gone from the registry
    # (an MCP server still starting looks the same): the decision told stands, nothing runs.
    state = SessionState("mm-thread", Baseline("system", REGISTRY.specs()), 0, [])
    state.transcript += [
        ChatMessage(role="user", content="go"),
        ChatMessage(role="assistant", tool_calls=(ToolCall(1, "fx__deploy", "{}"),)),
    ]
    state.next_call_id = 2
    turn = new_turn(state)
    effects = turn.resume(Resume(decisions=(ApprovalDecision(1, False, "not now"),)))
    assert only(effects, CallPort) == []
    saved = one(effects, Persist)
    assert saved.messages == (
        ChatMessage(
            role="tool",
            content="Denied: a person declined this call: not now.",
            tool_call_id=1,
            decision=CallDecision(approved=False, reason="not now"),
        ),
    )


def test_a_new_turn_answers_a_cut_off_call_as_its_stored_decision_says() -> None:
    # The turn stopped after a person decided, before the result was stored (the store failed
    # the write): the record read back carries the decisions, and the next turn's repair
    # answers each as decided, carrying the decision (the store then forgets its row).
    from messages import ApprovalRequested, SessionRecord, StoredApproval

    calls = (ToolCall(1, "lookup", "{}"), ToolCall(2, "lookup", "{}"), ToolCall(3, "lookup", "{}"))

    def row(call_id: int, approved: bool, reason: str = "") -> StoredApproval:
        request = ApprovalRequested("mm-thread", call_id, "lookup", "{}", at=NOW)
        return StoredApproval(request, NOW, approved=approved, reason=reason)

    record = SessionRecord(
        "mm-thread",
        Baseline("system", REGISTRY.specs()),
        0,
        (ChatMessage(role="user", content="go"), ChatMessage(role="assistant", tool_calls=calls)),
        1,
        4,
        False,
        decided=(row(1, False, "not now"), row(2, True)),
    )
    turn = new_turn(SessionState.from_record(record))
    saved = one(turn.start("and now?"), Persist)
    assert saved.messages[:3] == (
        ChatMessage(
            role="tool",
            content="Denied: a person declined this call: not now.",
            tool_call_id=1,
            decision=CallDecision(False, None, "not now"),
        ),
        ChatMessage(
            role="tool",
            content="Denied: the turn ended before this call returned a result.",
            tool_call_id=2,
            decision=CallDecision(True),
        ),
        ChatMessage(
            role="tool",
            content="Denied: the turn ended before this call returned a result.",
            tool_call_id=3,
        ),
    )
    assert saved.messages[3] == ChatMessage(role="user", content="and now?")
    assert turn.state.decided == {}  # answered: a later repair does not see them again
