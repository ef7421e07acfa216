"""The A2A mapping as plain functions, without a server or the SDK: contexts, skills, the
decision a data part holds, and what each turn event and outcome tells a task's client."""

from __future__ import annotations

import pytest

from actors.shells.service.a2a.mapping import (
    CANCELED,
    COMPLETED,
    FAILED,
    INPUT_REQUIRED,
    WORKING,
    Decision,
    Refused,
    context_number,
    context_session,
    decision_of,
    event_update,
    outcome_update,
    skill_of,
)
from messages import (
    ApprovalRequested,
    ApprovalSettled,
    FailReason,
    ModelAnswered,
    SubagentFinished,
    SubagentStarted,
    TextDelta,
    TurnCompleted,
    TurnFailed,
    TurnStarted,
)

pytestmark = pytest.mark.timeout(30)

DUE = [ApprovalRequested("sub-ops-1", 3, "deploy", '{"env": "prod"}')]


def test_a_context_is_a_session_and_none_is_a_new_a2a_n() -> None:
    assert context_session("ops", 7) == "ops"
    assert context_session(None, 7) == "a2a-7" and context_session("", 2) == "a2a-2"
    with pytest.raises(Refused, match=r"'sub-ops-1'.*children are opened only by their parents"):
        context_session("sub-ops-1", 1)
    with pytest.raises(Refused, match="contextId 'a b'"):
        context_session("a b", 1)
    assert context_number(["a2a-3", "ops", "a2a-12", "a2a-x", "a2a-012", "sub-a2a-99-1"]) == 12
    assert context_number([]) == 0


def test_a_skill_is_an_agent_profile() -> None:
    agents = ("default", "coder")
    assert skill_of(None, agents) is None and skill_of({"other": 1}, agents) is None
    assert skill_of({"skill": "coder"}, agents) == "coder"
    for bad in ("nobody", 3, None, ["coder"]):
        with pytest.raises(Refused, match=r"is not a skill of this agent.*default, coder"):
            skill_of({"skill": bad}, agents)


def test_a_data_part_is_a_decision_on_a_due_call() -> None:
    yes = decision_of({"call_id": 3.0, "approve": True}, DUE)
    assert yes == (Decision(3, True, ""), "sub-ops-1")
    no = decision_of({"call_id": 3, "approve": False, "reason": "not now"}, DUE)
    assert no == (Decision(3, False, "not now"), "sub-ops-1")


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"call_id": 4, "approve": True}, "call_id 4 does not wait"),
        ({"call_id": 3.5, "approve": True}, "call_id: "),
        ({"call_id": True, "approve": True}, "call_id: "),
        ({"call_id": "3", "approve": True}, "call_id: "),
        ({"call_id": 3, "approve": "yes"}, '"approve" must be true or false'),
        ({"call_id": 3, "approve": False}, 'a decline needs a "reason"'),
        ({"call_id": 3, "approve": False, "reason": "\ud800"}, r"lone surrogate .* at \$\.reason"),
        ({"call_id": 3, "approve": True, "x": 1}, "unknown field 'x'"),
        ([3, True], "must be a data part object"),
        (None, "must be a data part object"),
        ({"call_id": 3, "approve": True, "reason": ["no"]}, "the reason"),
    ],
)
def test_anything_else_is_refused_naming_the_calls_that_are_due(data, said) -> None:
    with pytest.raises(Refused, match=said) as refused:
        decision_of(data, DUE)
    assert "call_id 3 (tool deploy of sub-ops-1)" in str(refused.value)
    with pytest.raises(Refused, match="no call of this task waits"):
        decision_of({"call_id": 3, "approve": True}, [])


def test_turn_events_become_status_and_artifact_updates() -> None:
    s = "ops"
    assert event_update(TurnStarted(s, 0), s).state == WORKING  # type: ignore[union-attr]
    assert event_update(TurnStarted("sub-ops-1", 1), s) is None  # a child's start: its own
    started = event_update(SubagentStarted(s, 1, "sub-ops-1", background=True), s)
    assert started is not None and started.text == (
        "subagent sub-ops-1 started in the background (agent default)"
    )
    failed = event_update(SubagentFinished(s, 1, "sub-ops-1", False, FailReason.TIMEOUT), s)
    assert failed is not None and failed.text == "subagent sub-ops-1 failed (timeout)"
    asked = event_update(DUE[0], s)
    assert asked is not None and asked.state == INPUT_REQUIRED
    assert "session sub-ops-1" in asked.text and "call_id 3" in asked.text
    assert 'arguments {"env": "prod"}' in asked.text and "tool deploy" in asked.text
    settled = event_update(ApprovalSettled("sub-ops-1", 3, True), s)
    assert settled is not None and settled.text == "call_id 3 of sub-ops-1 approved"
    delta = event_update(TextDelta(s, "Hel"), s)
    assert delta is not None and (delta.artifact, delta.append) == ("Hel", True)
    assert event_update(TextDelta("sub-ops-1", "x"), s) is None
    assert event_update(ModelAnswered(s, 1, "x"), s) is None


def test_a_turns_outcome_ends_its_task() -> None:
    done = outcome_update(TurnCompleted("ops", "the answer", output={"n": 1}))
    assert (done.state, done.artifact, done.data) == (COMPLETED, "the answer", {"n": 1})
    failed = outcome_update(TurnFailed("ops", FailReason.TURN_LIMIT, "16 steps"))
    assert (failed.state, failed.text) == (FAILED, "turn_limit: 16 steps")
    cancelled = outcome_update(TurnFailed("ops", FailReason.CANCELLED, "by a person"))
    assert (cancelled.state, cancelled.text) == (CANCELED, "cancelled: by a person")
