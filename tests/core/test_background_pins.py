"""Background children's store paths (actors/core/background.py), pinned at the core: a child
whose row the store refuses never starts and its parent's call fails naming the store's words;
a report the store refuses is not delivered; the started event names the child's agent."""

from __future__ import annotations

import msgspec
from test_background_state import BASELINE, NOW, Shell, of

from actors.core.agents import Agents
from actors.core.context_effects import Emit, StartSession, TellSession, ToSession, ToStore
from actors.core.context_state import ContextState
from actors.core.dispatch import Registry
from messages import (
    BackgroundLoaded,
    BackgroundRow,
    BackgroundSaved,
    DropBackground,
    FailReason,
    LoadBackground,
    RunTurn,
    SaveBackground,
    SessionLoaded,
    SessionRecord,
    SubagentFailed,
    SubagentFinished,
    SubagentRequest,
    SubagentStarted,
    ToolDone,
    ToolResult,
    TurnCompleted,
)


def spawn(shell: Shell, parent: str = "p", call_id: int = 1) -> SaveBackground:
    asked = shell.run(shell.state.spawn(SubagentRequest(parent, call_id, "t", background=True)))
    (save,) = of(ToStore, asked)
    assert isinstance(save.message, SaveBackground)
    return save.message


def test_a_child_whose_row_is_not_stored_never_starts_and_its_call_fails(tmp_path) -> None:
    shell = Shell(tmp_path)
    shell.user_turn("p", "w")
    save = spawn(shell)
    effects = shell.run(
        shell.state.background_saved(BackgroundSaved(save.session, save.request_id, "disk full"))
    )
    assert not of(StartSession, effects)
    assert not [e for e in of(Emit, effects) if isinstance(e.event, SubagentStarted)]
    # Its SubagentFinished is the parent's to tell, once it has stored the failure.
    assert not [e for e in of(Emit, effects) if isinstance(e.event, SubagentFinished)]
    (told,) = [e.message for e in of(ToSession, effects) if e.session == "p"]
    assert told == SubagentFailed(
        parent="p",
        call_id=1,
        child="sub-p-1",
        reason=FailReason.STORE_ERROR,
        untrusted=False,
        detail="could not store the background child: disk full",
    )
    # Nothing counts against the family: the next background call starts.
    assert shell.state.background.running_in("p") == 0
    assert not shell.state.background.is_running("sub-p-1")


def test_a_stale_store_answer_about_a_row_changes_nothing(tmp_path) -> None:
    shell = Shell(tmp_path)
    shell.user_turn("p", "w")
    save = spawn(shell)
    assert shell.state.background_saved(BackgroundSaved(save.session, 9999)) == []
    assert shell.state.background.is_running("sub-p-1")


def test_the_started_event_names_the_default_agent(tmp_path) -> None:
    shell = Shell(tmp_path)
    shell.user_turn("p", "w")
    effects = shell.background_child("p", 1)
    (started,) = [e.event for e in of(Emit, effects) if isinstance(e.event, SubagentStarted)]
    assert started.agent == "default"
    assert (started.session, started.call_id, started.child) == ("p", 1, "sub-p-1")


def test_a_report_the_store_refused_is_not_delivered(tmp_path) -> None:
    shell = Shell(tmp_path)
    shell.user_turn("p", "w")
    shell.background_child("p", 1)
    shell.ended("p", TurnCompleted("p", "done"))
    effects = shell.state.report("p", "sub-p-1", 1, "sub-p-1 completed\n42", False)
    (save,) = of(ToStore, effects)
    refused = shell.state.background_saved(
        BackgroundSaved(save.message.session, save.message.request_id, "disk full")
    )
    assert refused == []
    assert shell.state.background.queued("p") == []


