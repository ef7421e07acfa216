"""A turn's end (actors/core/ending_steps.py) and its compaction steps
(actors/core/compaction_steps.py), pinned at the core where the whole mutation lane found them
unpinned: what TurnEnded carries, which writes a cancel sends, when the history is long enough
to compact, and how much of it a summary request carries."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import msgspec
from test_turn_limits import COMPACT_INSTRUCTION, one, only, reply, saved

from actors.core import compaction_steps
from actors.core.dispatch import Registry
from actors.core.ending_steps import turn_ended
from actors.core.limits import Limits
from actors.core.session_state import SessionState, estimate_tokens, message_chars
from actors.core.turn import Turn
from actors.core.turn_effects import CancelModel, Compact, Emit, Finish, Persist, RequestModel
from messages import (
    Baseline,
    ChatMessage,
    CompactionFailed,
    FailReason,
    ModelError,
    TurnCompleted,
    TurnFailed,
)

NOW = datetime(2026, 12, 6, 3, 0, tzinfo=UTC)
SESSION = "mm-thread"


def new_turn(
    history: list[ChatMessage] | None = None,
    *,
    threshold: int = 1_000_000,
    context: int | None = None,
    state: SessionState | None = None,
) -> Turn:
    state = state or SessionState(SESSION, Baseline("be brief", ()), 0, list(history or []))
    limits = Limits(8, 1000, 200, threshold, context_tokens=context)
    return Turn(state, Registry(), limits, itertools.count(1), lambda: NOW)


# TurnEnded.


def test_a_typed_turns_end_carries_its_output_as_plain_values() -> None:
    class Count(msgspec.Struct):
        n: int

    ended = turn_ended(SESSION, TurnCompleted(SESSION, '{"n":3}', output=Count(3)))
    assert (ended.session, ended.completed, ended.output) == (SESSION, True, {"n": 3})
    untyped = turn_ended(SESSION, TurnCompleted(SESSION, "three"))
    assert (untyped.completed, untyped.output) == (True, None)
    failed = turn_ended(SESSION, TurnFailed(SESSION, FailReason.TIMEOUT, "late"))
    assert (failed.completed, failed.reason, failed.detail) == (False, FailReason.TIMEOUT, "late")


# A cancel's writes.


def test_a_cancel_while_asking_sends_the_turns_end_in_a_numbered_write_of_its_own() -> None:
    turn = new_turn()
    request = one(saved(turn, turn.start("hi")), RequestModel)
    effects = turn.cancel(FailReason.CANCELLED, "stop")
    assert effects[0] == CancelModel(request.request_id)
    end = one(effects, Persist)
    assert (end.messages, end.running) == ((), False)
    assert isinstance(end.request_id, int) and end.request_id > request.request_id
    assert one(effects, Finish).outcome == TurnFailed(SESSION, FailReason.CANCELLED, "stop")


def test_a_new_child_cancelled_before_its_first_write_stores_nothing() -> None:
    state = SessionState("sub-p-1", Baseline("be brief", ()), 0, [ChatMessage("user", "go")])
    state.parent = "p"
    turn = new_turn(state=state)
    one(turn.start("go", stored=True), RequestModel)
    effects = turn.cancel(FailReason.CANCELLED, "stop")
    assert not only(effects, Persist)  # its record was never written: nothing to end
    assert one(effects, Finish).outcome.reason is FailReason.CANCELLED


# When a history is compacted, and what a summary request carries.


def finished_or_summarising(threshold: int) -> list:
    turn = new_turn(threshold=threshold)
    request = one(saved(turn, turn.start("hi")), RequestModel)
    return saved(turn, turn.model_answer(reply(request, "hello")))


def test_a_history_is_compacted_only_past_the_threshold() -> None:
    chars = len("hi") + len("hello")
    at = finished_or_summarising(chars)  # exactly at compact.threshold_chars: kept
    assert one(at, Finish).outcome == TurnCompleted(SESSION, "hello")
    past = finished_or_summarising(chars - 1)
    summary_request = one(past, RequestModel)
    assert summary_request.messages[0] == ChatMessage(role="system", content="be brief")
    assert summary_request.messages[-1] == ChatMessage(role="user", content=COMPACT_INSTRUCTION)


def test_a_summary_request_is_numbered_like_any_request() -> None:
    turn = new_turn(threshold=1)
    request = one(saved(turn, turn.start("hi")), RequestModel)
    summary_request = one(saved(turn, turn.model_answer(reply(request, "hello"))), RequestModel)
    compact = one(turn.model_answer(reply(summary_request, "we said hello")), Compact)
    assert isinstance(compact.request_id, int) and compact.request_id > summary_request.request_id
    assert one(turn.persisted(compact.request_id), Finish)


def test_a_failed_summary_is_told_for_its_session() -> None:
    turn = new_turn(threshold=1)
    request = one(saved(turn, turn.start("hi")), RequestModel)
    summary_request = one(saved(turn, turn.model_answer(reply(request, "hello"))), RequestModel)
    effects = turn.model_error(ModelError(SESSION, summary_request.request_id, "down"))
    (event,) = [e.event for e in only(effects, Emit) if isinstance(e.event, CompactionFailed)]
    assert (event.session, event.detail) == (SESSION, "the model could not summarise: down")
    assert one(effects, Finish).outcome == TurnCompleted(SESSION, "hello")


def tail_cost(messages: list[ChatMessage]) -> int:
    return sum(estimate_tokens(message_chars((m,)), 1) for m in messages)


def test_a_summary_request_carries_as_much_history_as_fits_the_context() -> None:
    history = [
        ChatMessage("user" if n % 2 == 0 else "assistant", f"message {n} " + "w" * (n % 7))
        for n in range(60)
    ]
    for context in range(150, 700, 3):
        turn = new_turn(context=context)
        state = turn.state
        (request,) = compaction_steps.summarise(turn, history)
        sent = list(request.messages[1:-1])
        assert sent == history[len(history) - len(sent) :]  # the end of the history
        room = int(turn.limits.threshold_ratio * context)
        instruction = estimate_tokens(len(COMPACT_INSTRUCTION), 1)
        used = state.baseline_tokens() + tail_cost(sent) + instruction
        assert used <= room, context
        if len(sent) < len(history):  # one more message would not have fitted
            before = history[len(history) - len(sent) - 1]
            assert used + tail_cost([before]) > room, context
