"""The turn against a bounded model: context in tokens, cut-off answers, unparseable arguments.

Driven input by input, without threads, like tests/core/test_turn.py.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

from test_turn import ended

from actors.core.dispatch import Registry
from actors.core.limits import Limits
from actors.core.session_state import SessionState
from actors.core.turn import COMPACT_INSTRUCTION, SUMMARY_PREFIX, Turn
from actors.core.turn_effects import (
    CallPort,
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
    ModelError,
    ProposedCall,
    ToolCall,
    ToolCallFinished,
    ToolResult,
    ToolSpec,
    TurnCompleted,
    TurnFailed,
    Usage,
)
from messages.tools import DenyReason, denial_message

NOW = datetime(2026, 11, 29, 23, 59, 1, tzinfo=UTC)
REGISTRY = Registry([ToolSpec("lookup", "a port tool", {})])


def old_history(pairs: int, chars: int = 300) -> list[ChatMessage]:
    history = []
    for n in range(pairs):
        history.append(ChatMessage("user", f"question {n} " + "q" * chars))
        history.append(ChatMessage("assistant", f"answer {n} " + "a" * chars))
    return history


def new_turn(
    history: list[ChatMessage] | None = None,
    *,
    context: int | None = None,
    keep_truncated: bool = False,
    state: SessionState | None = None,
) -> Turn:
    state = state or SessionState(
        "mm-thread", Baseline("system prompt", ()), 0, list(history or [])
    )
    limits = Limits(8, 1000, 200, 1_000_000, context_tokens=context, keep_truncated=keep_truncated)
    return Turn(state, REGISTRY, limits, itertools.count(1), lambda: NOW)


def only(effects: list[Effect], kind: type) -> list:
    return [e for e in effects if isinstance(e, kind)]


def one(effects: list[Effect], kind: type):
    found = only(effects, kind)
    assert len(found) == 1, f"expected one {kind.__name__} in {effects}"
    return found[0]


def reply(request: RequestModel, content: str | None, *calls: tuple[str, str], **kw) -> ModelAnswer:
    proposed = tuple(ProposedCall(name, args) for name, args in calls)
    return ModelAnswer("mm-thread", request.request_id, content, proposed, **kw)


def saved(turn: Turn, effects: list[Effect]) -> list[Effect]:
    """Acknowledge the one Persist in ``effects``; return what follows."""
    return turn.persisted(one(effects, Persist).request_id)


# --- unparseable arguments (issue 12 item 3) ----------------------------------------------------


def test_arguments_that_are_not_json_are_stored_as_an_object_and_denied_as_written() -> None:
    turn = new_turn()
    request = one(saved(turn, turn.start("go")), RequestModel)
    effects = turn.model_answer(
        reply(request, None, ("subagent", '{"task": "look'), ("lookup", "[1]"))
    )
    (stored,) = one(effects, Persist).messages
    assert stored.tool_calls == (
        ToolCall(1, "subagent", "{}", raw_arguments='{"task": "look'),
        ToolCall(2, "lookup", "{}", raw_arguments="[1]"),
    )
    dispatched = saved(turn, effects)
    # The subagent call is denied for what the model wrote, not for the {} that is stored.
    assert not only(dispatched, Spawn)
    # A port tool gets the text as the model wrote it (the port tells the model what is wrong).
    port_call = one(dispatched, CallPort)
    assert port_call.arguments == "[1]"
    # The subagent call's denial is stored at once; the port's result when it comes.
    denied = one(dispatched, Persist).messages
    assert denied[0].content == denial_message(
        DenyReason.INVALID_ARGUMENTS, "arguments must be a JSON object"
    )
    results = turn.tool_result(ToolResult(port_call.call_id, "port: not an object"))
    assert one(results, Persist).messages[0].content == "port: not an object"
    assert stored.tool_calls[0].as_written == '{"task": "look'


# --- cut-off answers (item 5) -------------------------------------------------------------------


def test_a_final_answer_cut_off_at_max_tokens_fails_the_turn_and_is_not_stored() -> None:
    turn = new_turn()
    request = one(saved(turn, turn.start("tell me a story")), RequestModel)
    effects = turn.model_answer(reply(request, "Once upon a", truncated=True))
    assert not [p for p in only(effects, Persist) if p.messages]  # only the turn's end
    outcome = one(ended(turn, effects), Finish).outcome
    assert outcome.reason is FailReason.MODEL_ERROR
    assert "hit max_tokens (2048 tokens, model.max_tokens)" in outcome.detail
    assert turn.state.transcript[-1] == ChatMessage("user", "tell me a story")


def test_on_length_keep_completes_the_turn_marked_truncated() -> None:
    turn = new_turn(keep_truncated=True)
    request = one(saved(turn, turn.start("tell me a story")), RequestModel)
    effects = turn.model_answer(reply(request, "Once upon a", truncated=True))
    outcome = one(saved(turn, effects), Finish).outcome
    assert outcome == TurnCompleted("mm-thread", "Once upon a", truncated=True)


def test_a_cut_off_tool_call_is_never_run_and_the_model_is_told() -> None:
    turn = new_turn()
    request = one(saved(turn, turn.start("go")), RequestModel)
    effects = turn.model_answer(
        reply(request, None, ("lookup", '{"q": "a complete object"}'), truncated=True)
    )
    dispatched = saved(turn, effects)
    assert not only(dispatched, CallPort)
    detail = "the call was cut off at max_tokens (2048 tokens)"
    assert one(dispatched, Persist).messages[0].content == denial_message(
        DenyReason.INVALID_ARGUMENTS, detail
    )
    # Told once stored; the turn goes on: the model may try a shorter call.
    after = saved(turn, dispatched)
    finished = [e.event for e in only(after, Emit) if isinstance(e.event, ToolCallFinished)]
    assert [event.denied for event in finished] == [True]
    request = one(after, RequestModel)
    finish = one(saved(turn, turn.model_answer(reply(request, "done"))), Finish)
    assert finish.outcome == TurnCompleted("mm-thread", "done")


# --- context in tokens (item 4) -----------------------------------------------------------------


def test_usage_counts_the_prompt_and_new_messages_are_estimated() -> None:
    turn = new_turn()
    request = one(saved(turn, turn.start("hi")), RequestModel)
    usage = Usage(prompt_tokens=500, completion_tokens=3, cached_tokens=0, requests=1)
    saved(turn, turn.model_answer(reply(request, "hello", usage=usage)))
    # 500 counted by the server, then "hello" (5 chars = 2 tokens) and 4 for its template.
    assert turn.state.prompt_tokens() == 500 + 2 + 4


def test_a_request_that_would_overfill_the_context_compacts_the_history_first() -> None:
    history = old_history(6)  # ~3,700 chars: ~1,300 tokens at 3 chars a token
    turn = new_turn(history, context=1000)
    effects = saved(turn, turn.start("what now?"))
    summary_request = one(effects, RequestModel)
    assert summary_request.messages[-1].content == COMPACT_INSTRUCTION
    # The summary request carries no more than fits: the end of the old history, never this turn.
    assert "what now?" not in [m.content for m in summary_request.messages]
    assert summary_request.messages[-2] == history[-1]
    assert len(summary_request.messages) - 2 < len(history)
    compact = one(turn.model_answer(reply(summary_request, "we talked")), Compact)
    assert compact.summary.content == SUMMARY_PREFIX + "we talked"
    after = turn.persisted(compact.request_id)
    assert isinstance(only(after, Emit)[0].event, Compacted)
    # This turn's message goes back after the summary, then the request is sent.
    assert one(after, Persist).messages == (ChatMessage("user", "what now?"),)
    request = one(saved(turn, after), RequestModel)
    assert [m.content for m in request.messages[1:]] == [compact.summary.content, "what now?"]
    finish = one(saved(turn, turn.model_answer(reply(request, "this"))), Finish)
    assert finish.outcome == TurnCompleted("mm-thread", "this")


def test_a_small_history_under_the_ratio_is_not_compacted() -> None:
    turn = new_turn(old_history(1), context=4096)
    request = one(saved(turn, turn.start("hi")), RequestModel)
    assert request.messages[-1].content == "hi"


def test_a_prompt_the_server_refuses_as_too_long_is_compacted_and_sent_once_more() -> None:
    history = old_history(3)
    turn = new_turn(history)  # the context size is unknown
    request = one(saved(turn, turn.start("again")), RequestModel)
    refusal = ModelError(
        "mm-thread",
        request.request_id,
        "HTTP 400 exceeds",
        context_exceeded=True,
        context_tokens=800,
    )
    summary_request = one(turn.model_error(refusal), RequestModel)
    assert summary_request.messages[-1].content == COMPACT_INSTRUCTION
    compact = one(turn.model_answer(reply(summary_request, "short")), Compact)
    retry = one(saved(turn, turn.persisted(compact.request_id)), RequestModel)
    assert [m.content for m in retry.messages[1:]] == [SUMMARY_PREFIX + "short", "again"]
    # The server's context size is learnt for the session's next requests.
    assert turn.state.context_tokens == 800
    # A second refusal in the same turn fails it with the server's words (after trying to
    # compact what is left, which a summary of a summary does not need to pass).
    second = ModelError("mm-thread", retry.request_id, "HTTP 400 exceeds", context_exceeded=True)
    effects = ended(turn, turn.model_error(second))
    if not only(effects, Finish):
        again = one(effects, RequestModel)
        still = ModelError("mm-thread", again.request_id, "still too long")
        effects = ended(turn, turn.model_error(still))
        assert one(effects, Emit).event == CompactionFailed(
            session="mm-thread",
            detail="the model could not summarise: still too long",
            at=one(effects, Emit).event.at,
        )
    outcome = one(effects, Finish).outcome
    assert outcome == TurnFailed("mm-thread", FailReason.MODEL_ERROR, "HTTP 400 exceeds")


def test_a_failed_compaction_before_a_request_still_sends_it() -> None:
    turn = new_turn(old_history(6), context=1000)
    summary_request = one(saved(turn, turn.start("what now?")), RequestModel)
    effects = turn.model_error(ModelError("mm-thread", summary_request.request_id, "down"))
    assert isinstance(only(effects, Emit)[0].event, CompactionFailed)
    request = one(effects, RequestModel)
    assert request.messages[-1].content == "what now?"
    assert len(request.messages) == 1 + 12 + 1  # nothing was lost


def test_a_cancel_while_the_store_compacts_keeps_this_turns_messages_after_the_summary() -> None:
    turn = new_turn(old_history(6), context=1000)
    summary_request = one(saved(turn, turn.start("what now?")), RequestModel)
    one(turn.model_answer(reply(summary_request, "we talked")), Compact)
    effects = turn.cancel(FailReason.CANCELLED, "stop")
    assert one(effects, Persist).messages == (ChatMessage("user", "what now?"),)
    assert [m.content for m in turn.state.transcript] == [SUMMARY_PREFIX + "we talked", "what now?"]
    assert one(effects, Finish).outcome.reason is FailReason.CANCELLED


def test_after_the_turn_a_history_past_the_ratio_is_compacted() -> None:
    turn = new_turn(context=1000)
    request = one(saved(turn, turn.start("hi")), RequestModel)
    usage = Usage(prompt_tokens=900, completion_tokens=5, cached_tokens=0, requests=1)
    effects = saved(turn, turn.model_answer(reply(request, "hello", usage=usage)))
    assert not only(effects, Finish)
    summary_request = one(effects, RequestModel)
    assert summary_request.messages[-1].content == COMPACT_INSTRUCTION
    compact = one(turn.model_answer(reply(summary_request, "greetings")), Compact)
    finish = one(turn.persisted(compact.request_id), Finish)
    assert finish.outcome == TurnCompleted("mm-thread", "hello", usage=usage)
    assert turn.state.transcript == [ChatMessage("user", SUMMARY_PREFIX + "greetings")]
