"""The start ends the turns a crash cut off (SPEC 18: every turn is accounted for): their open
calls get results, their running mark is cleared, and ``TurnEnded(crashed)`` goes to the
subscribers given to ``Runtime.start`` before it returns. A turn that waits for a person
resumes instead. A real runtime on a real SQLite home."""

from __future__ import annotations

from typing import Any

import pytest
from approval_kit import Events, deploy, deploy_script, ended, requested, rt_history

from actors.runtime.interrupted import CRASHED_DETAIL
from actors.stores.sqlite import DB_NAME, SessionStore
from actors.testing import reply
from messages import (
    ApprovalSettled,
    Baseline,
    ChatMessage,
    FailReason,
    ToolCall,
    TurnCompleted,
    TurnEnded,
)

pytestmark = pytest.mark.timeout(60)
WAIT = 10.0
BASELINE = Baseline("You are a test.")


def user(text: str) -> ChatMessage:
    return ChatMessage(role="user", content=text)


def asks(*calls: tuple[int, str, str]) -> ChatMessage:
    return ChatMessage(role="assistant", tool_calls=tuple(ToolCall(*c) for c in calls))


def cut_off_family(home: Any) -> None:
    """What a SIGKILL leaves: ``p`` waits for its child ``sub-p-1`` and a clock call; the child
    waits for a port call. Both are stored running; ``q`` ended its turn."""
    with SessionStore(home / DB_NAME) as store:
        store.create("p", BASELINE, 0)
        parent_calls = asks((1, "subagent", '{"task": "look"}'), (2, "clock", "{}"))
        store.append(
            "p", [user("go"), parent_calls], turns=1, next_call_id=3, untrusted=False, running=True
        )
        store.create_child("sub-p-1", "p", BASELINE, 1, untrusted=False, first=user("look"))
        store.append(
            "sub-p-1",
            [asks((1, "lookup", "{}"))],
            turns=1,
            next_call_id=2,
            untrusted=False,
        )
        store.create("q", BASELINE, 0)
        done = ChatMessage(role="assistant", content="done")
        store.append("q", [user("hi"), done], turns=1, next_call_id=1, untrusted=False)
        assert {r.id for r in store.interrupted()} == {"p", "sub-p-1"}


def test_the_start_ends_each_cut_off_turn_and_tells_it_before_it_returns(
    loopd_runtime, loopd_config
) -> None:
    loopd_config.home_path.mkdir(parents=True, exist_ok=True)
    cut_off_family(loopd_config.home_path)
    seen: list[Any] = []
    rt = loopd_runtime([reply("fresh")], subscribe=[seen.append])
    crashed = [e for e in seen if isinstance(e, TurnEnded)]  # told before start returned
    assert sorted(e.session for e in crashed) == ["p", "sub-p-1"]
    assert all(
        (e.completed, e.reason, e.detail) == (False, FailReason.CRASHED, CRASHED_DETAIL)
        for e in crashed
    )
    parent = {m.tool_call_id: m.content for m in rt_history(rt, "p") if m.role == "tool"}
    assert parent == {
        1: "sub-p-1 failed",
        2: "Denied: the turn ended before this call returned a result.",
    }
    child = [m for m in rt_history(rt, "sub-p-1") if m.role == "tool"]
    assert [(m.tool_call_id, m.content) for m in child] == [
        (1, "Denied: the turn ended before this call returned a result.")
    ]
    # The session runs on from the repaired transcript, and nothing is left marked.
    assert rt.run_turn("p", "again", timeout=WAIT) == TurnCompleted("p", "fresh")
    rt.stop()
    with SessionStore(loopd_config.home_path / DB_NAME) as store:
        assert store.interrupted() == []
    again: list[Any] = []
    loopd_runtime([reply("x")], subscribe=[again.append])
    assert not [e for e in again if isinstance(e, TurnEnded)]  # ended once, never twice


def test_a_subscriber_that_raises_at_the_start_does_not_stop_it(
    loopd_runtime, loopd_config
) -> None:
    loopd_config.home_path.mkdir(parents=True, exist_ok=True)
    cut_off_family(loopd_config.home_path)
    seen: list[Any] = []

    def broken(event: Any) -> None:
        raise RuntimeError("a broken subscriber")

    rt = loopd_runtime([reply("fresh")], subscribe=[broken, seen.append])
    assert sorted(e.session for e in seen if isinstance(e, TurnEnded)) == ["p", "sub-p-1"]
    assert rt.run_turn("q", "more", timeout=WAIT) == TurnCompleted("q", "fresh")


def test_a_turn_that_waits_for_a_person_resumes_instead_of_ending(loopd_runtime) -> None:
    rt = loopd_runtime(deploy_script, tools=[deploy])
    events = Events(rt)
    rt.send_turn("s", "ship it")
    events.wait(requested())
    rt.stop()  # the turn parks: stored running, its call waiting
    seen: list[Any] = []
    again = loopd_runtime(deploy_script, tools=[deploy], config=rt.config, subscribe=[seen.append])
    assert not [e for e in seen if isinstance(e, TurnEnded)]
    later = Events(again)
    assert isinstance(again.approve("s", 1), ApprovalSettled)
    assert later.wait(ended()).completed
    assert [m.role for m in rt_history(again, "s")][-1] == "assistant"
    again.stop()
    with SessionStore(rt.config.home_path / DB_NAME) as store:
        assert store.interrupted() == []


def test_a_turn_that_ends_cleanly_leaves_no_mark(loopd_runtime, loopd_config) -> None:
    rt = loopd_runtime([reply("one")])
    assert rt.run_turn("a", "hi", timeout=WAIT) == TurnCompleted("a", "one")
    with SessionStore(loopd_config.home_path / DB_NAME) as store:
        assert store.interrupted() == []


def test_only_a_call_still_to_be_carried_out_makes_its_family_resume() -> None:
    from datetime import UTC, datetime, timedelta

    from actors.runtime.interrupted import resuming
    from messages import ApprovalRequested, SessionRecord, StoredApproval

    at = datetime(2026, 12, 5, tzinfo=UTC)

    def waiting(session: str, **kw: Any) -> StoredApproval:
        request = ApprovalRequested(
            session=session, call_id=1, tool="deploy", arguments="{}", at=at
        )
        return StoredApproval(request, at + timedelta(days=1), **kw)

    def record(id: str, parent: str | None = None) -> SessionRecord:
        return SessionRecord(id, BASELINE, 0, (), 1, 2, False, parent)

    records = [record("a"), record("sub-a-1", "a"), record("b"), record("sub-b-1", "b")]
    # A child's call that waits holds its parent's turn too; one that began to run (it is
    # answered as interrupted) and a background child's (dropped) resume nothing.
    found = resuming(
        records,
        [
            waiting("sub-a-1"),
            waiting("b", approved=True, ran=True),
            waiting("sub-b-1", background=True),
        ],
    )
    assert found == {"a", "sub-a-1"}
