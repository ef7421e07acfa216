"""Background children's store paths (actors/core/background.py), pinned at the core: a child
whose row the store refuses never starts and its parent's call fails naming the store's words;
a report the store refuses is not delivered; the started event names the child's agent."""

from __future__ import annotations

from test_background_state import Shell, of

from actors.core.context_effects import Emit, StartSession, ToSession, ToStore
from messages import (
    BackgroundSaved,
    FailReason,
    SaveBackground,
    SubagentFailed,
    SubagentFinished,
    SubagentRequest,
    SubagentStarted,
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
