"""The Context's decisions, driven input by input without threads or actors.

The test plays the shell: it answers the state's questions (a baseline, a started actor) at
once, as ``ContextActor`` does, and reads the effects that come back.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec

from actors import Config
from actors.core.agents import Agents
from actors.core.context_effects import (
    BuildBaseline,
    CancelTimer,
    ContextEffect,
    Emit,
    IfGone,
    Reply,
    StartSession,
    StartTimer,
    TellSession,
    ToSession,
    ToStore,
    UpdateMemory,
)
from actors.core.context_state import ContextState
from actors.core.dispatch import Registry
from messages import (
    Baseline,
    Cancel,
    ChatMessage,
    ChildTimedOut,
    ContextStatus,
    FailReason,
    JobSkipped,
    ModelError,
    ModelRequest,
    OpenSession,
    RunTurn,
    ScheduledTurn,
    SessionCrashed,
    SessionLoaded,
    SessionRecord,
    SessionTurnEnded,
    StartTurn,
    StoreFailed,
    SubagentCompleted,
    SubagentFailed,
    SubagentFinished,
    SubagentRequest,
    TokensSpent,
    TurnCompleted,
    TurnEnded,
    TurnFailed,
    Usage,
)

NOW = datetime(2026, 11, 30, 7, 0, tzinfo=UTC)
BASELINE = Baseline("be brief")


class Shell:
    """Carries out a state's effects the way ContextActor does, minus the actors: questions
    are answered at once, a tell to an actor in ``dead`` is answered ``undelivered``."""

    def __init__(self, tmp_path: Any, **loop: Any) -> None:
        config = Config(home=str(tmp_path))
        if loop:
            config = config.replace(loop=msgspec.structs.replace(config.loop, **loop))
        self.state = ContextState(config, Agents(config, Registry()), lambda: NOW)
        self.dead: set[str] = set()
        self.known = False  # whether a baseline is known without a read (no memory file...)

    def run(self, effects: list[ContextEffect]) -> list[ContextEffect]:
        done: list[ContextEffect] = []
        for effect in effects:
            if isinstance(effect, BuildBaseline) and effect.known_only and not self.known:
                # As a shell whose memory must be read: the open goes on without a baseline.
                done += self.run(self.state.baseline_unknown(effect))
                continue
            done.append(effect)
            if isinstance(effect, BuildBaseline):
                done += self.run(self.state.baseline_built(effect, BASELINE))
            elif isinstance(effect, StartSession):
                ref = f"ref:{effect.record.id}:{effect.incarnation}"
                done += self.run(self.state.started(effect, ref))
            elif isinstance(effect, TellSession):
                if effect.ref in self.dead:
                    done += self.run(self.state.undelivered(effect))
                else:
                    done += self.run(list(effect.then))
        return done

    def open_and_run(self, session: str, waiter: str) -> int:
        """A user's turn on stored ``session``, through the store, to its live actor; returns
        the actor's incarnation."""
        (opening,) = self.run(self.state.start_turn(StartTurn(session, "hi", reply_to=waiter)))
        assert isinstance(opening, ToStore) and isinstance(opening.message, OpenSession)
        record = SessionRecord(session, BASELINE, 0, (), 0, 1, False)
        loaded = SessionLoaded(record, created=False, request_id=opening.message.request_id)
        effects = self.run(self.state.loaded(loaded))
        start, tell = effects
        assert isinstance(start, StartSession) and isinstance(tell, TellSession)
        assert isinstance(tell.message, RunTurn)
        return start.incarnation

    def spawn(self, parent: str, call_id: int) -> list[ContextEffect]:
        return self.run(self.state.spawn(SubagentRequest(parent, call_id, "count the stars")))


def of(kind: type, effects: list[ContextEffect]) -> list[Any]:
    return [e for e in effects if isinstance(e, kind)]


def replies(effects: list[ContextEffect]) -> list[tuple[str | None, Any]]:
    return [(e.to, e.message) for e in of(Reply, effects)]


def test_a_second_turn_on_a_held_session_is_answered_busy(tmp_path) -> None:
    shell = Shell(tmp_path)
    first = shell.run(shell.state.start_turn(StartTurn("s", "one", reply_to="w1")))
    assert [type(e) for e in first] == [ToStore]
    second = shell.run(shell.state.start_turn(StartTurn("s", "two", reply_to="w2")))
    detail = "session s is busy: another turn holds it"
    assert replies(second) == [("w2", TurnFailed("s", FailReason.BUSY, detail))]
    assert shell.state.status() == ContextStatus(held=("s",), live=())


