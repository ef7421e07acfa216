"""The turn state machine, driven input by input without threads or actors."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from actors.core.dispatch import Registry
from actors.core.limits import Limits
from actors.core.session_state import SessionState
from actors.core.turn import COMPACT_INSTRUCTION, SUMMARY_PREFIX, Turn
from actors.core.turn_effects import (
    CallPort,
    CancelModel,
    CancelPort,
    Compact,
    Effect,
    Emit,
    Finish,
    Persist,
    RequestModel,
    Spawn,
)
from messages import (
    Baseline,
    ChatMessage,
    Compacted,
    CompactionFailed,
    FailReason,
    ModelAnswer,
    ModelAnswered,
    ModelError,
    ProposedCall,
    SessionRecord,
    SubagentCompleted,
    SubagentFailed,
    ToolCall,
    ToolResult,
    ToolSpec,
    TurnCompleted,
    TurnEnded,
    TurnFailed,
)

NOW = datetime(2026, 11, 29, 23, 59, 1, tzinfo=UTC)
REGISTRY = Registry([ToolSpec("lookup", "a port tool", {})])


def new_state(session: str = "mm-thread") -> SessionState:
    return SessionState(session, Baseline("system prompt", REGISTRY.specs()), 0, [])


def new_turn(
    state: SessionState | None = None,
    *,
    max_steps: int = 8,
    cap: int = 1000,
    summary_chars: int = 50,
    threshold: int = 1_000_000,
) -> Turn:
    return Turn(
        state or new_state(),
        REGISTRY,
        Limits(max_steps, cap, summary_chars, threshold),
        itertools.count(1),
        lambda: NOW,
    )


def only(effects: list[Effect], kind: type) -> list:
    return [e for e in effects if isinstance(e, kind)]


def one(effects: list[Effect], kind: type):
    found = only(effects, kind)
    assert len(found) == 1, f"expected one {kind.__name__} in {effects}"
    return found[0]


def answer(request: RequestModel, content: str | None = None, *calls: tuple[str, str]):
    proposed = tuple(ProposedCall(name, args) for name, args in calls)
    return ModelAnswer("mm-thread", request.request_id, content, proposed)


def ended(turn: Turn, effects: list[Effect]) -> list[Effect]:
    """``effects`` with the turn's end write acknowledged: what follows once its end (a
    Persist of nothing with ``running=False``) is durable, ``TurnEnded`` and ``Finish``."""
    ends = [e for e in only(effects, Persist) if e.running is False and not e.messages]
    if len(ends) != 1 or only(effects, Finish):
        return effects
    told = [e.event for e in only(effects, Emit)]
    assert not [e for e in told if isinstance(e, TurnEnded)], "told before the end is durable"
    rest = [e for e in effects if e is not ends[0]]
    return rest + turn.persisted(ends[0].request_id)


def persist_and_ask(turn: Turn, effects: list[Effect]) -> RequestModel:
    """Acknowledge the one Persist in ``effects``; return the model request that follows."""
    saved = one(effects, Persist)
    return one(turn.persisted(saved.request_id), RequestModel)


def test_the_user_message_is_durable_before_the_first_request() -> None:
    turn = new_turn()
    effects = turn.start("hello", speaker="ana")
    assert not only(effects, RequestModel)
    saved = one(effects, Persist)
    assert saved.messages == (ChatMessage(role="user", content="hello", name="ana"),)
    request = one(turn.persisted(saved.request_id), RequestModel)
    assert request.messages[0] == ChatMessage(role="system", content="system prompt")
    assert request.messages[1:] == saved.messages


def test_an_answer_without_calls_ends_the_turn_once_it_is_stored() -> None:
    turn = new_turn()
    request = persist_and_ask(turn, turn.start("hi"))
    effects = turn.model_answer(answer(request, "hello there"))
    assert not only(effects, Finish)
    saved = one(effects, Persist)
    assert saved.messages == (ChatMessage(role="assistant", content="hello there"),)
    finish = one(turn.persisted(saved.request_id), Finish)
    assert finish.outcome == TurnCompleted("mm-thread", "hello there")
    assert turn.done


def test_calls_take_ids_in_model_order_and_run_only_after_the_answer_is_stored() -> None:
    turn = new_turn()
    request = persist_and_ask(turn, turn.start("go"))
    effects = turn.model_answer(
        answer(request, None, ("lookup", '{"q": 1}'), ("subagent", '{"task": "t"}'))
    )
    assert not only(effects, CallPort) and not only(effects, Spawn)
    saved = one(effects, Persist)
    assert [c.id for c in saved.messages[0].tool_calls] == [1, 2]
    dispatched = turn.persisted(saved.request_id)
    assert one(dispatched, CallPort) == CallPort(1, "lookup", '{"q": 1}')
    assert one(dispatched, Spawn) == Spawn(2, "sub-mm-thread-2", "t")


def test_results_go_back_in_call_order_whatever_finished_first() -> None:
    turn = new_turn()
    first = persist_and_ask(turn, turn.start("go"))
    effects = turn.model_answer(
        answer(first, None, ("lookup", "{}"), ("lookup", "{}"), ("clock", "{}"))
    )
    # Each result is stored as it comes (the clock's at once), and told only once it is.
    clock = one(turn.persisted(one(effects, Persist).request_id), Persist)
    assert [(m.tool_call_id, m.content) for m in clock.messages] == [(3, "2026-11-29T23:59:01Z")]
    told = turn.persisted(clock.request_id)
    assert [e.event.call_id for e in only(told, Emit)] == [3] and not only(told, RequestModel)
    saved = one(turn.tool_result(ToolResult(2, "second")), Persist)
    assert saved.messages == (ChatMessage(role="tool", content="second", tool_call_id=2),)
    assert not only(turn.persisted(saved.request_id), RequestModel)
    effects = turn.tool_result(ToolResult(1, "first"))
    assert not only(effects, Emit)  # not told before it is durable
    second = one(turn.persisted(one(effects, Persist).request_id), RequestModel)
    # The model reads them in call order, whatever finished first.
    assert [(m.tool_call_id, m.content) for m in second.messages[-3:]] == [
        (1, "first"),
        (2, "second"),
        (3, "2026-11-29T23:59:01Z"),
    ]
    # The prompt prefix is only ever extended: the next request starts with the last one.
    assert second.messages[: len(first.messages)] == first.messages


def test_call_ids_continue_across_turns() -> None:
    state = new_state()
    for expected in ([1, 2], [3]):
        turn = new_turn(state)
        request = persist_and_ask(turn, turn.start("go"))
        calls = [("clock", "{}")] * len(expected)
        effects = turn.model_answer(answer(request, None, *calls))
        saved = one(effects, Persist)
        assert [c.id for c in saved.messages[0].tool_calls] == expected
        done = persist_and_ask(turn, turn.persisted(saved.request_id))
        final = one(turn.model_answer(answer(done, "ok")), Persist)
        one(turn.persisted(final.request_id), Finish)
    assert state.next_call_id == 4
    assert state.turns == 2


def test_a_model_still_calling_tools_at_the_limit_ends_with_turn_limit() -> None:
    turn = new_turn(max_steps=1)
    request = persist_and_ask(turn, turn.start("go"))
    effects = turn.model_answer(answer(request, None, ("lookup", "{}"), ("subagent", "{}")))
    assert not only(effects, CallPort) and not only(effects, Spawn)
    saved = one(effects, Persist)
    # Every call gets a result, so the stored transcript stays valid for the model API.
    assistant, *refusals = saved.messages
    assert [c.id for c in assistant.tool_calls] == [1, 2]
    assert [m.tool_call_id for m in refusals] == [1, 2]
    assert all("step limit" in (m.content or "") for m in refusals)
    finish = one(turn.persisted(saved.request_id), Finish)
    assert isinstance(finish.outcome, TurnFailed)
    assert finish.outcome.reason is FailReason.TURN_LIMIT


def test_a_model_error_fails_the_turn_with_its_cause() -> None:
    turn = new_turn()
    request = persist_and_ask(turn, turn.start("go"))
    effects = ended(
        turn, turn.model_error(ModelError("mm-thread", request.request_id, "HTTP 500: boom"))
    )
    finish = one(effects, Finish)
    assert finish.outcome == TurnFailed("mm-thread", FailReason.MODEL_ERROR, "HTTP 500: boom")
    event = one(effects, Emit).event
    assert isinstance(event, TurnEnded) and event.reason is FailReason.MODEL_ERROR


def test_a_stale_answer_is_ignored() -> None:
    turn = new_turn()
    request = persist_and_ask(turn, turn.start("go"))
    stale = ModelAnswer("mm-thread", request.request_id + 100, "late", ())
    assert turn.model_answer(stale) == []
    assert one(turn.model_answer(answer(request, "fresh")), Persist)


def test_a_store_failure_fails_the_turn() -> None:
    turn = new_turn()
    saved = one(turn.start("go"), Persist)
    finish = one(ended(turn, turn.store_failed(saved.request_id, "disk full")), Finish)
    assert finish.outcome == TurnFailed("mm-thread", FailReason.STORE_ERROR, "disk full")


def test_a_child_id_that_does_not_fit_is_denied_without_a_spawn() -> None:
    state = new_state("a" * 59)
    turn = new_turn(state)
    request = persist_and_ask(turn, turn.start("go"))
    saved = one(turn.model_answer(answer(request, None, ("subagent", '{"task": "t"}'))), Persist)
    effects = turn.persisted(saved.request_id)
    assert not only(effects, Spawn)
    results = one(effects, Persist).messages
    raw = "sub-" + "a" * 59 + "-1"
    assert results[0].content == (
        "Denied: the arguments are not valid for this tool: "
        f"child session id `{raw}` would not fit; see docs/runbook.md#subagent-id."
    )


@pytest.mark.parametrize(
    ("result", "text"),
    [
        (SubagentCompleted("mm-thread", 1, "sub-mm-thread-1", "sum", True), "completed\nsum"),
        (
            SubagentFailed("mm-thread", 1, "sub-mm-thread-1", FailReason.TURN_LIMIT, True),
            "failed",
        ),
    ],
)
def test_a_childs_outcome_becomes_the_tool_text_and_its_taint(result, text) -> None:
    turn = new_turn()
    request = persist_and_ask(turn, turn.start("go"))
    saved = one(turn.model_answer(answer(request, None, ("subagent", '{"task": "t"}'))), Persist)
    turn.persisted(saved.request_id)
    assert not turn.state.untrusted
    saved = one(turn.subagent_result(result), Persist)
    assert saved.messages[0].content == f"sub-mm-thread-1 {text}"
    assert turn.state.untrusted


def test_a_tool_result_is_capped() -> None:
    turn = new_turn(cap=5)
    request = persist_and_ask(turn, turn.start("go"))
    saved = one(turn.model_answer(answer(request, None, ("lookup", "{}"))), Persist)
    turn.persisted(saved.request_id)
    saved = one(turn.tool_result(ToolResult(1, "0123456789")), Persist)
    assert saved.messages[0].content == "01234"


def finish_with_compaction(turn: Turn) -> tuple[RequestModel, list[Effect]]:
    request = persist_and_ask(turn, turn.start("x" * 40))
    saved = one(turn.model_answer(answer(request, "y" * 40)), Persist)
    effects = turn.persisted(saved.request_id)
    assert not only(effects, Finish), "the turn waits for its compaction"
    return one(effects, RequestModel), effects


def test_a_long_transcript_is_compacted_on_the_sessions_own_slot() -> None:
    state = new_state()
    state.slot = 3
    turn = new_turn(state, threshold=50, summary_chars=10)
    summarise, _ = finish_with_compaction(turn)
    assert summarise.slot == 3
    assert summarise.messages[-1] == ChatMessage(role="user", content=COMPACT_INSTRUCTION)
    summary = one(turn.model_answer(answer(summarise, "S" * 30)), Compact)
    assert summary.summary.content == SUMMARY_PREFIX + "S" * 10
    effects = turn.persisted(summary.request_id)
    compacted = one(effects, Emit).event
    assert isinstance(compacted, Compacted) and compacted.before == 80
    assert one(effects, Finish).outcome == TurnCompleted("mm-thread", "y" * 40)
    assert state.transcript == [summary.summary]


def test_a_failed_compaction_keeps_the_turns_outcome_and_history() -> None:
    turn = new_turn(threshold=50)
    summarise, _ = finish_with_compaction(turn)
    effects = turn.model_error(ModelError("mm-thread", summarise.request_id, "down"))
    failed = one(effects, Emit).event
    assert isinstance(failed, CompactionFailed) and "down" in failed.detail
    assert one(effects, Finish).outcome == TurnCompleted("mm-thread", "y" * 40)
    assert len(turn.state.transcript) == 2


def test_cancel_answers_once_and_keeps_a_decided_outcome() -> None:
    turn = new_turn()
    persist_and_ask(turn, turn.start("go"))
    finish = one(turn.cancel(FailReason.CANCELLED, "stopping"), Finish)
    assert finish.outcome == TurnFailed("mm-thread", FailReason.CANCELLED, "stopping")
    assert turn.cancel(FailReason.CANCELLED, "again") == []

    compacting = new_turn(threshold=50)
    finish_with_compaction(compacting)
    finish = one(compacting.cancel(FailReason.CANCELLED, "stopping"), Finish)
    assert finish.outcome == TurnCompleted("mm-thread", "y" * 40)


def test_a_summary_answered_with_tool_calls_is_a_failed_compaction() -> None:
    turn = new_turn(threshold=50)
    summarise, _ = finish_with_compaction(turn)
    effects = turn.model_answer(answer(summarise, None, ("clock", "{}")))
    failed = one(effects, Emit).event
    assert isinstance(failed, CompactionFailed) and "tool calls" in failed.detail
    assert not only(effects, Compact)
    assert one(effects, Finish).outcome == TurnCompleted("mm-thread", "y" * 40)
    assert len(turn.state.transcript) == 2


def test_cancel_keeps_results_that_arrived_and_answers_the_rest() -> None:
    turn = new_turn()
    request = persist_and_ask(turn, turn.start("go"))
    saved = one(
        turn.model_answer(answer(request, None, ("lookup", "{}"), ("lookup", "{}"))), Persist
    )
    turn.persisted(saved.request_id)
    arrived = one(turn.tool_result(ToolResult(2, "second arrived")), Persist).messages
    assert [(m.tool_call_id, m.content) for m in arrived] == [(2, "second arrived")]
    effects = turn.cancel(FailReason.CANCELLED, "by the user")
    write = one(effects, Persist)
    assert write.running is False  # the turn's end goes with its last results
    stored = write.messages  # only the call without a result is made up
    assert [(m.tool_call_id, m.content) for m in stored] == [
        (1, "Denied: the turn ended before this call returned a result."),
    ]


def test_no_compaction_after_a_store_failure() -> None:
    turn = new_turn(threshold=10)
    saved = one(turn.start("a long message that the store refuses"), Persist)
    effects = ended(turn, turn.store_failed(saved.request_id, "disk full"))
    assert not only(effects, RequestModel)
    assert one(effects, Finish).outcome.reason is FailReason.STORE_ERROR


def test_the_running_transcript_length_follows_every_change() -> None:
    # A stored session comes back with its length counted once; turns then add to it and a
    # compaction resets it, without summing the transcript again.
    call = ChatMessage(
        role="assistant", tool_calls=(ToolCall(1, "lookup", '{"q": "tea"}'),), content="hm"
    )
    stored = (ChatMessage(role="user", content="abc"), call)
    record = SessionRecord("s", Baseline("sys"), 0, stored, 1, 2, False)
    state = SessionState.from_record(record)
    assert state.transcript_chars() == 3 + 2 + len("lookup") + len('{"q": "tea"}')
    turn = new_turn(state, threshold=50, summary_chars=10)
    summarise, _ = finish_with_compaction(turn)
    assert state.transcript_chars() == sum(
        len(m.content or "") + sum(len(c.name) + len(c.arguments) for c in m.tool_calls)
        for m in state.transcript
    )
    assert state.transcript_chars() > 50
    summary = one(turn.model_answer(answer(summarise, "S" * 30)), Compact)
    turn.persisted(summary.request_id)
    assert state.transcript_chars() == len(SUMMARY_PREFIX) + 10


def test_cancel_stops_the_model_request_in_flight() -> None:
    turn = new_turn()
    request = persist_and_ask(turn, turn.start("go"))
    effects = turn.cancel(FailReason.CANCELLED, "by the user")
    assert one(effects, CancelModel) == CancelModel(request.request_id)
    # Stored first, then the model is stopped: the effects keep that order.
    assert effects.index(one(effects, CancelModel)) < effects.index(one(effects, Finish))

    compacting = new_turn(threshold=50)
    summarise, _ = finish_with_compaction(compacting)
    effects = compacting.cancel(FailReason.CANCELLED, "stopping")
    assert one(effects, CancelModel) == CancelModel(summarise.request_id)


def test_cancel_tells_the_port_of_each_port_call_without_a_result() -> None:
    turn = new_turn()
    request = persist_and_ask(turn, turn.start("go"))
    calls = (("lookup", "{}"), ("lookup", "{}"), ("subagent", '{"task": "t"}'), ("lookup", "{}"))
    saved = one(turn.model_answer(answer(request, None, *calls)), Persist)
    turn.persisted(saved.request_id)
    turn.tool_result(ToolResult(2, "second arrived"))
    effects = turn.cancel(FailReason.CANCELLED, "by the user")
    # Call 3 is a child (the Context cancels it), call 2 has its result.
    assert only(effects, CancelPort) == [CancelPort(1), CancelPort(4)]
    assert not only(effects, CancelModel)


def test_a_request_asks_for_the_slot_of_the_last_answer() -> None:
    state = new_state()
    state.slot = 5
    turn = new_turn(state)
    first = persist_and_ask(turn, turn.start("go"))
    assert (first.slot, first.prefer_slot) == (5, False)  # nothing cached there yet
    got = ModelAnswer("mm-thread", first.request_id, None, (ProposedCall("lookup", "{}"),), 2, 0.5)
    effects = turn.model_answer(got)
    assert not only(effects, Emit)  # told once the answer is stored
    effects = turn.persisted(one(effects, Persist).request_id)
    answered = [e.event for e in only(effects, Emit) if isinstance(e.event, ModelAnswered)]
    assert [(a.slot, a.slot_wait_s) for a in answered] == [(2, 0.5)]
    second = persist_and_ask(turn, turn.tool_result(ToolResult(1, "x")))
    assert (second.slot, second.prefer_slot) == (2, True)
    assert state.to_record().slot == 2
