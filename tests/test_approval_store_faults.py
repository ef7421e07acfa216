"""A decision told while the store fails (SPEC 18: nothing told is lost).

A person's decision is stored and told (``ApprovalSettled``) before the turn stores the call's
result. When that second write fails (a disk full, a database restarting), the turn fails
``store_error``, and the decision must still answer the call: when the session runs again in
the same process, and at the next start. Real actors and a real SQLite file; the write fails
for real, through a trigger that refuses new messages while it exists.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from approval_kit import Events, deploy, deploy_script, ended, ran, requested, rt_history, status

from actors.stores.sqlite import DB_NAME
from actors.testing import reply
from messages import ApprovalRefused, ApprovalSettled, FailReason, ModelRequest, TurnCompleted

DECLINED = "Denied: a person declined this call: not on a Friday."
INTERRUPTED = "Denied: the turn ended before this call returned a result."


@contextmanager
def messages_refused(home: str, from_seq: int = 1) -> Iterator[None]:
    """While inside, the store's file refuses every new message from the ``from_seq``-th of a
    session on (its other tables still write)."""
    db = sqlite3.connect(Path(home) / DB_NAME, isolation_level=None)
    try:
        db.execute(
            f"CREATE TRIGGER refuse BEFORE INSERT ON messages WHEN NEW.seq >= {int(from_seq)} "
            "BEGIN SELECT RAISE(ABORT, 'the disk is full'); END"
        )
        yield
    finally:
        db.execute("DROP TRIGGER IF EXISTS refuse")
        db.close()


def start(loopd_runtime, config: Any = None) -> tuple[Any, Events]:
    """A runtime on a new home (``ran`` emptied), or again on ``config``'s."""
    if config is None:
        ran.clear()
    rt = loopd_runtime(script, tools=[deploy, status], config=config)
    return rt, Events(rt)


def decide_while_messages_fail(rt, events: Events, approved: bool) -> None:
    """Call 1 (deploy) waits; call 2's result is stored; the decision is stored and told, and
    the turn fails storing call 1's result."""
    rt.send_turn("s", "ship it")
    events.wait(requested())
    events.wait(lambda e: getattr(e, "name", None) == "status" and hasattr(e, "denied"))
    with messages_refused(rt.config.home):
        settled = rt.approve("s", 1) if approved else rt.deny("s", 1, "not on a Friday")
        assert isinstance(settled, ApprovalSettled) and settled.approved is approved
        failed = events.wait(ended())
    assert not failed.completed and failed.reason is FailReason.STORE_ERROR, failed


def script(request: ModelRequest) -> Any:
    """``deploy_script``, but a later turn only answers."""
    users = [m for m in request.messages if m.role == "user"]
    if users[-1].content != "ship it":
        return reply("nothing more")
    return deploy_script(request)


def answers(rt, session: str = "s") -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for message in rt_history(rt, session):
        if message.role == "tool":
            out.setdefault(message.tool_call_id, []).append(message.content)
    return out


def test_a_decline_told_while_the_store_failed_answers_the_call_when_the_session_runs_again(
    loopd_runtime,
) -> None:
    rt, events = start(loopd_runtime)
    decide_while_messages_fail(rt, events, approved=False)
    assert isinstance(rt.run_turn("s", "and now?", timeout=10), TurnCompleted)
    assert answers(rt) == {1: [DECLINED], 2: ["prod is green"]}
    assert ran == [] and rt.pending_approvals() == ()
    rt.stop()  # the next start finds nothing of it left to carry out
    later, _ = start(loopd_runtime, rt.config)
    assert later.pending_approvals() == ()
    assert answers(later) == {1: [DECLINED], 2: ["prod is green"]}


def test_a_decline_told_while_the_store_failed_answers_the_call_at_the_next_start(
    loopd_runtime,
) -> None:
    rt, events = start(loopd_runtime)
    decide_while_messages_fail(rt, events, approved=False)
    rt.stop()
    later, resumed = start(loopd_runtime, rt.config)
    end = resumed.wait(ended())
    assert end.completed, end
    assert answers(later) == {1: [DECLINED], 2: ["prod is green"]}
    assert ran == [] and later.pending_approvals() == ()


def test_an_approved_call_whose_result_could_not_be_stored_never_runs_again(
    loopd_runtime,
) -> None:
    rt, events = start(loopd_runtime)
    decide_while_messages_fail(rt, events, approved=True)
    assert ran == ["prod"]
    # Its result was never told: the call is answered as cut off, and runs no more.
    assert isinstance(rt.run_turn("s", "and now?", timeout=10), TurnCompleted)
    assert answers(rt) == {1: [INTERRUPTED], 2: ["prod is green"]}
    rt.stop()
    later, _ = start(loopd_runtime, rt.config)
    assert later.pending_approvals() == ()
    assert isinstance(later.run_turn("s", "still there?", timeout=10), TurnCompleted)
    assert ran == ["prod"]
    assert answers(later) == {1: [INTERRUPTED], 2: ["prod is green"]}


def test_a_waiting_call_is_dropped_when_a_siblings_result_could_not_be_stored(
    loopd_runtime,
) -> None:
    rt, events = start(loopd_runtime)
    with messages_refused(rt.config.home, from_seq=3):  # the user message, then the answer
        rt.send_turn("s", "ship it")
        events.wait(requested())
        failed = events.wait(ended())
    assert not failed.completed and failed.reason is FailReason.STORE_ERROR, failed
    # The turn is over: its call waits for nobody, and nothing of it may run later.
    assert rt.pending_approvals() == ()
    assert isinstance(rt.approve("s", 1), ApprovalRefused)
    assert isinstance(rt.run_turn("s", "and now?", timeout=10), TurnCompleted)
    assert answers(rt) == {1: [INTERRUPTED], 2: [INTERRUPTED]}
    rt.stop()
    later, _ = start(loopd_runtime, rt.config)
    assert later.pending_approvals() == ()
    assert ran == []