def test_a_new_session_is_created_with_its_turns_user_message_and_asks_the_model_at_once(
    tmp_path,
) -> None:
    # One transaction creates the session and stores the user message (durable before the
    # model request, as ever), so the turn starts stored: no AppendMessages of its own.
    shell = Shell(tmp_path)
    (opening,) = shell.run(shell.state.start_turn(StartTurn("s", "hi", "ann", reply_to="w")))
    assert isinstance(opening, ToStore) and opening.message.first is None  # open only
    missing = StoreFailed("s", "no", missing=True, request_id=opening.message.request_id)
    asked, creating = shell.run(shell.state.store_failed(missing))
    assert isinstance(asked, BuildBaseline) and isinstance(creating, ToStore)
    create = creating.message
    assert isinstance(create, OpenSession) and create.baseline == BASELINE
    assert create.first == ChatMessage(role="user", content="hi", name="ann")
    first = create.first
    record = SessionRecord("s", BASELINE, create.slot, (first,), 1, 1, False)
    created = shell.run(shell.state.loaded(SessionLoaded(record, True, create.request_id)))
    (tell,) = of(TellSession, created)
    assert tell.message == RunTurn("hi", "ann", stored=True)
    # A session some other writer created meanwhile is opened as stored: the turn stores
    # its user message itself.
    shell = Shell(tmp_path)
    (opening,) = shell.run(shell.state.start_turn(StartTurn("t", "hi", reply_to="w")))
    missing = StoreFailed("t", "no", missing=True, request_id=opening.message.request_id)
    _, creating = shell.run(shell.state.store_failed(missing))
    record = SessionRecord("t", BASELINE, 0, (), 0, 1, False)
    stored = SessionLoaded(record, False, creating.message.request_id)
    opened = shell.run(shell.state.loaded(stored))
    (tell,) = of(TellSession, opened)
    assert tell.message == RunTurn("hi")


def test_a_childs_outcome_goes_to_its_parents_pending_call(tmp_path) -> None:
    shell = Shell(tmp_path)
    effects = shell.spawn("p", 3)
    started, ask, start, tell = effects
    assert started == Emit(started.event) and started.event.child == "sub-p-3"
    assert ask == BuildBaseline("sub-p-3", "default")
    assert isinstance(start, StartSession) and start.record.parent == "p"
    assert start.record.transcript == (ChatMessage(role="user", content=start.run.text),)
    assert tell.message.stored and tell.message.create.parent == "p"  # its first write
    assert shell.state.status() == ContextStatus(held=("sub-p-3",), live=("sub-p-3",))

    usage = Usage(prompt_tokens=5, completion_tokens=2)
    ended = SessionTurnEnded("sub-p-3", TurnCompleted("sub-p-3", "6000", usage=usage), 1, True)
    effects = shell.run(shell.state.turn_ended(ended))
    assert effects[0] == UpdateMemory("sub-p-3", 1)
    assert not of(Emit, effects)  # SubagentFinished: the parent tells it once stored
    assert of(ToSession, effects) == [
        ToSession("p", SubagentCompleted("p", 3, "sub-p-3", "6000", True, usage))
    ]
    assert shell.state.status() == ContextStatus(held=(), live=())


def test_a_crashed_session_answers_its_waiter_and_an_old_actor_changes_nothing(
    tmp_path,
) -> None:
    shell = Shell(tmp_path)
    incarnation = shell.open_and_run("s", "w")
    assert shell.run(shell.state.crashed(SessionCrashed("s", "old", incarnation - 1))) == []

    effects = shell.run(shell.state.crashed(SessionCrashed("s", "boom", incarnation)))
    ended = TurnEnded(session="s", completed=False, reason=FailReason.CRASHED, detail="boom")
    assert [msgspec.structs.replace(e.event, at=ended.at) for e in of(Emit, effects)] == [ended]
    assert replies(effects) == [("w", TurnFailed("s", FailReason.CRASHED, "boom"))]
    assert shell.state.status() == ContextStatus(held=(), live=())


