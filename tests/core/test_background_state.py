"""Background subagents' decisions, driven input by input without threads or actors.

The test plays the Context's shell (it answers the state's questions at once) and the store
(it answers each background row's request when the test says so), and reads the effects.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

import msgspec

from actors import Config
from actors.core.agents import Agents
from actors.core.context_effects import (
    BuildBaseline,
    ContextEffect,
    Emit,
    Reply,
    Report,
    StartSession,
    TellSession,
    ToSession,
    ToStore,
)
from actors.core.context_state import ContextState
from actors.core.dispatch import Registry
from actors.core.limits import Limits
from actors.core.session_state import SessionState
from actors.core.turn import Turn
from actors.core.turn_effects import Finish, Persist, RequestModel, Spawn
from messages import (
    BackgroundLoaded,
    BackgroundReport,
    BackgroundRow,
    BackgroundSaved,
    Baseline,
    Cancel,
    ChatMessage,
    ChildTimedOut,
    DropBackground,
    FailReason,
    FamilyIdle,
    JobSkipped,
    LoadBackground,
    ModelAnswer,
    OpenSession,
    ProposedCall,
    RunTurn,
    SaveBackground,
    ScheduledTurn,
    SessionLoaded,
    SessionRecord,
    SessionTurnEnded,
    StartTurn,
    SubagentFinished,
    SubagentRequest,
    SubagentStarted,
    ToolDone,
    ToolResult,
    TurnCompleted,
    TurnFailed,
    WaitFamily,
)

NOW = datetime(2026, 11, 30, 7, 0, tzinfo=UTC)
BASELINE = Baseline("be brief")


class Shell:
    """ContextActor minus the actors: questions answered at once, a Report handed back."""

    def __init__(self, tmp_path: Any, **subagents: Any) -> None:
        config = Config(home=str(tmp_path))
        section = msgspec.structs.replace(config.subagents, **{"background": True, **subagents})
        config = config.replace(subagents=section, loop=msgspec.structs.replace(config.loop))
        self.state = ContextState(config, Agents(config, Registry()), lambda: NOW)

    def run(self, effects: list[ContextEffect]) -> list[ContextEffect]:
        done: list[ContextEffect] = []
        for effect in effects:
            if isinstance(effect, BuildBaseline) and effect.known_only:
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
                done += self.run(list(effect.then))
            elif isinstance(effect, Report):
                r = effect
                report = self.state.report(r.parent, r.child, r.call_id, r.text, False, r.finished)
                done += self.run(report)
        return done

    def stored(self, effects: list[ContextEffect]) -> list[ContextEffect]:
        """The store answers every background row request among ``effects`` (it is durable)."""
        done: list[ContextEffect] = []
        for effect in of(ToStore, effects):
            msg = effect.message
            if isinstance(msg, SaveBackground | DropBackground):
                done += self.run(
                    self.state.background_saved(BackgroundSaved(msg.session, msg.request_id))
                )
        return done

    def user_turn(self, session: str, waiter: str) -> None:
        """A user's turn of stored ``session`` runs on a live actor."""
        (opening,) = self.run(self.state.start_turn(StartTurn(session, "hi", reply_to=waiter)))
        assert isinstance(opening, ToStore) and isinstance(opening.message, OpenSession)
        record = SessionRecord(session, BASELINE, 0, (), 0, 1, False)
        self.run(self.state.loaded(SessionLoaded(record, False, opening.message.request_id)))

    def background_child(self, parent: str, call_id: int) -> list[ContextEffect]:
        """``parent``'s call ``call_id`` starts a background child; what follows the store's
        answer."""
        request = SubagentRequest(parent, call_id, "count the stars", background=True)
        asked = self.run(self.state.spawn(request))
        (save,) = of(ToStore, asked)
        assert isinstance(save.message, SaveBackground) and save.message.row.report is None
        assert not of(ToSession, asked) and not of(Emit, asked)  # stored before anyone hears
        return self.stored(asked)

    def ended(self, session: str, outcome: Any, reports: tuple[str, ...] = ()) -> list[Any]:
        return self.run(
            self.state.turn_ended(SessionTurnEnded(session, outcome, 1, False, reports))
        )


