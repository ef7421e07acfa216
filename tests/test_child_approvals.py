"""A child's call that waits for a person across a restart (SPEC 11): the whole family parks at
a stop (or is read back after a SIGKILL), the decision resumes the child, and the child's
outcome answers its parent's ``subagent`` call, whose turn then completes. Real actors, a real
SQLite store; every wait has a deadline."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from approval_kit import (
    WAIT,
    Events,
    answered_once,
    deploy,
    ended,
    family_script,
    ran,
    requested,
    rt_history,
    stored_approvals,
    tool_texts,
)

from actors import port_tool
from actors.testing import calls, reply, with_usage
from messages import (
    ApprovalRefused,
    ApprovalSettled,
    ModelRequest,
    SubagentFinished,
    TurnCompleted,
)


def _stopped_while_the_child_waits(
    loopd_runtime: Any, script: Any = family_script, later: Any = None, **kw: Any
) -> tuple[Any, Any, Events]:
    """A runtime whose child ``sub-s-1`` waited for a person, stopped, and a new one on the
    same home (with the clock ``later``, if given) and its events."""
    rt = loopd_runtime(script, tools=[deploy], **kw)
    events = Events(rt)
    rt.send_turn("s", "ship it")
    request = events.wait(requested("sub-s-1"))
    rt.stop()
    again = loopd_runtime(script, tools=[deploy], config=rt.config, clock=later)
    return request, again, Events(again)


def test_a_childs_wait_survives_a_stop_and_its_outcome_completes_the_parent(
    loopd_runtime,
) -> None:
    ran.clear()
    request, rt, events = _stopped_while_the_child_waits(loopd_runtime)
    assert rt.pending_approvals() == (request,)  # naming the child
    # The family is held: a new turn of the parent is busy meanwhile.
    busy = rt.run_turn("s", "anything?", timeout=WAIT)
    assert getattr(busy, "reason", None) == "busy"
    assert isinstance(rt.approve("sub-s-1", 1), ApprovalSettled)
    finished = events.wait(lambda e: isinstance(e, SubagentFinished))
    assert (finished.child, finished.completed) == ("sub-s-1", True)
    end = events.wait(ended())
    assert end.completed, end
    assert ran == ["prod"]
    parent = rt_history(rt, "s")
    assert answered_once(parent) == [1]
    assert [m.content for m in parent if m.role == "tool"] == [
        "sub-s-1 completed\ndeployed to prod"
    ]
    assert parent[-1].content == "sub-s-1 completed\ndeployed to prod"
    assert answered_once(rt_history(rt, "sub-s-1")) == [1]
    assert rt.pending_approvals() == () and stored_approvals(rt) == []
    # The session is free again, and its call ids continue: its next child is sub-s-2.
    since = events.mark()
    rt.send_turn("s", "again")
    assert events.wait(requested("sub-s-2"), since=since).call_id == 1


DRIVER = Path(__file__).with_name("approval_driver.py")


def test_a_childs_wait_survives_a_sigkill(loopd_runtime, loopd_config) -> None:
    ran.clear()
    proc = subprocess.Popen(
        [sys.executable, str(DRIVER), loopd_config.home, "60", "family"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )
    try:
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()))
        reader.start()
        reader.join(30)
        assert line and line[0], "the driver printed nothing"
        printed = json.loads(line[0])
    finally:
        proc.kill()  # SIGKILL: nothing but what the store committed
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    rt = loopd_runtime(family_script, tools=[deploy])
    events = Events(rt)
    (request,) = rt.pending_approvals()
    assert (request.session, request.call_id, request.at.isoformat()) == (
        "sub-s-1",
        1,
        printed["at"],
    )
    assert isinstance(rt.approve("sub-s-1", 1), ApprovalSettled)
    end = events.wait(ended())
    assert end.completed, end
    assert ran == ["prod"]
    parent = rt_history(rt, "s")
    assert answered_once(parent) == [1]
    assert parent[-1].content == "sub-s-1 completed\ndeployed to prod"


def test_a_childs_call_denied_after_a_restart_answers_declined_and_the_parent_goes_on(
    loopd_runtime,
) -> None:
    ran.clear()
    _request, rt, events = _stopped_while_the_child_waits(loopd_runtime)
    assert isinstance(rt.deny("sub-s-1", 1, "not today"), ApprovalSettled)
    assert events.wait(ended()).completed
    declined = "Denied: a person declined this call: not today."
    child = rt_history(rt, "sub-s-1")
    assert [m.content for m in child if m.role == "tool"] == [declined]
    parent = rt_history(rt, "s")
    assert answered_once(parent) == [1]
    assert [m.content for m in parent if m.role == "tool"] == [f"sub-s-1 completed\n{declined}"]
    assert ran == []


def test_a_childs_call_times_out_after_a_restart(loopd_runtime) -> None:
    # The next start comes two minutes later: the stored deadline has passed.
    def later() -> datetime:
        return datetime.now(UTC) + timedelta(minutes=2)

    _request, rt, _events = _stopped_while_the_child_waits(
        loopd_runtime, later=later, approvals={"timeout_s": 60}
    )
    # The timer fires at the start (its events may come before a subscriber could see them):
    # wait until nothing of the family is held.
    rt.wait_family("s", timeout=WAIT)
    assert rt.pending_approvals() == ()
    parent = [m.content for m in rt_history(rt, "s") if m.role == "tool"]
    reason = "Denied: a person declined this call: no decision within 60 s."
    assert parent == [f"sub-s-1 completed\n{reason}"]


def test_cancelling_the_parent_after_a_restart_drops_the_childs_request(loopd_runtime) -> None:
    ran.clear()
    _request, rt, events = _stopped_while_the_child_waits(loopd_runtime)
    assert set(rt.cancel("s")) == {"s", "sub-s-1"}
    assert events.wait(ended("sub-s-1")).reason == "cancelled"
    assert events.wait(ended()).reason == "cancelled"
    assert rt.pending_approvals() == ()
    assert isinstance(rt.approve("sub-s-1", 1), ApprovalRefused)
    # The family is free; the parent's next turn answers the cut-off call first.
    since = events.mark()
    rt.send_turn("s", "try again")
    assert events.wait(requested("sub-s-2"), since=since).call_id == 1
    assert [a.request.session for a in stored_approvals(rt)] == ["sub-s-2"]
    parent = rt_history(rt, "s")
    assert next(m.content for m in parent if m.role == "tool") == "sub-s-1 failed"
    assert ran == []


def test_cancelling_the_child_after_a_restart_answers_the_parent_failed(loopd_runtime) -> None:
    _request, rt, events = _stopped_while_the_child_waits(loopd_runtime)
    assert rt.cancel("sub-s-1") == ("sub-s-1",)
    end = events.wait(ended())
    assert end.completed, end
    parent = rt_history(rt, "s")
    assert answered_once(parent) == [1]
    assert [m.content for m in parent if m.role == "tool"] == ["sub-s-1 failed"]
    assert rt.pending_approvals() == ()


def chain_script(request: ModelRequest) -> Any:
    """``s`` delegates to ``sub-s-1``, which delegates to ``sub-sub-s-1-1``, which deploys."""
    if request.messages[-1].role != "user":
        return reply(tool_texts(request))
    if request.session in ("s", "sub-s-1"):
        return calls(("subagent", {"task": "deploy prod"}))
    return calls(("deploy", {"env": "prod"}))


def test_a_grandchilds_wait_survives_a_stop(loopd_runtime) -> None:
    ran.clear()
    rt = loopd_runtime(chain_script, tools=[deploy])
    events = Events(rt)
    rt.send_turn("s", "ship it")
    events.wait(requested("sub-sub-s-1-1"))
    rt.stop()
    again = loopd_runtime(chain_script, tools=[deploy], config=rt.config)
    later = Events(again)
    assert [r.session for r in again.pending_approvals()] == ["sub-sub-s-1-1"]
    assert isinstance(again.approve("sub-sub-s-1-1", 1), ApprovalSettled)
    assert later.wait(ended()).completed
    assert ran == ["prod"]
    middle = [m.content for m in rt_history(again, "sub-s-1") if m.role == "tool"]
    assert middle == ["sub-sub-s-1-1 completed\ndeployed to prod"]
    parent = rt_history(again, "s")
    assert answered_once(parent) == [1]
    assert parent[-2].content == "sub-s-1 completed\nsub-sub-s-1-1 completed\ndeployed to prod"


def costly_script(request: ModelRequest) -> Any:
    """``family_script``, each answer costing 40 tokens."""
    return with_usage(family_script(request), 30, 10)


def test_the_familys_budget_counter_survives_the_wait(loopd_runtime) -> None:
    # The parent's and the child's first answers spend 80 of 100 tokens before the stop; the
    # child's last answer after the start brings it to 120, so the parent's next request is
    # refused. Counted from zero after the start, the parent would have gone on.
    _request, rt, events = _stopped_while_the_child_waits(
        loopd_runtime, costly_script, loop={"token_budget": 100}
    )
    assert isinstance(rt.approve("sub-s-1", 1), ApprovalSettled)
    end = events.wait(ended())
    assert (end.completed, end.reason) == (False, "budget")
    assert "spent 120 tokens" in end.detail


def mixed_script(request: ModelRequest) -> Any:
    """``s`` delegates and deploys to eu in one answer; its child deploys to prod."""
    if request.session == "barrier" or request.messages[-1].role != "user":
        return reply(tool_texts(request))
    if request.session == "s":
        return calls(("subagent", {"task": "deploy prod"}), ("deploy", {"env": "eu"}))
    return calls(("deploy", {"env": "prod"}))


BOTH = ["sub-s-1 completed\ndeployed to prod", "deployed to eu"]


def test_a_parent_and_its_child_both_waiting_across_a_stop(loopd_runtime) -> None:
    ran.clear()
    rt = loopd_runtime(mixed_script, tools=[deploy])
    events = Events(rt)
    rt.send_turn("s", "ship both")
    events.wait(requested("sub-s-1"))
    events.wait(requested("s"))
    rt.stop()
    again = loopd_runtime(mixed_script, tools=[deploy], config=rt.config)
    later = Events(again)
    assert {(r.session, r.call_id) for r in again.pending_approvals()} == {("s", 2), ("sub-s-1", 1)}
    # The child first: its outcome resumes the parent, whose own call waits on.
    assert isinstance(again.approve("sub-s-1", 1), ApprovalSettled)
    later.wait(lambda e: isinstance(e, SubagentFinished))
    assert [(r.session, r.call_id) for r in again.pending_approvals()] == [("s", 2)]
    assert isinstance(again.approve("s", 2), ApprovalSettled)
    assert later.wait(ended()).completed
    assert sorted(ran) == ["eu", "prod"]
    parent = rt_history(again, "s")
    assert answered_once(parent) == [1, 2]
    assert [m.content for m in parent if m.role == "tool"] == BOTH


def test_a_child_still_waiting_when_its_resumed_parent_stops_again(loopd_runtime) -> None:
    ran.clear()
    rt = loopd_runtime(mixed_script, tools=[deploy])
    events = Events(rt)
    rt.send_turn("s", "ship both")
    events.wait(requested("sub-s-1"))
    events.wait(requested("s"))
    rt.stop()
    second = loopd_runtime(mixed_script, tools=[deploy], config=rt.config)
    seen = Events(second)
    # The parent's own call first: its turn runs again, its subagent call still open.
    assert isinstance(second.approve("s", 2), ApprovalSettled)
    seen.wait(lambda e: getattr(e, "call_id", None) == 2 and hasattr(e, "denied"))
    second.stop()
    third = loopd_runtime(mixed_script, tools=[deploy], config=rt.config)
    last = Events(third)
    assert [(r.session, r.call_id) for r in third.pending_approvals()] == [("sub-s-1", 1)]
    assert isinstance(third.approve("sub-s-1", 1), ApprovalSettled)
    assert last.wait(ended()).completed
    assert sorted(ran) == ["eu", "prod"]
    parent = rt_history(third, "s")
    assert answered_once(parent) == [1, 2]
    assert sorted(m.content for m in parent if m.role == "tool") == sorted(BOTH)


def background_script(request: ModelRequest) -> Any:
    """``s`` starts a background child, which deploys; ``s`` notes whatever it hears."""
    last = request.messages[-1]
    if request.session == "s" and last.role == "user" and last.name is None:
        return calls(("subagent", {"task": "deploy prod", "background": True}))
    if request.session == "sub-s-1" and last.role == "user":
        return calls(("deploy", {"env": "prod"}))
    return reply("noted")


def test_a_background_childs_wait_is_dropped_at_a_restart(loopd_runtime) -> None:
    # No parent's call waits for a background child: its report says it failed, as for any
    # background child a stop cut off, and nobody is asked again.
    rt = loopd_runtime(background_script, tools=[deploy], subagents={"background": True})
    events = Events(rt)
    rt.send_turn("s", "ship it")
    events.wait(requested("sub-s-1"))
    events.wait(ended())
    rt.stop()
    again = loopd_runtime(background_script, tools=[deploy], config=rt.config)
    assert again.pending_approvals() == ()
    # The report becomes a turn of s at the start: wait until it is delivered.
    again.wait_family("s", timeout=WAIT)
    assert isinstance(again.run_turn("barrier", "hi", timeout=WAIT), TurnCompleted)
    assert stored_approvals(again) == []
    assert rt_history(again, "s")[-2].content == "sub-s-1 failed"


def test_a_childs_call_decided_from_the_shell_resumes_the_family_at_the_start(
    loopd_runtime, capsys
) -> None:
    from actors.shells.cli import main

    ran.clear()
    rt = loopd_runtime(family_script, tools=[deploy])
    events = Events(rt)
    rt.send_turn("s", "ship it")
    events.wait(requested("sub-s-1"))
    rt.stop()
    assert main(["deny", "sub-s-1", "1", "--home", rt.config.home, "--reason", "later"]) == 0
    capsys.readouterr()
    again = loopd_runtime(family_script, tools=[deploy], config=rt.config)
    # The start carries the decision out at once: wait until nothing of the family is held.
    again.wait_family("s", timeout=WAIT)
    assert again.pending_approvals() == ()
    parent = rt_history(again, "s")
    assert [m.content for m in parent if m.role == "tool"] == [
        "sub-s-1 completed\nDenied: a person declined this call: later."
    ]
    assert parent[-1].content == "sub-s-1 completed\nDenied: a person declined this call: later."
    assert ran == []


a_waits = threading.Event()


@port_tool
def gate() -> str:
    """Return once the other child's call waits for a person."""
    a_waits.wait(WAIT)
    return "open"