def test_a_stored_background_child_answers_its_call_started(tmp_path) -> None:
    shell = Shell(tmp_path)
    shell.user_turn("p", "w")
    effects = shell.stored(
        shell.run(shell.state.spawn(SubagentRequest("p", 4, "t", background=True)))
    )
    (answer,) = [e.message for e in of(ToSession, effects)]
    assert answer == ToolDone("p", ToolResult(4, "sub-p-4 started in the background"))


def test_a_child_cancelled_while_its_row_is_stored_leaves_no_row(tmp_path) -> None:
    shell = Shell(tmp_path)
    shell.user_turn("p", "w")
    save = spawn(shell)
    shell.run(shell.state.cancel("p", FailReason.CANCELLED, "stop")[1])
    # Stored meanwhile: the row is dropped again.
    stored = shell.run(shell.state.background_saved(BackgroundSaved(save.session, save.request_id)))
    assert [type(e.message) for e in of(ToStore, stored)] == [DropBackground]
    # Refused meanwhile: there is no row to drop.
    shell = Shell(tmp_path)
    shell.user_turn("p", "w")
    save = spawn(shell)
    shell.run(shell.state.cancel("p", FailReason.CANCELLED, "stop")[1])
    refused = BackgroundSaved(save.session, save.request_id, "disk full")
    assert shell.run(shell.state.background_saved(refused)) == []


def test_the_children_limit_denies_naming_it(tmp_path) -> None:
    shell = Shell(tmp_path)
    config = shell.state.config
    config = config.replace(loop=msgspec.structs.replace(config.loop, max_children_total=1))
    shell.state = ContextState(config, Agents(config, Registry()), lambda: NOW)
    shell.user_turn("p", "w")
    shell.run(shell.state.spawn(SubagentRequest("p", 1, "t")))
    effects = shell.run(shell.state.spawn(SubagentRequest("p", 2, "t")))
    (told,) = [e.message for e in of(ToSession, effects)]
    assert told == ToolDone(
        "p",
        ToolResult(
            2,
            "Denied: a limit of this runtime was reached: the runtime already runs 1 children "
            "(loop.max_children_total).",
            denied=True,
        ),
    )


def test_the_start_reads_the_rows_the_last_run_left_answered_to_the_context(tmp_path) -> None:
    config = Shell(tmp_path).state.config
    state = ContextState(config, Agents(config, Registry()), lambda: NOW, address="context-2")
    loads = [e.message for e in of(ToStore, state.begin())]
    assert loads == [LoadBackground("context-2", 1)]


def test_a_stored_row_of_a_child_this_run_holds_is_left_alone(tmp_path) -> None:
    shell = Shell(tmp_path)
    shell.user_turn("p", "w")
    shell.run(shell.state.spawn(SubagentRequest("p", 3, "t")))  # held, in the foreground
    loaded = BackgroundLoaded((BackgroundRow("sub-p-3", "p", 3),))
    assert shell.run(shell.state.background_loaded(loaded)) == []


def test_reports_are_delivered_oldest_first(tmp_path) -> None:
    shell = Shell(tmp_path)
    rows = (
        BackgroundRow("sub-p-1", "p", 1, "sub-p-1 completed\none"),
        BackgroundRow("sub-p-2", "p", 2, "sub-p-2 completed\ntwo"),
        BackgroundRow("sub-p-3", "p", 3, "sub-p-3 failed"),
    )
    effects = shell.run(shell.state.background_loaded(BackgroundLoaded(rows)))
    (opening,) = of(ToStore, effects)  # a new turn of the parent, opened from the store
    record = SessionRecord("p", BASELINE, 0, (), 0, 1, False)
    loaded = SessionLoaded(record, False, opening.message.request_id)
    (run,) = [e.message for e in of(TellSession, shell.run(shell.state.loaded(loaded)))]
    assert isinstance(run, RunTurn) and run.text == "sub-p-1 completed\none"
    assert [r.child for r in run.reports] == ["sub-p-1", "sub-p-2", "sub-p-3"]