def of(kind: type, effects: list[ContextEffect]) -> list[Any]:
    return [e for e in effects if isinstance(e, kind)]


def told(effects: list[ContextEffect]) -> list[Any]:
    return [e.message for e in of(TellSession, effects)]


def test_a_background_call_is_stored_then_answered_started(tmp_path) -> None:
    shell = Shell(tmp_path)
    shell.user_turn("p", "w")
    effects = shell.background_child("p", 1)
    (started,) = [e.event for e in of(Emit, effects) if isinstance(e.event, SubagentStarted)]
    assert started.background and started.child == "sub-p-1"
    (answer,) = of(ToSession, effects)
    assert answer.message == ToolDone("p", answer.message.result)
    assert answer.message.result.text == "sub-p-1 started in the background"
    (run,) = told(effects)
    assert isinstance(run, RunTurn) and run.pool == "background"


def finished_events(effects) -> list[SubagentFinished]:
    return [e.event for e in of(Emit, effects) if isinstance(e.event, SubagentFinished)]


def test_a_report_a_turn_did_not_store_becomes_one_new_turn(tmp_path) -> None:
    shell = Shell(tmp_path)
    shell.user_turn("p", "w")
    shell.background_child("p", 1)
    ended = shell.ended("sub-p-1", TurnCompleted("sub-p-1", "6000"))
    assert not finished_events(ended)  # told once its report is stored, not before
    delivered = shell.stored(ended)
    assert [f.completed for f in finished_events(delivered)] == [True]
    assert told(delivered) == [BackgroundReport("p", "sub-p-1", "sub-p-1 completed\n6000", False)]
    # The parent's turn ended before its next request: the report was not stored by it.
    after = shell.ended("p", TurnCompleted("p", "bye"))
    assert Reply("w", TurnCompleted("p", "bye")) in after
    (run,) = told(after)
    assert isinstance(run, RunTurn)
    assert (run.text, run.speaker) == ("sub-p-1 completed\n6000", "subagent")
    assert [r.child for r in run.reports] == ["sub-p-1"]
    assert not shell.state.family_idle("p")
    # That turn stores it: it is delivered, and no further turn is started.
    last = shell.ended("p", TurnCompleted("p", "noted"), reports=("sub-p-1",))
    assert told(last) == []
    assert shell.state.family_idle("p")


def test_a_report_for_a_free_parent_starts_a_turn_and_a_user_turn_meanwhile_is_busy(
    tmp_path,
) -> None:
    shell = Shell(tmp_path)
    shell.user_turn("p", "w")
    shell.background_child("p", 1)
    shell.ended("p", TurnCompleted("p", "later"))
    turn = shell.stored(shell.ended("sub-p-1", TurnFailed("sub-p-1", FailReason.MODEL_ERROR)))
    (run,) = told(turn)
    assert run.text == "sub-p-1 failed" and run.speaker == "subagent"
    busy = shell.run(shell.state.start_turn(StartTurn("p", "hello", reply_to="w2")))
    assert [e.message.reason for e in of(Reply, busy)] == [FailReason.BUSY]


def test_cancelling_the_parent_silences_its_background_children(tmp_path) -> None:
    shell = Shell(tmp_path)
    shell.user_turn("p", "w")
    shell.background_child("p", 1)
    family, effects = shell.state.cancel("p", FailReason.CANCELLED, "cancelled")
    assert family == ("p", "sub-p-1")
    assert [type(m) for m in told(effects)] == [Cancel, Cancel]
    ended = shell.ended("sub-p-1", TurnFailed("sub-p-1", FailReason.CANCELLED))
    assert [type(e.message) for e in of(ToStore, ended)] == [DropBackground]
    dropped = shell.stored(ended)
    finished = finished_events(dropped)
    assert [(f.completed, f.reason) for f in finished] == [(False, FailReason.CANCELLED)]
    assert told(dropped) == []


def test_a_report_the_store_refuses_is_told_failed_as_the_next_start_reports_it(
    tmp_path,
) -> None:
    shell = Shell(tmp_path)
    shell.user_turn("p", "w")
    shell.background_child("p", 1)
    ended = shell.ended("sub-p-1", TurnCompleted("sub-p-1", "6000"))
    (save,) = of(ToStore, ended)
    refused = BackgroundSaved("sub-p-1", save.message.request_id, "disk full")
    effects = shell.run(shell.state.background_saved(refused))
    finished = finished_events(effects)
    assert [(f.completed, f.reason) for f in finished] == [(False, FailReason.STORE_ERROR)]
    assert told(effects) == []  # nothing delivered: the row waits for the next start