def spending_script(request: ModelRequest) -> Any:
    """``s`` spawns two children: ``sub-s-1`` deploys (20 tokens an answer), ``sub-s-2`` goes
    through ``gate`` and then answers for 40 tokens, after ``sub-s-1``'s call waits."""
    last = request.messages[-1]
    if request.session == "s":
        if last.role == "user":
            two = calls(("subagent", {"task": "deploy"}), ("subagent", {"task": "wait"}))
            return with_usage(two, 10, 10)
        return with_usage(reply(tool_texts(request)), 10, 10)
    if request.session == "sub-s-1":
        answer = calls(("deploy", {"env": "prod"})) if last.role == "user" else reply("done")
        return with_usage(answer, 10, 10)
    if last.role == "user":
        return calls(("gate", {}))
    return with_usage(reply("waited"), 30, 10)


def test_what_the_family_spent_after_the_call_began_to_wait_is_kept_too(loopd_runtime) -> None:
    # Before the stop: s 20, sub-s-1 20 (then its call waits), sub-s-2 40 after that. After
    # the start sub-s-1's last answer brings it to 100: s's next request is refused. Counted
    # only up to when the call began to wait (40), s would have gone on.
    a_waits.clear()
    rt = loopd_runtime(spending_script, tools=[deploy, gate], loop={"token_budget": 100})
    events = Events(rt)
    rt.send_turn("s", "ship it")
    events.wait(requested("sub-s-1"))
    a_waits.set()
    events.wait(lambda e: isinstance(e, SubagentFinished) and e.child == "sub-s-2")
    rt.stop()
    again = loopd_runtime(spending_script, tools=[deploy, gate], config=rt.config)
    later = Events(again)
    assert isinstance(again.approve("sub-s-1", 1), ApprovalSettled)
    end = later.wait(ended())
    assert (end.completed, end.reason) == (False, "budget")
    assert "spent 100 tokens" in end.detail


