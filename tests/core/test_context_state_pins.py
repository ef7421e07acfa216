"""The Context's state (actors/core/context_state.py), pinned at the core: one sweep passivates
every session idle for ``sessions.idle_s``, not only the last one it finds."""

from __future__ import annotations

import logging
from datetime import timedelta

import msgspec
from test_background_state import NOW, Shell, of
from test_context_state import BASELINE, replies
from test_context_state import Shell as ContextShell

from actors import Config
from actors.core.agents import Agents
from actors.core.context_effects import (
    BuildBaseline,
    Emit,
    StartSession,
    StopSession,
    TellSession,
    ToSession,
    ToStore,
)
from actors.core.context_state import ContextState
from actors.core.dispatch import Registry
from messages import (
    ApprovalRequested,
    Baseline,
    ChildTimedOut,
    ContextStatus,
    FailReason,
    OpenSession,
    Park,
    Parked,
    ReleaseSession,
    SessionCrashed,
    SessionLoaded,
    SessionRecord,
    SessionStopped,
    SessionTurnEnded,
    StartTurn,
    StoredApproval,
    SubagentFailed,
    SubagentRequest,
    Tick,
    ToolDone,
    ToolResult,
    ToolSpec,
    TurnCompleted,
    TurnFailed,
)


def test_one_sweep_passivates_every_idle_session(tmp_path) -> None:
    shell = Shell(tmp_path)
    config = shell.state.config
    sessions = msgspec.structs.replace(config.sessions, idle_s=600)
    config = config.replace(sessions=sessions)
    shell.state = ContextState(config, Agents(config, Registry()), lambda: NOW)
    for session in ("a", "b", "c"):
        shell.user_turn(session, f"w-{session}")
        shell.ended(session, TurnCompleted(session, "done"))
    early = shell.state.tick(Tick(now=NOW + timedelta(seconds=599)))
    assert not of(StopSession, early)
    late = shell.state.tick(Tick(now=NOW + timedelta(seconds=601)))
    stopped = sorted(str(e.ref) for e in of(StopSession, late))
    assert len(stopped) == 3, late


# What a subagent call, a spawn or a session's start is answered when it cannot go on.


def typed_shell(tmp_path, extra: str = "") -> ContextShell:
    """A Context whose config has a typed profile ``typed`` (its answer: ``{"n": int}``)."""
    text = (
        f'home = "{tmp_path}"\n'
        "[agents.typed]\n"
        'description = "counts"\n'
        'output_schema = {type = "object", properties = {n = {type = "integer"}}}\n' + extra
    )
    config = Config.from_toml(text)
    shell = ContextShell(tmp_path)
    shell.state = ContextState(config, Agents(config, Registry()), lambda: NOW)
    return shell


def denial(effects: list) -> ToolResult:
    (told,) = of(ToSession, effects)
    assert isinstance(told.message, ToolDone)
    return told.message.result


def test_a_subagent_call_whose_child_id_would_not_fit_is_denied_naming_it(tmp_path) -> None:
    shell = ContextShell(tmp_path)
    parent = "p" * 60  # a valid id; its child's would be 66 bytes
    result = denial(shell.run(shell.state.spawn(SubagentRequest(parent, 3, "t"))))
    assert result.denied and result.call_id == 3
    assert result.text.startswith(
        f"Denied: the arguments are not valid for this tool: child session id `sub-{parent}-3` "
        "would not fit;"
    )
    assert shell.state.status() == ContextStatus(held=(), live=())


def test_a_subagent_call_naming_an_unknown_profile_is_denied(tmp_path) -> None:
    shell = ContextShell(tmp_path)
    effects = shell.run(shell.state.spawn(SubagentRequest("p", 3, "t", agent="nobody")))
    result = denial(effects)
    assert result == ToolResult(
        3, "Denied: the arguments are not valid for this tool: unknown agent: nobody.", denied=True
    )