def test_a_background_child_cancelled_itself_still_reports_failed(tmp_path) -> None:
    shell = Shell(tmp_path)
    shell.user_turn("p", "w")
    shell.background_child("p", 1)
    shell.state.cancel("sub-p-1", FailReason.CANCELLED, "cancelled")
    ended = shell.ended("sub-p-1", TurnFailed("sub-p-1", FailReason.CANCELLED))
    (save,) = of(ToStore, ended)
    assert save.message.row.report == "sub-p-1 failed"


def test_a_background_child_past_its_time_limit_reports_failed(tmp_path) -> None:
    shell = Shell(tmp_path)
    shell.state.config = shell.state.config.replace(
        loop=msgspec.structs.replace(shell.state.config.loop, child_timeout_s=5.0)
    )
    shell.user_turn("p", "w")
    shell.background_child("p", 1)
    spawn = shell.state.holds.get("sub-p-1").spawn
    effects = shell.run(shell.state.timed_out(ChildTimedOut("sub-p-1", spawn)))
    saves = [e.message for e in of(ToStore, effects) if isinstance(e.message, SaveBackground)]
    assert [s.row.report for s in saves] == ["sub-p-1 failed"]
    assert told(shell.stored(effects))[-1] == BackgroundReport("p", "sub-p-1", "sub-p-1 failed")
    # Its cancelled turn winds down later and reports nothing more.
    assert of(ToStore, shell.ended("sub-p-1", TurnFailed("sub-p-1", FailReason.CANCELLED))) == []


def test_max_background_counts_per_family(tmp_path) -> None:
    shell = Shell(tmp_path, max_background=1)
    shell.user_turn("p", "w")
    shell.user_turn("q", "w")
    shell.background_child("p", 1)
    denied = shell.run(shell.state.spawn(SubagentRequest("p", 2, "more", background=True)))
    (answer,) = of(ToSession, denied)
    assert answer.message.result.text == (
        "Denied: a limit of this runtime was reached: 1 background subagents are running; "
        "wait for one to report."
    )
    shell.background_child("q", 1)  # another family has its own count
    shell.stored(shell.ended("sub-p-1", TurnCompleted("sub-p-1", "ok")))
    shell.background_child("p", 3)  # one reported: room again


def test_the_next_start_reports_cut_off_children_and_delivers_stored_reports(tmp_path) -> None:
    shell = Shell(tmp_path)
    (load,) = of(ToStore, shell.state.begin())
    assert isinstance(load.message, LoadBackground)
    waiting = shell.state.wait_family(WaitFamily("p", "w"))
    assert waiting == []  # the rows are being read: not idle yet
    rows = (
        BackgroundRow("sub-p-1", "p", 1),
        BackgroundRow("sub-q-4", "q", 4, "sub-q-4 completed\nok"),
    )
    effects = shell.run(shell.state.background_loaded(BackgroundLoaded(rows, 1)))
    saves = [e.message.row for e in of(ToStore, effects) if isinstance(e.message, SaveBackground)]
    assert saves == [BackgroundRow("sub-p-1", "p", 1, "sub-p-1 failed")]
    opens = [e.message for e in of(ToStore, effects) if isinstance(e.message, OpenSession)]
    assert [o.session for o in opens] == ["q"]  # q's report runs as a turn of q
    assert shell.state.settle() == []
    turn = shell.stored(effects)
    assert [o.message.session for o in of(ToStore, turn)] == ["p"]