def typed_script(request: ModelRequest) -> Any:
    """``s`` asks the typed ``counter`` child, which deploys and then answers in JSON."""
    last = request.messages[-1]
    if request.session == "s":
        if last.role == "user":
            return calls(("subagent", {"task": "count", "agent": "counter"}))
        return reply(tool_texts(request))
    if last.role == "user":
        return calls(("deploy", {"env": "prod"}))
    return calls(("final_answer", {"servers": 12, "where": "prod and eu"}))


def test_a_typed_childs_answer_reaches_its_parent_uncut_after_a_restart(
    loopd_runtime, loopd_config
) -> None:
    # summary_chars is 8: the child's JSON is longer, and a typed child's JSON is never cut.
    from actors.core.config import AgentConfig

    schema = {
        "type": "object",
        "properties": {"servers": {"type": "integer"}, "where": {"type": "string"}},
        "required": ["servers", "where"],
    }
    config = loopd_config.replace(agents={"counter": AgentConfig(output_schema=schema)})
    _request, rt, events = _stopped_while_the_child_waits(
        loopd_runtime, typed_script, config=config, compact={"summary_chars": 8}
    )
    assert isinstance(rt.approve("sub-s-1", 1), ApprovalSettled)
    assert events.wait(ended()).completed
    parent = [m.content for m in rt_history(rt, "s") if m.role == "tool"]
    assert parent == ['sub-s-1 completed\n{"servers":12,"where":"prod and eu"}']


def two_parents(request: ModelRequest) -> Any:
    """``s`` and ``t`` each delegate; a child calls deploy."""
    if request.session in ("s", "t"):
        if request.messages[-1].role == "user":
            return calls(("subagent", {"task": "deploy prod"}))
        return reply(tool_texts(request))
    return family_script(request)


def test_a_subagent_call_over_max_children_total_is_denied_without_asking(loopd_runtime) -> None:
    # The Context alone knows how many children run: it checks before anyone is asked.
    limits = {"loop": {"max_children_total": 1}, "approvals": {"tools": ["subagent"]}}
    rt = loopd_runtime(two_parents, tools=[deploy], **limits)
    events = Events(rt)
    rt.send_turn("s", "ship it")
    events.wait(requested("s"))
    assert isinstance(rt.approve("s", 1), ApprovalSettled)
    events.wait(requested("sub-s-1"))  # the one child runs, waiting for a person
    rt.send_turn("t", "ship it too")
    events.wait(ended("t"))
    assert not [e for e in events.seen if requested("t")(e)]
    assert rt_history(rt, "t")[-2].content == (
        "Denied: a limit of this runtime was reached: the runtime already runs 1 children "
        "(loop.max_children_total)."
    )
