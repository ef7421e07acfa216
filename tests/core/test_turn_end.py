"""A turn is stored as running before it is told started, and stored as ended before it is
told ended (``actors.core.ending_steps``): a crash in between leaves a mark the next start
finds. Driven input by input, without threads or actors."""

from __future__ import annotations

from test_turn import answer, new_state, new_turn, one, only

from actors.core.turn_effects import Emit, Finish, Persist, RequestModel
from messages import (
    ChatMessage,
    FailReason,
    ModelAnswer,
    ModelAnswered,
    ModelError,
    ToolResult,
    TurnCompleted,
    TurnEnded,
    TurnStarted,
)


def told(effects) -> list[type]:
    """The events ``effects`` tell subscribers (not those only handed to the tracer)."""
    return [type(e.event) for e in only(effects, Emit) if e.tell]


def test_a_turn_is_traced_as_started_at_once_and_told_after_its_first_write() -> None:
    turn = new_turn()
    effects = turn.start("hello")
    (traced,) = only(effects, Emit)
    assert isinstance(traced.event, TurnStarted) and (traced.tell, traced.trace) == (False, True)
    after = turn.persisted(one(effects, Persist).request_id)
    started = only(after, Emit)[0]
    assert started.event == traced.event and (started.tell, started.trace) == (True, False)


def test_the_first_write_marks_the_turn_running_and_only_then_is_it_told_started() -> None:
    turn = new_turn()
    effects = turn.start("hello")
    first = one(effects, Persist)
    assert first.running is True
    assert told(effects) == []  # not before the mark is durable
    after = turn.persisted(first.request_id)
    assert told(after)[0] is TurnStarted  # then the request it sends
    assert one(after, RequestModel)


def test_a_final_answer_stores_the_end_with_it_and_no_write_follows() -> None:
    turn = new_turn()
    first = one(turn.start("hi"), Persist)
    request = one(turn.persisted(first.request_id), RequestModel)
    write = one(turn.model_answer(answer(request, "hello there")), Persist)
    assert write.running is False
    assert write.messages == (ChatMessage(role="assistant", content="hello there"),)
    after = turn.persisted(write.request_id)
    assert not only(after, Persist)
    assert told(after) == [ModelAnswered, TurnEnded]
    assert one(after, Finish).outcome == TurnCompleted("mm-thread", "hello there")


def test_a_failed_turn_is_told_ended_only_once_its_end_is_stored() -> None:
    turn = new_turn()
    first = one(turn.start("go"), Persist)
    request = one(turn.persisted(first.request_id), RequestModel)
    effects = turn.model_error(ModelError("mm-thread", request.request_id, "HTTP 500: boom"))
    end = one(effects, Persist)
    assert (end.messages, end.running) == ((), False)
    assert told(effects) == [] and not only(effects, Finish)
    assert turn.persisted(end.request_id + 100) == []  # another write's answer: still waiting
    after = turn.persisted(end.request_id)
    assert told(after) == [TurnEnded]
    assert one(after, Finish).outcome.reason is FailReason.MODEL_ERROR


def test_an_end_write_the_store_refuses_still_ends_the_turn() -> None:
    turn = new_turn()
    first = one(turn.start("go"), Persist)
    request = one(turn.persisted(first.request_id), RequestModel)
    end = one(turn.model_error(ModelError("mm-thread", request.request_id, "boom")), Persist)
    after = turn.store_failed(end.request_id, "disk full")
    assert told(after) == [TurnEnded]
    assert one(after, Finish).outcome.reason is FailReason.MODEL_ERROR  # not the store's
    assert turn.done


def test_a_turn_whose_first_write_failed_needs_no_end_write() -> None:
    turn = new_turn()
    first = one(turn.start("go"), Persist)
    after = turn.store_failed(first.request_id, "disk full")
    assert not only(after, Persist)
    assert told(after) == [TurnEnded]  # never told started: nothing of it is stored
    assert one(after, Finish).outcome.reason is FailReason.STORE_ERROR


def test_a_cancel_ends_at_once_with_its_end_on_the_last_write() -> None:
    turn = new_turn()
    first = one(turn.start("go"), Persist)
    request = one(turn.persisted(first.request_id), RequestModel)
    calls = turn.model_answer(answer(request, None, ("lookup", "{}"), ("lookup", "{}")))
    turn.persisted(one(calls, Persist).request_id)
    one(turn.tool_result(ToolResult(1, "first")), Persist)
    effects = turn.cancel(FailReason.CANCELLED, "by the user")
    write = one(effects, Persist)
    assert write.running is False and [m.tool_call_id for m in write.messages] == [2]
    assert told(effects) == [TurnEnded]
    assert one(effects, Finish).outcome.reason is FailReason.CANCELLED


def test_a_cancel_before_any_answer_still_writes_the_end() -> None:
    turn = new_turn()
    first = one(turn.start("go"), Persist)
    effects = turn.cancel(FailReason.CANCELLED, "at once")  # the first write may commit
    end = one(effects, Persist)
    assert end.request_id != first.request_id and end.running is False
    assert told(effects) == [TurnEnded]


def test_a_cancel_while_the_end_is_being_stored_tells_the_end_once() -> None:
    turn = new_turn()
    first = one(turn.start("go"), Persist)
    request = one(turn.persisted(first.request_id), RequestModel)
    end = one(turn.model_error(ModelError("mm-thread", request.request_id, "boom")), Persist)
    effects = turn.cancel(FailReason.CANCELLED, "meanwhile")
    assert told(effects) == [TurnEnded]
    assert one(effects, Finish).outcome.reason is FailReason.MODEL_ERROR  # decided already
    assert turn.persisted(end.request_id) == []  # its late answer tells nothing twice


def test_a_new_child_asks_at_once_and_is_told_started_with_its_first_write() -> None:
    state = new_state("sub-p-1")
    state.transcript.append(ChatMessage(role="user", content="task"))
    state.turns = 1
    turn = new_turn(state)
    request = one(turn.start("task", stored=True), RequestModel)
    write = one(turn.model_answer(ModelAnswer("sub-p-1", request.request_id, "done")), Persist)
    # Its first write (its record, created with it) also ends it: nothing marks it running.
    assert write.running is False
    assert told(turn.persisted(write.request_id)) == [TurnStarted, ModelAnswered, TurnEnded]


def test_a_new_childs_first_write_marks_it_running_when_it_goes_on() -> None:
    state = new_state("sub-p-1")
    state.transcript.append(ChatMessage(role="user", content="task"))
    turn = new_turn(state)
    request = one(turn.start("task", stored=True), RequestModel)
    calls = turn.model_answer(answer(request, None, ("lookup", "{}")))
    write = one(calls, Persist)
    assert write.running is True
    assert told(turn.persisted(write.request_id))[:2] == [TurnStarted, ModelAnswered]
