"""Approvals at their edges: cancels and stops that cross a decision, a park or a reopening,
a SIGKILL while an approved call runs, decisions the shell must refuse, and limits that deny a
call before anybody is asked.

Real Runtime over a real SQLite home, scripted model; every wait has a deadline.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from approval_kit import (
    WAIT,
    Events,
    deploy,
    deploy_script,
    ended,
    ran,
    requested,
    rt_history,
    status,
    stored_approvals,
    tool_texts,
)

from actors import port_tool
from actors.testing import calls, reply
from messages import (
    ApprovalSettled,
    ModelRequest,
    Tick,
    TurnEnded,
    TurnFailed,
)

# A cancel that reaches the Context between its Park and the session's Parked.


def test_cancel_between_park_and_parked_answers_the_waiter_and_drops_the_request(
    loopd_runtime,
) -> None:
    ran.clear()
    rt = loopd_runtime(deploy_script, tools=[deploy, status])
    events = Events(rt)
    outcome: list[Any] = []
    waiter = threading.Thread(
        target=lambda: outcome.append(rt.run_turn("s", "go", timeout=3 * WAIT))
    )
    waiter.start()
    events.wait(requested())
    events.wait(lambda e: getattr(e, "name", None) == "status" and hasattr(e, "denied"))
    # The sweep's look an hour on (Park goes to s), then a cancel, both in the Context's
    # mailbox before s can answer Parked: s parks, ignores the Cancel (no turn any more), and
    # the Context then takes Parked as a plain park.
    rt.context.tell(Tick(now=datetime.now(UTC) + timedelta(hours=1)))
    assert rt.cancel("s") == ("s",)
    waiter.join(3)  # a cancel answers at once
    # Flush the Context (Parked has come by now) before looking at what it lists.
    rt.run_turn("barrier", "hi", timeout=WAIT)
    listed = rt.pending_approvals()
    ended_s = [e for e in events.seen if isinstance(e, TurnEnded) and e.session == "s"]
    # Worse: the cancelled turn's call can still be approved, and then it runs.
    late = rt.approve("s", 1)
    events.wait(ended())
    assert ran == [], f"a cancelled turn's deploy ran after a later approval ({late})"
    assert outcome, "the run_turn waiter of a cancelled turn was never answered"
    assert isinstance(outcome[0], TurnFailed) and outcome[0].reason == "cancelled"
    assert ended_s, "no TurnEnded for the cancelled turn"
    assert listed == (), f"the cancelled turn's request is still listed: {listed}"


# A stop while a resumed child runs again, its parent waiting in the store since the start.

child_runs = threading.Event()
let_go = threading.Event()


@port_tool(approval=True)
def slow_deploy(env: str) -> str:
    """Deploy, slowly.

    Args:
        env: Where to.
    """
    child_runs.set()
    let_go.wait(WAIT)
    return f"deployed to {env}"


def slow_family(request: ModelRequest) -> Any:
    last = request.messages[-1]
    if request.session == "s":
        if last.role == "user" and last.content == "how did it go?":
            return reply(tool_texts(request))
        if last.role == "user":
            return calls(("subagent", {"task": "deploy prod"}))
        return reply(tool_texts(request))
    if last.role == "user":
        return calls(("slow_deploy", {"env": "prod"}))
    return reply(tool_texts(request))


def test_a_stop_while_the_resumed_child_runs_ends_its_parent_once(
    loopd_runtime,
) -> None:
    child_runs.clear()
    let_go.clear()
    first = loopd_runtime(slow_family, tools=[slow_deploy])
    seen = Events(first)
    first.send_turn("s", "ship it")
    seen.wait(requested("sub-s-1"))
    first.stop()
    second = loopd_runtime(slow_family, tools=[slow_deploy], config=first.config)
    events = Events(second)
    assert isinstance(second.approve("sub-s-1", 1), ApprovalSettled)
    assert child_runs.wait(WAIT)  # the resumed child's approved call runs now
    let_go.set()
    second.stop()
    # The parent's turn (waiting in the store since the start) got no TurnEnded at this stop...
    parent_end = [e for e in events.seen if isinstance(e, TurnEnded) and e.session == "s"]
    third = loopd_runtime(slow_family, tools=[slow_deploy], config=first.config)
    later = Events(third)
    # ...and the next start does not resume it either (no row is left to resume it by):
    # its stored transcript still ends in the subagent call without a result.
    if not parent_end:
        third.wait_family("s", timeout=WAIT)
        parent_end = [e for e in later.seen if isinstance(e, TurnEnded) and e.session == "s"]
    assert parent_end, "the parent's turn never ends: no TurnEnded at the stop or after"
    assert len(parent_end) == 1, parent_end
    assert stored_approvals(third) == []  # nothing of the family is left to resume
    # Its cut-off subagent call is answered at its next turn, as for any turn a stop or a
    # crash cut off with no actor (the crash repair): the transcript stays valid.
    outcome = third.run_turn("s", "how did it go?", timeout=WAIT)
    assert not isinstance(outcome, TurnFailed), outcome
    tools = [m for m in rt_history(third, "s") if m.role == "tool"]
    # ("sub-s-1 failed"; or the child's own outcome, if it ended just before the stop did.)
    assert [m.tool_call_id for m in tools] == [1], tools
    assert (tools[0].content or "").startswith("sub-s-1 "), tools


# `loopd approvals` leaves out (and `loopd approve` refuses) a background child's request that
#    the next start drops.


def background_script(request: ModelRequest) -> Any:
    last = request.messages[-1]
    if request.session == "s" and last.role == "user" and last.name is None:
        return calls(("subagent", {"task": "deploy prod", "background": True}))
    if request.session == "sub-s-1" and last.role == "user":
        return calls(("deploy", {"env": "prod"}))
    return reply("noted")


def test_the_cli_neither_lists_nor_settles_a_cut_off_background_childs_request(
    loopd_runtime, capsys
) -> None:
    from actors.shells.cli import main

    ran.clear()
    rt = loopd_runtime(background_script, tools=[deploy], subagents={"background": True})
    events = Events(rt)
    rt.send_turn("s", "ship it")
    events.wait(requested("sub-s-1"))
    events.wait(ended())
    rt.stop()
    capsys.readouterr()
    assert main(["approvals", "--home", rt.config.home]) == 0
    listing = capsys.readouterr().out
    code = main(["approve", "sub-s-1", "1", "--home", rt.config.home])
    said = capsys.readouterr().out
    again = loopd_runtime(background_script, tools=[deploy], config=rt.config)
    again.wait_family("s", timeout=WAIT)
    # The person was told "approved; its turn resumes at the next start", but the start
    # dropped the row and the deploy never ran.
    assert ran == [] and stored_approvals(again) == []
    assert "sub-s-1" not in listing, f"listed, yet no start will ever ask: {listing!r}"
    assert code == 1, f"accepted a decision no start carries out: {said!r}"
    assert "background subagent" in said and "not listed: 1 call" in listing


# A cancel while a decision reopens a session that waited since the start.


def test_cancel_while_a_decision_reopens_the_session_drops_its_other_waiting_call(
    loopd_runtime,
) -> None:
    from approval_kit import two_deploys

    from messages import ApproveCall

    ran.clear()
    rt = loopd_runtime(two_deploys, tools=[deploy])
    events = Events(rt)
    rt.send_turn("s", "ship both")
    events.wait(lambda e: requested()(e) and e.call_id == 2)
    rt.stop()
    again = loopd_runtime(two_deploys, tools=[deploy], config=rt.config)
    later = Events(again)
    assert [r.call_id for r in again.pending_approvals()] == [1, 2]
    # The decision opens s from the store; the cancel comes before the store has answered.
    again.context.tell(ApproveCall("s", 1))
    assert again.cancel("s") == ("s",)
    later.wait(ended())
    again.run_turn("barrier", "hi", timeout=WAIT)
    listed = [(r.session, r.call_id) for r in again.pending_approvals()]
    rows = [(a.request.session, a.request.call_id) for a in stored_approvals(again)]
    # And the next start holds s again for it: approving it deploys for the cancelled turn.
    again.stop()
    third = loopd_runtime(two_deploys, tools=[deploy], config=rt.config)
    revived = [(r.session, r.call_id) for r in third.pending_approvals()]
    if revived:
        third.approve(*revived[0])
        third.wait_family("s", timeout=WAIT)
    assert ran == [], (
        f"a cancelled turn's calls ran after the next start: {ran} (listed after the cancel: "
        f"{listed}; stored: {rows}; listed at the next start: {revived})"
    )
    assert listed == [], f"a cancelled turn's call is still listed: {listed}"
    assert rows == [], f"a cancelled turn's call is still stored: {rows}"


# A call past its deadline: the shell refuses a decision and the next start declines it.


def test_a_call_past_its_deadline_is_not_run_by_a_late_shell_decision(
    loopd_runtime, capsys
) -> None:
    from actors.shells.cli import main

    # The first runtime's clock runs two minutes behind, so the deadline it stores (its now
    # plus 1 s) has passed by the wall clock the shell and the next start read.
    def earlier() -> datetime:
        return datetime.now(UTC) - timedelta(minutes=2)

    ran.clear()
    rt = loopd_runtime(
        deploy_script, tools=[deploy, status], approvals={"timeout_s": 1}, clock=earlier
    )
    events = Events(rt)
    rt.send_turn("s", "ship it")
    events.wait(requested())
    rt.stop()
    (row,) = stored_approvals(rt)
    assert row.deadline < datetime.now(UTC)
    capsys.readouterr()
    assert main(["approvals", "--home", rt.config.home]) == 0
    listing = capsys.readouterr().out
    code = main(["approve", "s", "1", "--home", rt.config.home])
    said = capsys.readouterr().out
    again = loopd_runtime(deploy_script, tools=[deploy, status], config=rt.config)
    again.wait_family("s", timeout=WAIT)
    tools = [m.content for m in rt_history(again, "s") if m.role == "tool"]
    # A runtime on the home would have declined it at the deadline; nobody decided in time.
    assert ran == [], f"a call past its deadline ran (the CLI said {said!r}, exit {code}): {tools}"
    assert code == 1 and "declined for its timeout (no decision within 1 s)" in said
    assert listing.startswith("no call waits for a decision\npast its deadline: call 1 of")
    assert "Denied: a person declined this call: no decision within 1 s." in tools
    assert stored_approvals(again) == []


# A SIGKILL while an approved call runs: the next start answers it interrupted, never runs it again.


def test_a_sigkill_during_an_approved_call_does_not_run_it_again_at_the_start(
    loopd_runtime, loopd_config
) -> None:
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    ran.clear()
    driver = Path(__file__).with_name("approval_kill_driver.py")
    proc = subprocess.Popen(
        [sys.executable, str(driver), loopd_config.home],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )
    try:
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()))
        reader.start()
        reader.join(30)
        assert line == ["deploying\n"], line
    finally:
        proc.kill()
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    rows = [(a.request.call_id, a.approved) for a in stored_approvals(rt_probe(loopd_config))]
    rt = loopd_runtime(deploy_script, tools=[deploy, status])
    rt.wait_family("s", timeout=WAIT)
    tools = [m.content for m in rt_history(rt, "s") if m.role == "tool"]
    # The deploy had begun in the killed process: a crash's repair answers it as interrupted
    # (as for any call a crash cut off); running it again deploys twice.
    assert ran == [], f"the approved deploy ran again at the start (rows {rows}): {tools}"


def rt_probe(config: Any) -> Any:
    class Probe:
        pass

    probe = Probe()
    probe.config = config  # type: ignore[attr-defined]
    return probe


# A subagent call the background limit denies anyway is denied without asking anybody.


def limit_script(request: ModelRequest) -> Any:
    last = request.messages[-1]
    if request.session == "s" and last.role == "user" and last.name is None:
        return calls(("subagent", {"task": "deploy prod", "background": True}))
    if request.session.startswith("sub-") and last.role == "user":
        return calls(("deploy", {"env": "prod"}))
    return reply("noted")


def test_a_subagent_call_over_the_background_limit_is_denied_without_asking(
    loopd_runtime,
) -> None:
    ran.clear()
    rt = loopd_runtime(
        limit_script,
        tools=[deploy],
        subagents={"background": True, "max_background": 1},
        approvals={"tools": ["subagent"]},
    )
    events = Events(rt)
    rt.send_turn("s", "ship it")
    events.wait(requested())
    assert isinstance(rt.approve("s", 1), ApprovalSettled)
    events.wait(requested("sub-s-1"))  # the one background child runs, waiting for a person
    events.wait(ended())
    since = events.mark()
    rt.send_turn("s", "ship again")
    # The limit is reached now: the call is denied anyway, so nobody should be asked.
    events.wait(
        lambda e: (isinstance(e, TurnEnded) and e.session == "s") or requested()(e), since=since
    )
    asked = [e for e in events.seen[since:] if requested()(e)]
    if asked:
        rt.approve("s", asked[0].call_id)
        events.wait(ended(), since=since)
    texts = [m.content for m in rt_history(rt, "s") if m.role == "tool"]
    assert asked == [], f"a person was asked about a call the limit denies anyway: {texts[-1]!r}"
    assert texts[-1] == (
        "Denied: a limit of this runtime was reached: 1 background subagents are running; "
        "wait for one to report."
    )


# A stop after a decision, before the resumed turn runs: the session parks, ends once.


def test_a_turn_ended_cancelled_at_a_stop_is_not_resumed_at_the_next_start(
    loopd_runtime,
) -> None:
    from messages import ApproveCall

    ran.clear()
    rt = loopd_runtime(deploy_script, tools=[deploy, status])
    events = Events(rt)
    rt.send_turn("s", "ship it")
    events.wait(requested())
    rt.stop()
    second = loopd_runtime(deploy_script, tools=[deploy, status], config=rt.config)
    seen = Events(second)
    # The decision reopens s; the stop comes before its actor runs the resumed turn.
    second.context.tell(ApproveCall("s", 1))
    second.stop()
    first_end = [e for e in seen.seen if isinstance(e, TurnEnded) and e.session == "s"]
    third = loopd_runtime(deploy_script, tools=[deploy, status], config=rt.config)
    later = Events(third)
    third.wait_family("s", timeout=WAIT)
    second_end = [e for e in later.seen if isinstance(e, TurnEnded) and e.session == "s"]
    # One turn, one TurnEnded: either it parks at the stop (no TurnEnded, resumed later), or
    # it ends cancelled and nothing of it runs afterwards.
    assert not (first_end and ran), (
        f"ended {first_end[0].reason} at the stop, then resumed at the start: ran {ran}, "
        f"ended again {[e.reason or 'completed' for e in second_end]}"
    )