def test_a_child_runs_the_profile_its_call_named_and_its_typed_answer_is_never_cut(
    tmp_path,
) -> None:
    shell = typed_shell(tmp_path, "[compact]\nsummary_chars = 100\n")
    effects = shell.run(shell.state.spawn(SubagentRequest("p", 3, "t", agent="typed")))
    (ask,) = of(BuildBaseline, effects)
    assert ask.agent == "typed" and ask.output is not None
    (start,) = of(StartSession, effects)
    assert start.record.agent == "typed"
    answer = '{"n": 1, "pad": "' + "x" * 300 + '"}'
    ended = SessionTurnEnded("sub-p-3", TurnCompleted("sub-p-3", answer), 1, False)
    (told,) = of(ToSession, shell.run(shell.state.turn_ended(ended)))
    assert told.message.summary == answer  # whole: a typed answer reaches its parent uncut
    # An untyped child's answer is a summary of at most compact.summary_chars.
    effects = shell.run(shell.state.spawn(SubagentRequest("p", 4, "t")))
    ended = SessionTurnEnded("sub-p-4", TurnCompleted("sub-p-4", answer), 1, False)
    (told,) = of(ToSession, shell.run(shell.state.turn_ended(ended)))
    assert len(told.message.summary) < len(answer)


def test_a_child_already_held_fails_its_call_busy_naming_it(tmp_path) -> None:
    shell = ContextShell(tmp_path)
    shell.spawn("p", 3)
    effects = shell.run(shell.state.spawn(SubagentRequest("p", 3, "again")))
    assert not of(Emit, effects)  # no turn began
    (told,) = of(ToSession, effects)
    assert told.message == SubagentFailed(
        "p", 3, "sub-p-3", FailReason.BUSY, False, "session sub-p-3 is held already"
    )


def test_a_baseline_that_cannot_be_built_fails_the_turn_and_frees_the_session(tmp_path) -> None:
    shell = ContextShell(tmp_path)
    shell.known = True
    (ask,) = shell.state.start_turn(StartTurn("s", "hi", reply_to="w"))
    effects = shell.state.baseline_failed(ask, "memory.md is unreadable")
    detail = "could not build the baseline: memory.md is unreadable"
    assert replies(effects) == [("w", TurnFailed("s", FailReason.SPAWN_ERROR, detail))]
    (ended,) = [e.event for e in of(Emit, effects)]
    assert (ended.reason, ended.detail) == (FailReason.SPAWN_ERROR, detail)
    assert shell.state.status() == ContextStatus(held=(), live=())
    effects = shell.state.baseline_failed(ask, "late")  # nothing holds it: nothing to answer
    assert effects == []


def test_a_session_actor_that_cannot_start_fails_the_turn_crashed(tmp_path) -> None:
    shell = ContextShell(tmp_path)
    (opening,) = shell.run(shell.state.start_turn(StartTurn("s", "hi", reply_to="w")))
    record = SessionRecord("s", BASELINE, 0, (), 0, 1, False)
    (start,) = shell.state.loaded(SessionLoaded(record, False, opening.message.request_id))
    effects = shell.state.start_failed(start, "no threads left")
    detail = "could not start the session actor: no threads left"
    assert replies(effects) == [("w", TurnFailed("s", FailReason.CRASHED, detail))]
    assert shell.state.status() == ContextStatus(held=(), live=())
    assert shell.state.start_failed(start, "again") == []


def test_a_stored_session_of_another_profile_is_refused_and_freed(tmp_path) -> None:
    shell = typed_shell(tmp_path)
    (opening,) = shell.run(
        shell.state.start_turn(StartTurn("s", "hi", reply_to="w", agent="typed"))
    )
    record = SessionRecord("s", BASELINE, 0, (), 0, 1, False)  # stored with "default"
    effects = shell.run(
        shell.state.loaded(SessionLoaded(record, False, opening.message.request_id))
    )
    detail = "session s runs the agent profile default, not typed: a stored session keeps its agent"
    assert replies(effects) == [("w", TurnFailed("s", FailReason.WRONG_AGENT, detail))]
    assert not of(Emit, effects)  # nothing began
    # The session is free again: the right profile's turn is not answered busy.
    again = shell.run(shell.state.start_turn(StartTurn("s", "hi", reply_to="w2")))
    assert [type(e) for e in again] == [ToStore]


