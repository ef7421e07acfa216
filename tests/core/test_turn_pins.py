"""The turn machine's failure and late-reply paths (actors/core/turn.py), pinned at the core:
a store that fails a write ends the turn with the store's words (never leaves it waiting), and
a late or stale reply (another request id) changes nothing."""

from __future__ import annotations

from test_turn import answer, ended, new_turn, one, only, persist_and_ask

from actors.core.turn_effects import Emit, Finish, Persist, RequestModel, Spawn
from messages import (
    FailReason,
    ModelAnswer,
    SubagentCompleted,
    SubagentFailed,
    SubagentFinished,
    ToolCallFinished,
    TurnCompleted,
    TurnEnded,
    TurnFailed,
    Usage,
)


def test_a_failed_write_of_the_user_message_fails_the_turn_with_the_stores_words() -> None:
    turn = new_turn()
    saved = one(turn.start("hello"), Persist)
    finish = one(ended(turn, turn.store_failed(saved.request_id, "disk full")), Finish)
    assert finish.outcome == TurnFailed("mm-thread", FailReason.STORE_ERROR, "disk full")
    assert turn.done
    assert turn.persisted(saved.request_id) == []  # a late acknowledgement changes nothing


def test_a_failed_write_of_the_answer_fails_the_turn_not_leaves_it_waiting() -> None:
    turn = new_turn()
    request = persist_and_ask(turn, turn.start("hi"))
    saved = one(turn.model_answer(answer(request, "hello there")), Persist)
    failed = turn.store_failed(saved.request_id, "locked", FailReason.BUSY)
    finish = one(ended(turn, failed), Finish)
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
    effects = ended(turn, turn.store_failed(saved.request_id, "disk full"))
    (event,) = [e.event for e in only(effects, Emit) if isinstance(e.event, TurnEnded)]
    assert (event.completed, event.reason, event.detail) == (
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


def _spawned(turn):
    """A turn whose model called ``subagent`` once: the Spawn it asked for."""
    request = persist_and_ask(turn, turn.start("go"))
    saved = one(turn.model_answer(answer(request, None, ("subagent", '{"task": "t"}'))), Persist)
    return one(turn.persisted(saved.request_id), Spawn)


def test_a_childs_finish_is_told_once_the_parent_stored_its_answer() -> None:
    turn = new_turn()
    spawn = _spawned(turn)
    done = SubagentCompleted("mm-thread", spawn.call_id, spawn.child, "found it", False, Usage())
    effects = turn.subagent_result(done)
    assert not only(effects, Emit)  # nothing told before the answer is durable (SPEC 18)
    told = turn.persisted(one(effects, Persist).request_id)
    finished = [e.event for e in only(told, Emit) if isinstance(e.event, SubagentFinished)]
    assert finished == [
        SubagentFinished(
            session="mm-thread",
            call_id=spawn.call_id,
            child=spawn.child,
            completed=True,
            at=finished[0].at,
        )
    ]


def test_a_child_that_answers_a_turn_gone_is_told_as_a_call_that_failed() -> None:
    turn = new_turn()
    spawn = _spawned(turn)
    turn.cancel(FailReason.CANCELLED, "stop")
    late = SubagentCompleted("mm-thread", spawn.call_id, spawn.child, "too late", False, Usage())
    (event,) = [e.event for e in only(turn.subagent_result(late), Emit)]
    assert isinstance(event, SubagentFinished)
    assert (event.child, event.completed, event.reason) == (
        spawn.child,
        False,
        FailReason.CANCELLED,
    )
    failed = SubagentFailed(
        "mm-thread", spawn.call_id, spawn.child, FailReason.BUDGET, False, "spent"
    )
    (event,) = [e.event for e in only(turn.subagent_result(failed), Emit)]
    assert (event.completed, event.reason) == (False, FailReason.BUDGET)
