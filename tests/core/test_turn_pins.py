"""The turn machine's failure and late-reply paths (actors/core/turn.py), pinned at the core:
a store that fails a write ends the turn with the store's words (never leaves it waiting), and
a late or stale reply (another request id) changes nothing."""

from __future__ import annotations

from test_turn import answer, new_turn, one, only, persist_and_ask

from actors.core.turn_effects import Emit, Finish, Persist, RequestModel
from messages import FailReason, ModelAnswer, ToolCallFinished, TurnCompleted, TurnEnded, TurnFailed


def test_a_failed_write_of_the_user_message_fails_the_turn_with_the_stores_words() -> None:
    turn = new_turn()
    saved = one(turn.start("hello"), Persist)
    finish = one(turn.store_failed(saved.request_id, "disk full"), Finish)
    assert finish.outcome == TurnFailed("mm-thread", FailReason.STORE_ERROR, "disk full")
    assert turn.done
    assert turn.persisted(saved.request_id) == []  # a late acknowledgement changes nothing


def test_a_failed_write_of_the_answer_fails_the_turn_not_leaves_it_waiting() -> None:
    turn = new_turn()
    request = persist_and_ask(turn, turn.start("hi"))
    saved = one(turn.model_answer(answer(request, "hello there")), Persist)
    finish = one(turn.store_failed(saved.request_id, "locked", FailReason.BUSY), Finish)
    assert finish.outcome == TurnFailed("mm-thread", FailReason.BUSY, "locked")
    assert turn.done


def test_a_stale_store_reply_is_ignored_and_the_turn_goes_on() -> None:
    turn = new_turn()
    saved = one(turn.start("hello"), Persist)
    assert turn.store_failed(saved.request_id + 100, "not ours") == []
    assert turn.persisted(saved.request_id + 100) == []
    assert not turn.done
    request = one(turn.persisted(saved.request_id), RequestModel)
    assert turn.persisted(saved.request_id) == []  # twice: nothing more
    stale = ModelAnswer("mm-thread", request.request_id + 100, "stale", ())
    assert turn.model_answer(stale) == []
    saved = one(turn.model_answer(answer(request, "fresh")), Persist)
    assert turn.model_answer(answer(request, "again")) == []  # answered already
    finish = one(turn.persisted(saved.request_id), Finish)
    assert finish.outcome == TurnCompleted("mm-thread", "fresh")


def test_a_cancelled_turn_ignores_what_comes_after() -> None:
    turn = new_turn()
    request = persist_and_ask(turn, turn.start("hi"))
    effects = turn.cancel(FailReason.CANCELLED, "stop")
    finish = one(effects, Finish)
    assert finish.outcome == TurnFailed("mm-thread", FailReason.CANCELLED, "stop")
    assert turn.done
    assert turn.model_answer(answer(request, "late")) == []
    assert turn.cancel(FailReason.CANCELLED, "again") == []
    assert not only(turn.cancel(FailReason.CANCELLED, "again"), Finish)


def test_a_failed_turn_says_why_in_its_turn_ended_event() -> None:
    turn = new_turn()
    saved = one(turn.start("hello"), Persist)
    effects = turn.store_failed(saved.request_id, "disk full")
    (ended,) = [e.event for e in only(effects, Emit) if isinstance(e.event, TurnEnded)]
    assert (ended.completed, ended.reason, ended.detail) == (
        False,
        FailReason.STORE_ERROR,
        "disk full",
    )


def test_a_denied_call_answers_its_own_call_id_and_says_denied() -> None:
    turn = new_turn()
    request = persist_and_ask(turn, turn.start("go"))
    saved = one(turn.model_answer(answer(request, None, ("nope", "{}"))), Persist)
    effects = turn.persisted(saved.request_id)
    stored = one(effects, Persist)
    (result,) = stored.messages
    assert (result.role, result.tool_call_id) == ("tool", 1)
    assert result.content == "Denied: there is no tool with this name: nope."
    # Told once the result is durable, not before (SPEC 18).
    assert not [e for e in only(effects, Emit) if isinstance(e.event, ToolCallFinished)]
    told = turn.persisted(stored.request_id)
    (finished,) = [e.event for e in only(told, Emit) if isinstance(e.event, ToolCallFinished)]
    assert finished.denied and finished.call_id == 1