def test_a_stored_session_of_another_output_is_refused_naming_it(tmp_path) -> None:
    shell = ContextShell(tmp_path)
    output = ToolSpec("final_answer", "the answer", {"type": "object"})
    start = StartTurn("s", "hi", reply_to="w", output=output)
    (opening,) = shell.run(shell.state.start_turn(start))
    record = SessionRecord("s", BASELINE, 0, (), 0, 1, False)  # stored untyped
    effects = shell.run(
        shell.state.loaded(SessionLoaded(record, False, opening.message.request_id))
    )
    [(waiter, failed)] = replies(effects)
    assert waiter == "w" and failed.reason is FailReason.WRONG_OUTPUT
    assert "session s" in failed.detail
    assert shell.state.status() == ContextStatus(held=(), live=())


def test_an_actor_that_stopped_before_its_turn_began_fails_it_naming_that(tmp_path) -> None:
    shell = ContextShell(tmp_path)
    incarnation = shell.open_and_run("s", "w")
    effects = shell.state.stopped(SessionStopped("s", incarnation))
    detail = "the session actor stopped before its turn began"
    assert replies(effects) == [("w", TurnFailed("s", FailReason.CRASHED, detail))]


def test_a_turn_reopened_for_a_decision_opens_on_the_main_pools_slot(tmp_path) -> None:
    config = Config.from_toml(f'home = "{tmp_path}"\n[slots]\nmain = 3\n')
    shell = ContextShell(tmp_path)
    shell.state = ContextState(config, Agents(config, Registry()), lambda: NOW)
    (opening,) = shell.run(shell.state.start_turn(StartTurn("s", "hi", reply_to="w")))
    assert opening.message.slot == 3
    hold = shell.state.holds.get("s")
    assert hold is not None
    (again,) = shell.run(shell.state.reopen(hold))
    assert isinstance(again.message, OpenSession) and again.message.slot == 3


def test_a_crash_report_of_the_actor_a_reopened_turn_replaced_changes_nothing(tmp_path) -> None:
    shell = ContextShell(tmp_path)
    first = shell.open_and_run("s", "w1")
    shell.run(shell.state.turn_ended(SessionTurnEnded("s", TurnCompleted("s", "ok"), 1, False)))
    # The next turn finds the actor stopped from outside: it is rebuilt from the store.
    shell.dead.add(f"ref:s:{first}")
    effects = shell.run(shell.state.start_turn(StartTurn("s", "again", reply_to="w2")))
    (opening,) = of(ToStore, effects)
    assert isinstance(opening.message, OpenSession)
    # The old actor's own report of its end arrives now: the reopened turn goes on.
    assert shell.run(shell.state.crashed(SessionCrashed("s", "stopped", first))) == []
    assert shell.state.status().held == ("s",)


def test_an_actor_that_crashed_while_idle_is_no_candidate_to_passivate(tmp_path) -> None:
    shell = ContextShell(tmp_path)
    config = shell.state.config
    config = config.replace(sessions=msgspec.structs.replace(config.sessions, max_live=2))
    shell.state = ContextState(config, Agents(config, Registry()), lambda: NOW)
    incarnations = {}
    for session in ("a", "b"):
        incarnations[session] = shell.open_and_run(session, "w")
        ended = SessionTurnEnded(session, TurnCompleted(session, "ok"), 1, False)
        shell.run(shell.state.turn_ended(ended))
    shell.run(shell.state.crashed(SessionCrashed("a", "boom", incarnations["a"])))
    shell.open_and_run("c", "w")
    shell.run(shell.state.turn_ended(SessionTurnEnded("c", TurnCompleted("c", "ok"), 1, False)))
    (opening,) = shell.run(shell.state.start_turn(StartTurn("d", "hi", reply_to="w")))
    record = SessionRecord("d", BASELINE, 0, (), 0, 1, False)
    effects = shell.run(
        shell.state.loaded(SessionLoaded(record, False, opening.message.request_id))
    )
    assert [str(e.ref) for e in of(StopSession, effects)] == [f"ref:b:{incarnations['b']}"]


def test_a_passivated_session_is_logged_with_why(tmp_path, caplog) -> None:
    shell = ContextShell(tmp_path)
    config = shell.state.config
    config = config.replace(sessions=msgspec.structs.replace(config.sessions, idle_s=600))
    shell.state = ContextState(config, Agents(config, Registry()), lambda: NOW)
    shell.open_and_run("a", "w")
    shell.run(shell.state.turn_ended(SessionTurnEnded("a", TurnCompleted("a", "ok"), 1, False)))
    with caplog.at_level(logging.DEBUG, logger="actors.core.context_state"):
        stopped = shell.state.tick(Tick(now=NOW + timedelta(seconds=601)))
    assert len(of(StopSession, stopped)) == 1
    assert "context: passivating a (sessions.idle_s)" in caplog.messages