def test_a_late_store_answer_is_ignored(tmp_path) -> None:
    shell = Shell(tmp_path)
    (first,) = shell.run(shell.state.start_turn(StartTurn("s", "one", reply_to="w1")))
    family, effects = shell.state.cancel("s", FailReason.CANCELLED, "stop")
    assert family == ("s",)
    assert replies(shell.run(effects)) == [("w1", TurnFailed("s", FailReason.CANCELLED, "stop"))]
    (second,) = shell.run(shell.state.start_turn(StartTurn("s", "two", reply_to="w2")))
    late = first.message.request_id
    assert late != second.message.request_id

    assert shell.state.store_failed(StoreFailed("s", "late news", request_id=late)) == []
    record = SessionRecord("s", BASELINE, 0, (), 0, 1, False)
    assert shell.state.loaded(SessionLoaded(record, False, request_id=late)) == []
    assert shell.state.status() == ContextStatus(held=("s",), live=())

    failed = StoreFailed("s", "disk full", request_id=second.message.request_id)
    effects = shell.run(shell.state.store_failed(failed))
    assert replies(effects) == [("w2", TurnFailed("s", FailReason.STORE_ERROR, "disk full"))]


def test_a_cancel_reaches_every_held_descendant_and_no_one_else(tmp_path) -> None:
    shell = Shell(tmp_path)
    shell.open_and_run("p", "w")
    shell.open_and_run("p-2", "w2")  # not a descendant of p, though its id starts with it
    shell.spawn("p", 1)
    shell.spawn("sub-p-1", 1)
    family, effects = shell.state.cancel("p", FailReason.CANCELLED, "stop")
    assert family == ("p", "sub-p-1", "sub-sub-p-1-1")
    told = of(TellSession, effects)
    assert [t.session for t in told] == list(family)
    assert all(t.message == Cancel(FailReason.CANCELLED, "stop") for t in told)
    assert replies(effects) == []  # each live session answers through its SessionTurnEnded


def test_a_second_cancel_leaves_a_family_that_is_winding_down_alone(tmp_path) -> None:
    shell = Shell(tmp_path)
    shell.open_and_run("p", "w")
    shell.spawn("p", 1)
    family, effects = shell.state.cancel("p", FailReason.CANCELLED, "stop")
    assert family == ("p", "sub-p-1")
    shell.run(effects)
    # Neither has answered yet (their actors end their turns in their own time): a second
    # cancel tells nobody again and reports nothing as cancelled by it.
    assert shell.state.status().held == ("p", "sub-p-1")
    assert shell.state.cancel("p", FailReason.CANCELLED, "again") == ((), [])
    assert shell.state.cancel("sub-p-1", FailReason.CANCELLED, "again") == ((), [])


def test_a_cancel_that_finds_a_childs_actor_dead_answers_its_parent_at_once(tmp_path) -> None:
    shell = Shell(tmp_path)
    shell.spawn("p", 1)
    shell.dead.add("ref:sub-p-1:1")
    _family, effects = shell.state.cancel("sub-p-1", FailReason.CANCELLED, "stop")
    effects = shell.run(effects)
    (told,) = of(TellSession, effects)
    assert told.if_gone is IfGone.RELEASE
    failed = SubagentFailed("p", 1, "sub-p-1", FailReason.CANCELLED, False, "stop")
    assert of(ToSession, effects) == [ToSession("p", failed)]
    assert shell.state.status().held == ()


def test_a_turn_for_a_live_actor_found_dead_reopens_the_session_from_the_store(tmp_path) -> None:
    shell = Shell(tmp_path)
    incarnation = shell.open_and_run("s", "w")
    ended = SessionTurnEnded("s", TurnCompleted("s", "ok"), 1, False)
    assert replies(shell.run(shell.state.turn_ended(ended))) == [("w", TurnCompleted("s", "ok"))]
    shell.dead.add(f"ref:s:{incarnation}")
    effects = shell.run(shell.state.start_turn(StartTurn("s", "again", reply_to="w")))
    told, opening = effects
    assert isinstance(told, TellSession) and told.if_gone is IfGone.REOPEN
    assert isinstance(opening, ToStore) and isinstance(opening.message, OpenSession)
    assert shell.state.status() == ContextStatus(held=("s",), live=())


def test_a_scheduled_turn_is_skipped_while_a_descendant_is_held(tmp_path) -> None:
    shell = Shell(tmp_path)
    shell.spawn("s", 4)
    job = ScheduledTurn("nightly", "s", "report", reply_to="scheduler")
    effects = shell.run(shell.state.scheduled(job))
    skipped = JobSkipped(session="s", job="nightly", held=("sub-s-4",))
    assert [msgspec.structs.replace(m, at=skipped.at) for _, m in replies(effects)] == [skipped]
    assert shell.state.status().held == ("sub-s-4",)


