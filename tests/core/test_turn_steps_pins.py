"""The turn machine (actors/core/turn.py) and its compaction and typed-answer steps, pinned at
the core where the mutation lane found them unpinned: what one answer's calls do to each other,
the events of a child's answer, store failures at each kind of write, a cancel's writes, a
compaction's counts and its once-per-turn rule, and a typed session answering in text."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import msgspec
from test_turn_limits import (
    COMPACT_INSTRUCTION,
    SUMMARY_PREFIX,
    old_history,
    one,
    only,
    reply,
    saved,
)

from actors.core.approvals import ApprovalPolicy
from actors.core.dispatch import Registry
from actors.core.limits import Limits
from actors.core.mcp_tools import McpCatalog, McpTool
from actors.core.output import (
    FinalAnswer,
    OutputRule,
    OutputTypes,
    decoded,
    final_answer_spec,
    with_output,
)
from actors.core.session_state import SessionState
from actors.core.turn import Turn
from actors.core.turn_effects import (
    AskApproval,
    CallPort,
    CancelModel,
    Compact,
    Effect,
    Emit,
    Finish,
    Persist,
    RequestModel,
    Spawn,
)
from messages import (
    BackgroundReport,
    Baseline,
    ChatMessage,
    Compacted,
    CompactionFailed,
    FailReason,
    ModelAnswer,
    ModelError,
    ProposedCall,
    SubagentCompleted,
    SubagentFailed,
    SubagentFinished,
    ToolCallFinished,
    ToolCallStarted,
    ToolResult,
    ToolSpec,
    TurnCompleted,
    TurnFailed,
)

NOW = datetime(2026, 12, 6, 2, 30, tzinfo=UTC)
REGISTRY = Registry([ToolSpec("lookup", "a port tool", {})])
SESSION = "mm-thread"


def new_turn(
    history: list[ChatMessage] | None = None,
    *,
    registry: Registry = REGISTRY,
    context: int | None = None,
    cap: int = 1000,
    max_children: int = 8,
    approvals: ApprovalPolicy | None = None,
    untrusted: bool = False,
) -> Turn:
    state = SessionState(SESSION, Baseline("system prompt", ()), 0, list(history or []))
    state.untrusted = untrusted
    limits = Limits(8, cap, 200, 1_000_000, context_tokens=context, max_children=max_children)
    return Turn(state, registry, limits, itertools.count(1), lambda: NOW, approvals=approvals)


def events(effects: list[Effect], kind: type) -> list:
    return [e.event for e in only(effects, Emit) if isinstance(e.event, kind)]


def calls(turn: Turn, *proposed: tuple[str, str]) -> list[Effect]:
    """Start ``turn`` and answer its first request with ``proposed`` calls (stored)."""
    request = one(saved(turn, turn.start("go")), RequestModel)
    return saved(turn, turn.model_answer(reply(request, None, *proposed)))


def store_all(turn: Turn, effects: list[Effect]) -> list[Effect]:
    out: list[Effect] = []
    for persist in only(effects, Persist):
        out += turn.persisted(persist.request_id)
    return out


def finished(turn: Turn, effects: list[Effect]):
    """Store every write until the turn finishes; its outcome."""
    for _ in range(10):
        found = only(effects, Finish)
        if found:
            return found[0].outcome
        effects = store_all(turn, effects)
    raise AssertionError("the turn never finished")


# One answer's calls.


def test_the_child_limit_counts_every_subagent_call_of_one_answer() -> None:
    turn = new_turn(max_children=2)
    task = '{"task": "t"}'
    effects = calls(turn, ("subagent", task), ("subagent", task), ("subagent", task))
    assert [s.call_id for s in only(effects, Spawn)] == [1, 2]
    denied = one(effects, Persist).messages
    assert [m.tool_call_id for m in denied] == [3]
    assert "loop.max_children" in denied[0].content


def test_a_subagent_call_through_call_tool_waits_when_subagent_is_listed() -> None:
    turn = new_turn(approvals=ApprovalPolicy.of(["subagent"], 60.0))
    inner = '{"name": "subagent", "arguments": {"task": "t"}}'
    effects = calls(turn, ("call_tool", inner))
    ask = one(effects, AskApproval)
    assert ask.spawns and ask.approval.request.tool == "call_tool"
    assert not only(effects, Spawn)


def test_an_untrusted_sessions_denied_mcp_call_is_told_denied() -> None:
    catalog = McpCatalog(["files"])
    spec = ToolSpec("files__rm", "remove", {"type": "object"})
    catalog.publish("files", [McpTool("files", "rm", spec, lambda _a: None, True)])
    turn = new_turn(registry=Registry([], catalog), untrusted=True)
    effects = calls(turn, ("files__rm", "{}"))
    assert not only(effects, CallPort)
    saved_result = one(effects, Persist)
    assert saved_result.messages[0].content.startswith("Denied")
    finished = events(store_all(turn, effects), ToolCallFinished)
    assert [(f.call_id, f.denied) for f in finished] == [(1, True)]


def test_a_clock_call_that_waits_holds_up_none_of_the_others() -> None:
    turn = new_turn(approvals=ApprovalPolicy.of(["clock"], 60.0))
    effects = calls(turn, ("lookup", "{}"), ("clock", "{}"), ("lookup", '{"q": 2}'))
    started = [e.call_id for e in events(effects, ToolCallStarted)]
    assert started == [1, 2, 3]
    assert [c.call_id for c in only(effects, CallPort)] == [1, 3]
    assert one(effects, AskApproval).approval.request.call_id == 2


def test_a_result_for_a_call_the_turn_never_made_changes_nothing() -> None:
    turn = new_turn()
    calls(turn, ("lookup", "{}"))
    assert turn.tool_result(ToolResult(99, "stray")) == []


# A child's answer.


def test_a_failed_childs_event_names_its_reason_and_words() -> None:
    turn = new_turn()
    calls(turn, ("subagent", '{"task": "t"}'))
    failed = SubagentFailed(SESSION, 1, "sub-mm-thread-1", FailReason.MODEL_ERROR, False, "boom")
    effects = turn.subagent_result(failed)
    assert not events(effects, SubagentFinished)  # told once the parent stored it
    (finished,) = events(store_all(turn, effects), SubagentFinished)
    assert (finished.completed, finished.reason, finished.detail) == (
        False,
        FailReason.MODEL_ERROR,
        "boom",
    )


def test_a_childs_answer_up_to_the_cap_is_never_cut_by_its_first_line() -> None:
    turn = new_turn(cap=40)
    calls(turn, ("subagent", '{"task": "t"}'))
    summary = "s" * 40
    done = SubagentCompleted(SESSION, 1, "sub-mm-thread-1", summary, False)
    stored = one(turn.subagent_result(done), Persist).messages[0].content
    assert stored == f"sub-mm-thread-1 completed\n{summary}"


# Store failures, by kind of write.


def test_a_result_write_the_store_refuses_fails_the_turn_with_its_words() -> None:
    turn = new_turn()
    effects = calls(turn, ("lookup", "{}"))
    write = one(turn.tool_result(ToolResult(1, "found")), Persist)
    failed = turn.store_failed(write.request_id, "disk full")
    assert finished(turn, failed) == TurnFailed(SESSION, FailReason.STORE_ERROR, "disk full")
    assert effects  # the call was dispatched


def test_a_compaction_the_store_refuses_is_told_and_the_turn_goes_on() -> None:
    turn = new_turn(old_history(6), context=1000)
    summary_request = one(saved(turn, turn.start("what now?")), RequestModel)
    compact = one(turn.model_answer(reply(summary_request, "we talked")), Compact)
    effects = turn.store_failed(compact.request_id, "disk full")
    (event,) = events(effects, CompactionFailed)
    assert event.detail == "the store could not compact: disk full"
    request = one(effects, RequestModel)
    assert request.messages[-1].content == "what now?"


# A cancel.


def test_a_cancels_repair_write_is_numbered_like_any_other() -> None:
    turn = new_turn()
    calls(turn, ("lookup", "{}"), ("lookup", '{"q": 2}'))
    effects = turn.cancel(FailReason.CANCELLED, "stop")
    writes = only(effects, Persist)
    assert writes and all(isinstance(w.request_id, int) for w in writes)
    assert len({w.request_id for w in writes}) == len(writes)
    assert writes[-1].running is False


def test_a_cancel_while_an_answers_calls_are_being_stored_answers_them_interrupted() -> None:
    # Cut off before dispatch: even the clock, answered at once otherwise, is interrupted.
    turn = new_turn()
    request = one(saved(turn, turn.start("go")), RequestModel)
    in_flight = turn.model_answer(reply(request, None, ("clock", "{}"), ("lookup", "{}")))
    assert only(in_flight, Persist)  # the answer's write is not answered yet
    effects = turn.cancel(FailReason.CANCELLED, "stop")
    repairs = [m for p in only(effects, Persist) for m in p.messages]
    interrupted = "Denied: the turn ended before this call returned a result."
    assert [(m.tool_call_id, m.content) for m in repairs] == [(1, interrupted), (2, interrupted)]


def test_a_cancel_while_compacting_after_the_outcome_keeps_the_outcome() -> None:
    turn = new_turn(context=1000)
    request = one(saved(turn, turn.start("hi")), RequestModel)
    answer = reply(request, "hello", usage=msgspec.structs.replace(_usage(), prompt_tokens=900))
    summary_request = one(saved(turn, turn.model_answer(answer)), RequestModel)
    assert summary_request.messages[-1].content == COMPACT_INSTRUCTION
    effects = turn.cancel(FailReason.CANCELLED, "stop")
    assert effects[0] == CancelModel(summary_request.request_id)
    assert all(e is not None for e in effects)
    assert one(effects, Finish).outcome.content == "hello"


def _usage():
    from messages import Usage

    return Usage(prompt_tokens=0, completion_tokens=5, cached_tokens=0, requests=1)


# Compaction.


def test_a_compaction_counts_the_transcript_before_and_after() -> None:
    turn = new_turn(old_history(6), context=1000)
    before = None
    summary_request = one(saved(turn, turn.start("what now?")), RequestModel)
    before = turn.state.transcript_chars()
    compact = one(turn.model_answer(reply(summary_request, "we talked")), Compact)
    after = turn.persisted(compact.request_id)
    (event,) = events(after, Compacted)
    assert event.before == before
    assert event.after == turn.state.transcript_chars() < before


def test_a_turn_compacts_its_history_once_however_long_it_grows() -> None:
    turn = new_turn(old_history(6), context=1000)
    summary_request = one(saved(turn, turn.start("what now?")), RequestModel)
    compact = one(turn.model_answer(reply(summary_request, "we talked")), Compact)
    request = one(saved(turn, turn.persisted(compact.request_id)), RequestModel)
    effects = saved(
        turn,
        turn.model_answer(
            reply(request, None, ("lookup", "{}"), ("lookup", "{}"), ("lookup", "{}"))
        ),
    )
    for port in only(effects, CallPort):
        effects = turn.tool_result(ToolResult(port.call_id, "r" * 1000))
        after = turn.persisted(one(effects, Persist).request_id)
    assert turn.state.transcript_chars() > 3000  # past the context again
    next_request = one(after, RequestModel)
    assert next_request.messages[-1].content != COMPACT_INSTRUCTION


def test_after_a_compaction_for_a_refused_prompt_only_the_summary_is_history() -> None:
    turn = new_turn(old_history(3))
    request = one(saved(turn, turn.start("again")), RequestModel)
    refusal = ModelError(
        SESSION, request.request_id, "too long", context_exceeded=True, context_tokens=800
    )
    summary_request = one(turn.model_error(refusal), RequestModel)
    compact = one(turn.model_answer(reply(summary_request, "short")), Compact)
    retry = one(saved(turn, turn.persisted(compact.request_id)), RequestModel)
    effects = saved(turn, turn.model_answer(reply(retry, None, ("lookup", "{}"), ("lookup", "{}"))))
    for port in only(effects, CallPort):
        effects = turn.tool_result(ToolResult(port.call_id, "r" * 1000))
        after = turn.persisted(one(effects, Persist).request_id)
    second = one(after, RequestModel)
    assert second.messages[-1].content == COMPACT_INSTRUCTION  # this turn's calls overfill it
    history = [m.content for m in second.messages[1:-1]]
    assert history == [SUMMARY_PREFIX + "short"]  # never this turn's own messages


def test_a_new_childs_first_prompt_refused_as_too_long_fails_at_once() -> None:
    state = SessionState("sub-p-1", Baseline("system prompt", ()), 0, [])
    state.transcript.append(ChatMessage("user", "count the stars"))
    state.parent = "p"
    limits = Limits(8, 1000, 200, 1_000_000)
    turn = Turn(state, REGISTRY, limits, itertools.count(1), lambda: NOW)
    request = one(turn.start("count the stars", stored=True), RequestModel)
    refusal = ModelError("sub-p-1", request.request_id, "too long", context_exceeded=True)
    effects = turn.model_error(refusal)
    assert not only(effects, RequestModel)  # nothing before its turn to summarise
    outcome = finished(turn, effects)
    assert outcome == TurnFailed("sub-p-1", FailReason.MODEL_ERROR, "too long")


# Reports a turn starts with.


def test_a_turn_started_by_reports_stores_each_after_the_first() -> None:
    reports = tuple(
        BackgroundReport(SESSION, f"sub-mm-thread-{n}", f"sub-mm-thread-{n} completed\n{n}", False)
        for n in (1, 2, 3)
    )
    turn = new_turn()
    first = one(turn.start(reports[0].text, "subagent", reports=reports), Persist)
    assert [m.content for m in first.messages] == [r.text for r in reports]
    assert first.reports == tuple(r.child for r in reports)
    assert first.running is True


# A typed session.


def typed_turn(retries: int) -> Turn:
    spec = final_answer_spec({"type": "object", "properties": {"n": {"type": "integer"}}})
    state = SessionState(SESSION, with_output(Baseline("sys"), spec), 0, [])
    limits = Limits(8, 16_000, 2_000, 200_000, output_retries=retries)
    turn = Turn(state, Registry(), limits, itertools.count(1), lambda: NOW)
    turn.output = FinalAnswer(OutputRule(spec, None, retries))
    return turn


def test_a_typed_sessions_text_answer_is_a_failed_try() -> None:
    turn = typed_turn(retries=1)
    request = one(saved(turn, turn.start("go")), RequestModel)
    effects = saved(turn, turn.model_answer(reply(request, "seven")))
    again = one(effects, RequestModel)
    assert again.messages[-1].role == "user"  # told to answer by calling final_answer
    effects = turn.model_answer(reply(again, "still seven"))
    outcome = finished(turn, effects)
    assert isinstance(outcome, TurnFailed) and outcome.reason is FailReason.OUTPUT_INVALID
    assert "answered in text" in outcome.detail


def test_a_typed_outcome_is_decoded_to_its_type() -> None:
    class Count(msgspec.Struct):
        n: int

    outcome = TurnCompleted(SESSION, '{"n": 3}', output={"n": 3})
    assert decoded(outcome, Count).output == Count(3)
    assert decoded(TurnCompleted(SESSION, '{"n": "x"}', output={"n": "x"}), Count).output == {
        "n": "x"
    }


def test_an_output_rule_is_built_once_per_schema_and_retries() -> None:
    spec = final_answer_spec({"type": "object"})
    types = OutputTypes()
    baseline = with_output(Baseline("sys"), spec)
    rule = types.rule(baseline, 2)
    assert rule is not None and rule.spec == spec and rule.retries == 2
    assert types.rule(baseline, 2) is rule
    assert types.rule(baseline, 3) is not rule
    assert types.rule(Baseline("sys"), 2) is None


def test_a_proposed_call_count_matches_what_was_numbered() -> None:
    turn = new_turn()
    request = one(saved(turn, turn.start("go")), RequestModel)
    answer = ModelAnswer(SESSION, request.request_id, None, (ProposedCall("lookup", "{}"),))
    effects = saved(turn, turn.model_answer(answer))
    assert [c.call_id for c in only(effects, CallPort)] == [1]
    assert turn.state.next_call_id == 2