def test_a_held_session_is_never_passivated(tmp_path, caplog) -> None:
    shell = ContextShell(tmp_path)
    shell.open_and_run("a", "w")
    with caplog.at_level(logging.ERROR, logger="actors.core.context_state"):
        assert shell.state._passivate("a", "a test") == []
    assert shell.state.status() == ContextStatus(held=("a",), live=("a",))
    assert "context: a is not an idle live session; not passivated" in caplog.messages


def test_a_timed_out_child_whose_actor_is_gone_fails_its_call_once(tmp_path) -> None:
    shell = ContextShell(tmp_path, child_timeout_s=5.0)
    effects = shell.spawn("p", 3)
    (start,) = of(StartSession, effects)
    shell.dead.add(f"ref:sub-p-3:{start.incarnation}")
    effects = shell.run(shell.state.timed_out(ChildTimedOut("sub-p-3", 1)))
    failures = [e.message for e in of(ToSession, effects)]
    assert [(f.reason, f.detail) for f in failures] == [
        (FailReason.TIMEOUT, "the child outlived loop.child_timeout_s (5.0 s)")
    ]


def test_a_turn_cancelled_while_it_parks_fails_with_the_cancels_reason(tmp_path) -> None:
    shell = ContextShell(tmp_path)
    config = shell.state.config
    config = config.replace(sessions=msgspec.structs.replace(config.sessions, idle_s=600))
    shell.state = ContextState(config, Agents(config, Registry()), lambda: NOW)
    incarnation = shell.open_and_run("s", "w")
    request = ApprovalRequested(session="s", call_id=1, tool="deploy", arguments="{}", at=NOW)
    shell.run(shell.state.desk.requested(StoredApproval(request, NOW + timedelta(days=7))))
    asked = shell.state.tick(Tick(now=NOW + timedelta(seconds=601)))
    assert [e.message for e in of(TellSession, asked)] == [Park()]
    shell.run(shell.state.cancel("s", FailReason.TIMEOUT, "the family ran out of time")[1])
    effects = shell.run(shell.state.desk.parked(Parked("s", incarnation, True)))
    assert replies(effects) == [
        ("w", TurnFailed("s", FailReason.TIMEOUT, "the family ran out of time"))
    ]


def parked_waiting(shell: ContextShell, session: str, waiter: str) -> None:
    """``session``'s turn waits for a person and its actor has parked (passivated)."""
    config = shell.state.config
    config = config.replace(sessions=msgspec.structs.replace(config.sessions, idle_s=600))
    shell.state = ContextState(config, Agents(config, Registry()), lambda: NOW)
    incarnation = shell.open_and_run(session, waiter)
    request = ApprovalRequested(session=session, call_id=1, tool="deploy", arguments="{}", at=NOW)
    shell.run(shell.state.desk.requested(StoredApproval(request, NOW + timedelta(days=7))))
    shell.run(shell.state.tick(Tick(now=NOW + timedelta(seconds=601))))
    effects = shell.run(shell.state.desk.parked(Parked(session, incarnation, True)))
    assert of(StopSession, effects)


def test_a_stop_tells_the_waiter_of_a_parked_turn_it_is_cancelled(tmp_path) -> None:
    shell = ContextShell(tmp_path)
    parked_waiting(shell, "s", "w")
    effects = shell.run(shell.state.shut_down("the runtime stopped"))
    assert replies(effects) == [("w", TurnFailed("s", FailReason.CANCELLED, "the runtime stopped"))]
    assert not of(Emit, effects)  # the turn did not end: the next start resumes it


def test_a_stop_ends_a_child_whose_actor_is_gone(tmp_path) -> None:
    shell = ContextShell(tmp_path)
    (start,) = of(StartSession, shell.spawn("p", 3))
    shell.dead.add(f"ref:sub-p-3:{start.incarnation}")
    effects = shell.run(shell.state.shut_down("stopping"))
    (ended,) = [e.event for e in of(Emit, effects)]
    assert (ended.session, ended.completed, ended.reason, ended.detail) == (
        "sub-p-3",
        False,
        FailReason.CANCELLED,
        "stopping",
    )
    assert not of(ToSession, effects)  # its parent is stopping too: no SubagentFailed