def test_wait_family_is_answered_once_the_family_is_idle(tmp_path) -> None:
    shell = Shell(tmp_path)
    shell.state.background.loading = False
    assert shell.state.wait_family(WaitFamily("p", "w0")) == [Reply("w0", FamilyIdle("p"))]
    shell.user_turn("p", "w")
    shell.background_child("p", 1)
    assert shell.state.wait_family(WaitFamily("p", "w1")) == []
    shell.ended("p", TurnCompleted("p", "later"))
    assert shell.state.settle() == []  # its background child runs
    saving = shell.ended("sub-p-1", TurnCompleted("sub-p-1", "ok"))
    assert shell.state.settle() == []  # its report is being stored
    shell.stored(saving)
    assert shell.state.settle() == []  # ... and runs as a turn
    shell.ended("p", TurnCompleted("p", "noted"), reports=("sub-p-1",))
    assert shell.state.settle() == [Reply("w1", FamilyIdle("p"))]


def test_the_context_denies_a_background_call_from_a_child(tmp_path) -> None:
    shell = Shell(tmp_path)
    request = SubagentRequest("sub-p-1", 2, "deeper", background=True)
    (answer,) = of(ToSession, shell.run(shell.state.spawn(request)))
    assert answer.message.result.denied
    assert "only a top-level session runs subagents in the background" in (
        answer.message.result.text
    )


def _turn() -> Turn:
    registry = Registry().for_agent(None, {}, background=True)
    state = SessionState("p", Baseline("system", registry.specs()), 0, [])
    return Turn(state, registry, Limits(8, 1000, 50, 1_000_000), itertools.count(1), lambda: NOW)


def test_a_turn_stores_reports_before_its_next_request_and_takes_the_untrusted_flag() -> None:
    turn = _turn()
    (saved,) = [e for e in turn.start("go") if isinstance(e, Persist)]
    asked = turn.persisted(saved.request_id)
    (request,) = [e for e in asked if isinstance(e, RequestModel)]
    tell = ProposedCall("subagent", '{"task": "t", "background": true}')
    answer = ModelAnswer("p", request.request_id, None, (tell,))
    (stored,) = [e for e in turn.model_answer(answer) if isinstance(e, Persist)]
    (spawn,) = [e for e in turn.persisted(stored.request_id) if isinstance(e, Spawn)]
    assert spawn.background
    assert turn.report(BackgroundReport("p", "sub-p-1", "sub-p-1 failed", untrusted=True)) == []
    started = ToolResult(1, "sub-p-1 started in the background")
    (results,) = [e for e in turn.tool_result(started) if isinstance(e, Persist)]
    assert results.reports == ()
    (reports,) = [e for e in turn.persisted(results.request_id) if isinstance(e, Persist)]
    assert reports.messages == (
        ChatMessage(role="user", content="sub-p-1 failed", name="subagent"),
    )
    assert reports.reports == ("sub-p-1",) and turn.state.untrusted
    assert turn.issued_reports == ["sub-p-1"]
    (after,) = [e for e in turn.persisted(reports.request_id) if isinstance(e, RequestModel)]
    assert after.messages[: len(request.messages)] == request.messages  # only extended
    assert after.messages[-1].name == "subagent"


def test_a_report_for_a_turn_that_answers_is_left_out() -> None:
    turn = _turn()
    (saved,) = [e for e in turn.start("go") if isinstance(e, Persist)]
    (request,) = [e for e in turn.persisted(saved.request_id) if isinstance(e, RequestModel)]
    turn.report(BackgroundReport("p", "sub-p-1", "sub-p-1 failed"))
    (final,) = [
        e
        for e in turn.model_answer(ModelAnswer("p", request.request_id, "done"))
        if isinstance(e, Persist)
    ]
    assert final.reports == ()
    assert any(isinstance(e, Finish) for e in turn.persisted(final.request_id))
    assert turn.issued_reports == []


def test_a_scheduled_job_is_not_skipped_for_a_background_child(tmp_path) -> None:
    shell = Shell(tmp_path)
    shell.user_turn("p", "w")
    shell.background_child("p", 1)
    job = ScheduledTurn("nightly", "p", "check", reply_to="sched")
    skipped = shell.run(shell.state.scheduled(job))
    assert [type(e.message) for e in of(Reply, skipped)] == [JobSkipped]
    assert of(Reply, skipped)[0].message.held == ("p",)  # the parent's own turn, not the child
    shell.ended("p", TurnCompleted("p", "later"))
    runs = shell.run(shell.state.scheduled(job))
    assert [type(m) for m in told(runs)] == [RunTurn]  # the child still runs in the background
