"""The approval desk's decisions at the core (actors/core/approval_desk.py), driven without
threads: a decision is told to nobody (the decider, the subscribers, the turn) before the store
has committed it, a decision the store refuses leaves the call waiting, and a stop while a
decision is being stored answers its decider."""

from __future__ import annotations

from datetime import timedelta

from test_context_state import NOW, Shell, of

from actors.core.approvals import ArmApprovalTimer, CancelApprovalTimer
from actors.core.context_effects import Emit, Reply, TellSession, ToStore
from messages import (
    ApprovalDecision,
    ApprovalRefused,
    ApprovalRequested,
    ApprovalSettled,
    ApprovalStored,
    ApproveCall,
    Cancel,
    DenyCall,
    DropApprovals,
    SettleApproval,
    StoredApproval,
)


def waiting(tmp_path) -> Shell:
    """A live turn of session ``s`` whose call 1 (``deploy``) waits for a person."""
    shell = Shell(tmp_path)
    shell.open_and_run("s", "w")
    request = ApprovalRequested(session="s", call_id=1, tool="deploy", arguments="{}")
    shell.run(shell.state.desk.requested(StoredApproval(request, NOW + timedelta(days=7))))
    return shell


def test_a_decision_is_told_to_nobody_before_the_store_has_it(tmp_path) -> None:
    shell = waiting(tmp_path)
    asked = shell.run(shell.state.desk.approve(ApproveCall("s", 1, note="ok", reply_to="ana")))
    (record,) = [e.message for e in of(ToStore, asked)]
    assert record == SettleApproval("s", 1, True, "ok", ran=True, reply_to="context")
    assert of(CancelApprovalTimer, asked)
    assert not of(Emit, asked) and not of(Reply, asked) and not of(TellSession, asked)
    # A second decision meanwhile finds the call taken: exactly one applies.
    again = shell.run(shell.state.desk.deny(DenyCall("s", 1, "no", reply_to="bo")))
    (refused,) = [e.message for e in of(Reply, again)]
    assert isinstance(refused, ApprovalRefused)

    done = shell.run(shell.state.desk.settled(ApprovalStored("s", 1)))
    (settled,) = [e.event for e in of(Emit, done)]
    assert isinstance(settled, ApprovalSettled) and settled.approved and settled.note == "ok"
    assert [(e.to, e.message) for e in of(Reply, done)] == [("ana", settled)]
    (told,) = [e.message for e in of(TellSession, done)]
    assert told == ApprovalDecision(1, True, "", note="ok")
    assert shell.run(shell.state.desk.settled(ApprovalStored("s", 1))) == []  # once


def test_a_decision_the_store_refuses_leaves_the_call_waiting(tmp_path) -> None:
    shell = waiting(tmp_path)
    shell.run(shell.state.desk.deny(DenyCall("s", 1, "not now", reply_to="ana")))
    failed = shell.run(shell.state.desk.settled(ApprovalStored("s", 1, "disk full")))
    (refused,) = [e.message for e in of(Reply, failed)]
    assert refused == ApprovalRefused(
        "s", 1, "the decision on call 1 of session s was not stored: disk full"
    )
    assert of(ArmApprovalTimer, failed)  # its deadline holds again
    assert not of(Emit, failed) and not of(TellSession, failed)
    assert [r.call_id for r in shell.state.desk.book.pending()] == [1]
    # Another decision goes through.
    shell.run(shell.state.desk.approve(ApproveCall("s", 1, reply_to="ana")))
    done = shell.run(shell.state.desk.settled(ApprovalStored("s", 1)))
    assert [type(e.event) for e in of(Emit, done)] == [ApprovalSettled]


def test_a_stop_while_a_decision_is_stored_answers_its_decider(tmp_path) -> None:
    shell = waiting(tmp_path)
    shell.run(shell.state.desk.approve(ApproveCall("s", 1, reply_to="ana")))
    stopped = shell.state.shut_down("the runtime stopped")
    refused = [e.message for e in of(Reply, stopped) if e.to == "ana"]
    assert len(refused) == 1 and isinstance(refused[0], ApprovalRefused)
    assert "while the decision on call 1 of session s was being stored" in refused[0].detail
    # Its call counts as waiting: the turn parks, and the next start reads what the store has.
    (cancel,) = [e.message for e in of(TellSession, stopped) if isinstance(e.message, Cancel)]
    assert cancel.park


def test_a_cancel_before_a_restored_calls_decision_is_stored_drops_it(tmp_path) -> None:
    shell = Shell(tmp_path)
    request = ApprovalRequested(session="s", call_id=1, tool="deploy", arguments="{}")
    shell.run(shell.state.desk.restore([StoredApproval(request, NOW + timedelta(days=7))]))
    asked = shell.run(shell.state.desk.approve(ApproveCall("s", 1, reply_to="ana")))
    assert of(ToStore, asked) and not of(Reply, asked)
    cancelled = shell.run(shell.state.desk.cancelled("s"))
    (drop,) = [e.message for e in of(ToStore, cancelled)]
    assert drop == DropApprovals("s", (1,))  # its row goes: nothing runs for a cancelled turn
    (refused,) = [e.message for e in of(Reply, cancelled)]
    assert refused == ApprovalRefused("s", 1, "call 1 of session s is not waiting for a decision")
    # The store's late answer changes nothing: no event, no resume.
    assert shell.run(shell.state.desk.settled(ApprovalStored("s", 1))) == []