def test_a_child_that_ends_after_a_stop_let_its_hold_go_is_no_longer_live(tmp_path) -> None:
    shell = ContextShell(tmp_path)
    shell.spawn("p", 3)
    shell.run(shell.state.shut_down("stopping"))
    assert shell.state.status() == ContextStatus(held=(), live=("sub-p-3",))
    ended = SessionTurnEnded("sub-p-3", TurnFailed("sub-p-3", FailReason.CANCELLED, "x"), 1, False)
    assert shell.run(shell.state.turn_ended(ended)) == []
    assert shell.state.status() == ContextStatus(held=(), live=())


def test_a_turn_naming_an_unknown_profile_is_refused(tmp_path) -> None:
    shell = ContextShell(tmp_path)
    effects = shell.state.start_turn(StartTurn("s", "hi", reply_to="w", agent="ghost"))
    detail = "no agent profile is named ghost (see [agents.NAME] in the config)"
    assert replies(effects) == [("w", TurnFailed("s", FailReason.WRONG_AGENT, detail))]


def test_a_turns_trace_context_reaches_the_session_actor(tmp_path) -> None:
    shell = ContextShell(tmp_path)
    trace = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    (opening,) = shell.run(shell.state.start_turn(StartTurn("s", "hi", reply_to="w", trace=trace)))
    record = SessionRecord("s", BASELINE, 0, (), 0, 1, False)
    effects = shell.run(
        shell.state.loaded(SessionLoaded(record, False, opening.message.request_id))
    )
    (tell,) = of(TellSession, effects)
    assert tell.message.trace == trace


def test_a_live_typed_session_runs_its_next_typed_turn(tmp_path) -> None:
    shell = ContextShell(tmp_path)
    output = ToolSpec("final_answer", "the answer", {"type": "object"})
    typed = Baseline("be brief", (output,))
    (opening,) = shell.run(
        shell.state.start_turn(StartTurn("s", "hi", reply_to="w", output=output))
    )
    record = SessionRecord("s", typed, 0, (), 0, 1, False)
    shell.run(shell.state.loaded(SessionLoaded(record, False, opening.message.request_id)))
    shell.run(shell.state.turn_ended(SessionTurnEnded("s", TurnCompleted("s", "{}"), 1, False)))
    again = shell.run(shell.state.start_turn(StartTurn("s", "more", reply_to="w", output=output)))
    assert [type(e) for e in again] == [TellSession] and not replies(again)


def test_sessions_over_max_live_are_passivated_and_logged_with_why(tmp_path, caplog) -> None:
    shell = ContextShell(tmp_path)
    config = shell.state.config
    config = config.replace(sessions=msgspec.structs.replace(config.sessions, max_live=1))
    shell.state = ContextState(config, Agents(config, Registry()), lambda: NOW)
    shell.open_and_run("a", "w")
    shell.run(shell.state.turn_ended(SessionTurnEnded("a", TurnCompleted("a", "ok"), 1, False)))
    (opening,) = shell.run(shell.state.start_turn(StartTurn("b", "hi", reply_to="w")))
    record = SessionRecord("b", BASELINE, 0, (), 0, 1, False)
    with caplog.at_level(logging.DEBUG, logger="actors.core.context_state"):
        shell.run(shell.state.loaded(SessionLoaded(record, False, opening.message.request_id)))
    assert "context: passivating a (sessions.max_live)" in caplog.messages


def test_a_store_that_locks_sessions_gets_a_stale_sessions_lock_back(tmp_path) -> None:
    config = Config.from_toml(f'home = "{tmp_path}"\n[store]\nurl = "postgresql://db/loopd"\n')
    shell = ContextShell(tmp_path)
    shell.state = ContextState(config, Agents(config, Registry()), lambda: NOW)
    shell.open_and_run("s", "w")
    failed = TurnFailed("s", FailReason.STORE_ERROR, "the store went away")
    effects = shell.run(shell.state.turn_ended(SessionTurnEnded("s", failed, 1, False)))
    assert [e.message for e in of(ToStore, effects)] == [ReleaseSession("s")]
    assert shell.state.status() == ContextStatus(held=(), live=())