def test_a_child_that_outlives_its_time_limit_is_answered_once(tmp_path) -> None:
    shell = Shell(tmp_path, child_timeout_s=5.0)
    effects = shell.spawn("p", 2)
    (timer,) = of(StartTimer, effects)
    assert (timer.child, timer.seconds) == ("sub-p-2", 5.0)
    assert shell.state.timed_out(ChildTimedOut("sub-p-2", timer.spawn + 1)) == []  # not its own

    effects = shell.run(shell.state.timed_out(ChildTimedOut("sub-p-2", timer.spawn)))
    assert effects[0] == CancelTimer("sub-p-2", fired=True)
    (answer,) = of(ToSession, effects)
    assert answer.message.reason is FailReason.TIMEOUT
    assert [t.message.reason for t in of(TellSession, effects)] == [FailReason.CANCELLED]

    # The cancelled child winds down later: its parent has had its answer.
    cancelled = TurnFailed("sub-p-2", FailReason.CANCELLED, "cut")
    late = shell.run(shell.state.turn_ended(SessionTurnEnded("sub-p-2", cancelled, 1, False)))
    assert of(ToSession, late) == [] and of(Emit, late) == []
    assert CancelTimer("sub-p-2") in late
    assert shell.state.status() == ContextStatus(held=(), live=())


def test_a_family_past_its_token_budget_has_its_next_request_refused(tmp_path) -> None:
    shell = Shell(tmp_path, token_budget=10)
    shell.open_and_run("p", "w")
    shell.spawn("p", 1)
    request = ModelRequest("sub-p-1", 7, 0, (), (), "session:sub-p-1")
    assert [type(e).__name__ for e in shell.state.model_request(request)] == ["ToModel"]
    shell.state.tokens_spent(TokensSpent("sub-p-1", Usage(prompt_tokens=8, completion_tokens=2)))
    (refused,) = shell.state.model_request(request)
    assert isinstance(refused, Reply) and refused.to == "session:sub-p-1"
    assert isinstance(refused.message, ModelError) and refused.message.over_budget


def test_shutting_down_answers_every_held_turn_cancelled(tmp_path) -> None:
    shell = Shell(tmp_path)
    shell.open_and_run("live", "w1")
    shell.run(shell.state.start_turn(StartTurn("opening", "hi", reply_to="w2")))
    shell.spawn("live", 1)
    effects = shell.run(shell.state.shut_down("the runtime stopped"))
    failed = FailReason.CANCELLED, "the runtime stopped"
    assert sorted(replies(effects)) == [
        ("w1", TurnFailed("live", *failed)),
        ("w2", TurnFailed("opening", *failed)),
    ]
    # The child is told to stop; its parent is being cancelled too, so no SubagentFailed.
    assert {t.session for t in of(TellSession, effects)} == {"live", "sub-live-1"}
    assert of(ToSession, effects) == []
    assert not any(isinstance(e.event, SubagentFinished) for e in of(Emit, effects))
    assert shell.state.status().held == ()


def test_a_spawn_past_the_runtimes_child_limit_is_a_denial_marked_denied(tmp_path) -> None:
    shell = Shell(tmp_path, max_children_total=1)
    shell.spawn("p", 1)
    (denial,) = shell.spawn("p", 2)
    assert isinstance(denial, ToSession) and denial.session == "p"
    result = denial.message.result
    assert result.denied and result.text.startswith("Denied: ")
    assert shell.state.status().held == ("sub-p-1",)


def test_a_baseline_known_without_a_read_goes_with_the_turns_one_store_request(
    tmp_path,
) -> None:
    shell = Shell(tmp_path)
    shell.known = True  # no memory file, say
    asked, opening = shell.run(shell.state.start_turn(StartTurn("s", "hi", reply_to="w")))
    assert isinstance(asked, BuildBaseline) and asked.known_only
    request = opening.message
    assert isinstance(request, OpenSession) and request.baseline == BASELINE
    assert request.first == ChatMessage(role="user", content="hi")
    # The store created it with the message: the turn asks the model at once.
    record = SessionRecord("s", BASELINE, 0, (request.first,), 1, 1, False)
    created = shell.run(shell.state.loaded(SessionLoaded(record, True, request.request_id)))
    assert of(TellSession, created)[0].message == RunTurn("hi", stored=True)
    # It was stored: opened as it is, the turn stores its user message itself.
    _, opening = shell.run(shell.state.start_turn(StartTurn("t", "hi", reply_to="w")))
    record = SessionRecord("t", BASELINE, 0, (), 3, 1, False)
    opened = shell.run(shell.state.loaded(SessionLoaded(record, False, opening.message.request_id)))
    assert of(TellSession, opened)[0].message == RunTurn("hi")
