"""A person in the loop (SPEC 11): calls that wait for a yes or no, durably, and the turns that
resume when one comes. Real actors, a real SQLite store; every wait has a deadline."""

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
    deploy,
    deploy_script,
    ended,
    family_script,
    fetch,
    ran,
    requested,
    rt_history,
    status,
    stored_approvals,
    tool_texts,
    two_deploys,
    untrusted_script,
)

from actors import ToolContext, port_tool
from actors.stores.open import open_store
from actors.testing import calls, reply
from messages import (
    ApprovalRefused,
    ApprovalSettled,
    ModelRequest,
    TurnCompleted,
)


def test_an_approved_call_runs_and_the_others_ran_meanwhile(loopd_runtime) -> None:
    ran.clear()
    rt = loopd_runtime(deploy_script, tools=[deploy, status])
    events = Events(rt)
    rt.send_turn("s", "ship it")
    request = events.wait(requested())
    assert (request.call_id, request.tool, request.untrusted) == (1, "deploy", False)
    assert request.arguments == '{"env": "prod"}'
    # The other call of the answer ran while this one waits.
    events.wait(lambda e: getattr(e, "name", None) == "status" and hasattr(e, "denied"))
    assert ran == []
    assert rt.pending_approvals() == (request,)
    settled = rt.approve("s", 1, note="go")
    assert isinstance(settled, ApprovalSettled) and settled.approved
    end = events.wait(ended())
    assert end.completed
    assert ran == ["prod"]
    assert rt.pending_approvals() == ()
    # Each result was stored as it came (status's first, while deploy waited); the model
    # read them in call order.
    history = [m for m in rt_history(rt, "s") if m.role == "tool"]
    assert [m.tool_call_id for m in history] == [2, 1]
    assert history[1].content == "deployed to prod"
    read = [m.tool_call_id for m in rt.model.requests[-1].messages if m.role == "tool"]
    assert read == [1, 2]


def test_a_declined_call_answers_the_denial_and_a_second_decision_is_refused(
    loopd_runtime,
) -> None:
    ran.clear()
    rt = loopd_runtime(deploy_script, tools=[deploy, status])
    events = Events(rt)
    rt.send_turn("s", "ship it")
    events.wait(requested())
    settled = rt.deny("s", 1, "not on a Friday")
    assert isinstance(settled, ApprovalSettled) and not settled.approved
    again = rt.approve("s", 1)
    assert isinstance(again, ApprovalRefused)
    assert again.detail == "call 1 of session s is not waiting for a decision"
    events.wait(ended())
    tools = {m.tool_call_id: m for m in rt_history(rt, "s") if m.role == "tool"}
    assert tools[1].content == "Denied: a person declined this call: not on a Friday."
    assert ran == []


def test_a_decision_on_a_call_the_store_no_longer_has_waiting_is_refused_and_nothing_runs(
    loopd_runtime,
) -> None:
    # The runtime's table says call 1 waits; the store's row is gone, as another process's
    # decision and result on a shared store would leave it. Nothing may be settled or run.
    ran.clear()
    rt = loopd_runtime(deploy_script, tools=[deploy, status])
    events = Events(rt)
    rt.send_turn("s", "ship it")
    request = events.wait(requested())
    with open_store(rt.config) as store:
        store.drop_approvals("s", [1])
    refused = rt.approve("s", 1)
    assert isinstance(refused, ApprovalRefused), refused
    assert "no waiting call to decide" in refused.detail
    assert rt.pending_approvals() == (request,)  # this turn still waits: only a timeout ends it
    assert not any(isinstance(e, ApprovalSettled) for e in events.seen)
    assert ran == []


def test_a_call_nobody_decides_is_declined_at_the_timeout(loopd_runtime) -> None:
    rt = loopd_runtime(deploy_script, tools=[deploy, status], approvals={"timeout_s": 0.2})
    events = Events(rt)
    rt.send_turn("s", "ship it")
    events.wait(requested())
    settled = events.wait(lambda e: isinstance(e, ApprovalSettled))
    assert not settled.approved
    events.wait(ended())
    tools = {m.tool_call_id: m for m in rt_history(rt, "s") if m.role == "tool"}
    assert tools[1].content == "Denied: a person declined this call: no decision within 0.2 s."


def test_a_wait_survives_a_stop_and_the_decision_resumes_the_turn(loopd_runtime) -> None:
    ran.clear()
    rt = loopd_runtime(deploy_script, tools=[deploy, status])
    events = Events(rt)
    rt.send_turn("s", "ship it")
    request = events.wait(requested())
    events.wait(lambda e: getattr(e, "name", None) == "status" and hasattr(e, "denied"))
    rt.stop()
    again = loopd_runtime(deploy_script, tools=[deploy, status], config=rt.config)
    later = Events(again)
    assert again.pending_approvals() == (request,)
    # The session is held by its waiting call: a new turn is busy.
    busy = again.run_turn("s", "anything?", timeout=WAIT)
    assert getattr(busy, "reason", None) == "busy"
    settled = again.approve("s", 1)
    assert isinstance(settled, ApprovalSettled)
    end = later.wait(ended())
    assert end.completed, end
    assert ran == ["prod"]
    transcript = rt_history(again, "s")
    tools = [m for m in transcript if m.role == "tool"]
    assert sorted(m.tool_call_id for m in tools) == [1, 2]
    assert {m.tool_call_id: m.content for m in tools}[2] == "prod is green"  # kept from before
    assert again.pending_approvals() == ()
    # Call ids continue after the resumed turn.
    again.send_turn("s", "and again")
    next_request = later.wait(lambda e: requested()(e) and e.call_id == 3)
    assert next_request.tool == "deploy"
    assert isinstance(again.deny("s", 3, "once is enough"), ApprovalSettled)
    later.wait(lambda e: ended()(e) and e is not end)
    ids = [c.id for m in rt_history(again, "s") for c in m.tool_calls]
    assert ids == [1, 2, 3, 4]


DRIVER = Path(__file__).with_name("approval_driver.py")


def test_a_wait_survives_a_sigkill_and_the_turn_completes(loopd_runtime, loopd_config) -> None:
    ran.clear()
    home = loopd_config.home
    proc = subprocess.Popen(
        [sys.executable, str(DRIVER), home],
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
        proc.kill()  # SIGKILL: no stop, nothing flushed but what the store committed
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    rt = loopd_runtime(deploy_script, tools=[deploy, status])
    events = Events(rt)
    (request,) = rt.pending_approvals()
    assert (request.session, request.call_id, request.tool) == ("s", 1, "deploy")
    assert request.at.isoformat() == printed["at"]
    assert isinstance(rt.approve("s", 1), ApprovalSettled)
    end = events.wait(ended())
    assert end.completed, end
    assert ran == ["prod"]
    transcript = rt_history(rt, "s")
    calls_made = [c.id for m in transcript for c in m.tool_calls]
    answered = sorted(m.tool_call_id for m in transcript if m.role == "tool")
    assert calls_made == answered == [1, 2]  # a valid transcript: every call answered once
    assert transcript[-1].role == "assistant" and "deployed to prod" in (
        transcript[-1].content or ""
    )


def test_a_childs_call_waits_naming_the_child_and_is_approved(loopd_runtime) -> None:
    ran.clear()
    rt = loopd_runtime(family_script, tools=[deploy])
    events = Events(rt)
    rt.send_turn("s", "ship it")
    request = events.wait(requested("sub-s-1"))
    assert (request.call_id, request.tool) == (1, "deploy")
    assert rt.pending_approvals() == (request,)
    assert isinstance(rt.approve("sub-s-1", 1), ApprovalSettled)
    end = events.wait(ended())
    assert end.completed
    assert ran == ["prod"]
    parent = [m for m in rt_history(rt, "s") if m.role == "tool"]
    assert parent[0].content == "sub-s-1 completed\ndeployed to prod"


def test_the_child_timeout_does_not_run_while_a_child_waits(loopd_runtime) -> None:
    # The child may take 0.5 s; its call waits 1 s for a person and is then declined. Had
    # the child's timer run meanwhile, the parent would read "sub-s-1 failed".
    rt = loopd_runtime(
        family_script,
        tools=[deploy],
        loop={"child_timeout_s": 0.5},
        approvals={"timeout_s": 1.0},
    )
    events = Events(rt)
    rt.send_turn("s", "ship it")
    events.wait(lambda e: isinstance(e, ApprovalSettled))
    end = events.wait(ended())
    assert end.completed
    parent = [m for m in rt_history(rt, "s") if m.role == "tool"]
    assert parent[0].content.startswith("sub-s-1 completed\nDenied: a person declined this call")


def test_cancelling_the_session_answers_the_waiting_call_and_drops_the_request(
    loopd_runtime,
) -> None:
    ran.clear()
    rt = loopd_runtime(deploy_script, tools=[deploy, status])
    events = Events(rt)
    rt.send_turn("s", "ship it")
    events.wait(requested())
    assert rt.cancel("s") == ("s",)
    end = events.wait(ended())
    assert end.reason == "cancelled"
    assert rt.pending_approvals() == ()
    # The store writes in order: once a later turn is stored, the cancel's writes are too.
    assert isinstance(rt.run_turn("barrier", "hi", timeout=WAIT), TurnCompleted)
    refused = rt.approve("s", 1)
    assert isinstance(refused, ApprovalRefused)
    tools = {m.tool_call_id: m.content for m in rt_history(rt, "s") if m.role == "tool"}
    assert tools[1] == "Denied: the turn ended before this call returned a result."
    assert ran == []
    assert stored_approvals(rt) == []


def test_cancelling_an_ancestor_drops_a_childs_request(loopd_runtime) -> None:
    rt = loopd_runtime(family_script, tools=[deploy])
    events = Events(rt)
    rt.send_turn("s", "ship it")
    events.wait(requested("sub-s-1"))
    assert set(rt.cancel("s")) == {"s", "sub-s-1"}
    events.wait(ended("sub-s-1"))
    events.wait(ended())
    assert rt.pending_approvals() == ()
    assert isinstance(rt.approve("sub-s-1", 1), ApprovalRefused)


def test_the_timeout_also_declines_after_a_restart(loopd_runtime) -> None:
    # 1 s: long enough that the first runtime stops before its timer would fire.
    rt = loopd_runtime(deploy_script, tools=[deploy, status], approvals={"timeout_s": 1.0})
    events = Events(rt)
    rt.send_turn("s", "ship it")
    events.wait(requested())
    rt.stop()
    again = loopd_runtime(deploy_script, tools=[deploy, status], config=rt.config)
    later = Events(again)
    settled = later.wait(lambda e: isinstance(e, ApprovalSettled))
    assert not settled.approved
    later.wait(ended())
    tools = {m.tool_call_id: m.content for m in rt_history(again, "s") if m.role == "tool"}
    assert tools[1] == "Denied: a person declined this call: no decision within 1 s."


def test_a_decision_past_the_deadline_is_refused_and_the_call_declined(loopd_runtime) -> None:
    # The stored deadline is binding also before its timer's message comes (a late timer, a
    # decision right after a start that read the request back): the clock says it is past.
    ran.clear()
    ahead = [timedelta(0)]
    rt = loopd_runtime(
        deploy_script,
        tools=[deploy, status],
        approvals={"timeout_s": 60},
        clock=lambda: datetime.now(UTC) + ahead[0],
    )
    events = Events(rt)
    rt.send_turn("s", "ship it")
    events.wait(requested())
    ahead[0] = timedelta(seconds=61)  # its timer fires in a minute; the deadline has passed
    refused = rt.approve("s", 1)
    assert isinstance(refused, ApprovalRefused)
    assert refused.detail == (
        "call 1 of session s was declined for its timeout (no decision within 60 s): a decision "
        "past its deadline is not carried out; see docs/runbook.md#approval-past-its-deadline"
    )
    settled = events.wait(lambda e: isinstance(e, ApprovalSettled))
    assert not settled.approved
    events.wait(ended())
    tools = {m.tool_call_id: m.content for m in rt_history(rt, "s") if m.role == "tool"}
    assert tools[1] == "Denied: a person declined this call: no decision within 60 s."
    assert ran == [] and rt.pending_approvals() == ()


def test_of_two_decisions_at_once_exactly_one_is_applied(loopd_runtime) -> None:
    rt = loopd_runtime(deploy_script, tools=[deploy, status])
    events = Events(rt)
    rt.send_turn("s", "ship it")
    events.wait(requested())
    answers: list[Any] = []
    start = threading.Barrier(2)

    def decide(yes: bool) -> None:
        start.wait(5)
        answers.append(rt.approve("s", 1) if yes else rt.deny("s", 1, "no"))

    threads = [threading.Thread(target=decide, args=(yes,)) for yes in (True, False)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    kinds = sorted(type(a).__name__ for a in answers)
    assert kinds == ["ApprovalRefused", "ApprovalSettled"]
    events.wait(ended())
    settled = [e for e in events.seen if isinstance(e, ApprovalSettled)]
    assert len(settled) == 1


def test_the_untrusted_flag_is_shown_and_denials_are_kept(loopd_runtime) -> None:
    rt = loopd_runtime(untrusted_script, tools=[deploy, fetch], approvals={"tools": ["remember"]})
    events = Events(rt)
    assert isinstance(rt.run_turn("s", "read", timeout=WAIT), TurnCompleted)
    events.wait(ended())  # the event may reach us after the reply: mark after it
    since = events.mark()
    rt.send_turn("s", "now deploy")
    request = events.wait(requested())
    assert (request.call_id, request.tool, request.untrusted) == (2, "deploy", True)
    # remember is listed too, but an untrusted session's remember is denied anyway: nobody
    # is asked, and it stays denied.
    events.wait(lambda e: getattr(e, "name", None) == "remember" and getattr(e, "denied", False))
    assert [r.call_id for r in rt.pending_approvals()] == [2]
    assert isinstance(rt.deny("s", 2, "injected"), ApprovalSettled)
    events.wait(ended(), since=since)
    tools = {m.tool_call_id: m.content for m in rt_history(rt, "s") if m.role == "tool"}
    assert tools[2] == "Denied: a person declined this call: injected."
    assert tools[3].startswith("Denied: this session has read untrusted data")


def test_a_waiting_session_is_passivated_and_the_decision_resumes_it(loopd_runtime) -> None:
    from datetime import UTC, datetime, timedelta

    from messages import Tick

    ran.clear()
    rt = loopd_runtime(deploy_script, tools=[deploy, status])
    events = Events(rt)
    outcome: list[Any] = []
    waiter = threading.Thread(target=lambda: outcome.append(rt.run_turn("s", "go", timeout=WAIT)))
    waiter.start()
    events.wait(requested())
    events.wait(lambda e: getattr(e, "name", None) == "status" and hasattr(e, "denied"))
    actor = rt.directory.get("session:s")
    # The sweep's look, an hour on: the call has waited past sessions.idle_s.
    rt.context.tell(Tick(now=datetime.now(UTC) + timedelta(hours=1)))
    assert actor.actor_stopped.wait(WAIT)  # type: ignore[union-attr]
    assert "s" not in rt.live()
    assert [r.call_id for r in rt.pending_approvals()] == [1]
    assert isinstance(rt.approve("s", 1), ApprovalSettled)
    waiter.join(WAIT)
    (done,) = outcome
    assert isinstance(done, TurnCompleted)  # the first caller hears the resumed turn's end
    assert done.content == "deployed to prod\nprod is green"
    assert ran == ["prod"]


def test_a_stale_request_whose_call_has_its_result_is_dropped(loopd_runtime) -> None:
    from actors.core.approvals import stored_approval
    from actors.stores.open import open_store
    from messages import ToolCall

    ran.clear()
    rt = loopd_runtime(deploy_script, tools=[deploy, status])
    events = Events(rt)
    rt.send_turn("s", "ship it")
    request = events.wait(requested())
    assert isinstance(rt.approve("s", 1), ApprovalSettled)
    events.wait(ended())
    rt.stop()
    # As if a crash came between storing the call's result and forgetting its request.
    store = open_store(rt.config)
    try:
        call = ToolCall(1, "deploy", request.arguments)
        entry = stored_approval("s", call, False, request.at, 600.0)
        store.run_batch([("s", lambda cur: store.add_approval_in(cur, entry))])
    finally:
        store.close()
    again = loopd_runtime(deploy_script, tools=[deploy, status], config=rt.config)
    later = Events(again)
    assert [r.call_id for r in again.pending_approvals()] == [1]
    assert isinstance(again.approve("s", 1), ApprovalSettled)
    end = later.wait(ended())
    assert end.completed  # the stored turn had ended: nothing runs again
    assert ran == ["prod"]
    assert isinstance(again.run_turn("barrier", "hi", timeout=WAIT), TurnCompleted)
    assert stored_approvals(again) == []
    assert again.pending_approvals() == ()


def test_two_waiting_calls_after_a_restart_both_decided_at_once(loopd_runtime) -> None:
    ran.clear()
    rt = loopd_runtime(two_deploys, tools=[deploy])
    events = Events(rt)
    rt.send_turn("s", "ship both")
    events.wait(lambda e: requested()(e) and e.call_id == 2)
    events.wait(lambda e: requested()(e) and e.call_id == 1)
    rt.stop()
    again = loopd_runtime(two_deploys, tools=[deploy], config=rt.config)
    later = Events(again)
    # The second decision comes while the first one's resume is still opening the session.
    assert isinstance(again.approve("s", 1), ApprovalSettled)
    assert isinstance(again.deny("s", 2, "not eu"), ApprovalSettled)
    end = later.wait(ended())
    assert end.completed
    assert ran == ["prod"]
    texts = {m.tool_call_id: m.content for m in rt_history(again, "s") if m.role == "tool"}
    assert texts == {1: "deployed to prod", 2: "Denied: a person declined this call: not eu."}


def test_approve_and_deny_over_real_http(loopd_runtime, chat_server, loopd_config) -> None:
    from actors import ModelConfig

    ran.clear()

    def answer(body: dict[str, Any]) -> Any:
        last = body["messages"][-1]
        if last["role"] == "user":
            return calls(("deploy", {"env": "prod"}), ("deploy", {"env": "eu"}))
        return reply("\n".join(m["content"] for m in body["messages"] if m["role"] == "tool"))

    server = chat_server(answer)
    model = ModelConfig(base_url=server.base_url, retries=0)
    rt = loopd_runtime(config=loopd_config.replace(model=model), tools=[deploy])
    events = Events(rt)
    rt.send_turn("s", "ship both")
    events.wait(lambda e: requested()(e) and e.call_id == 2)
    assert isinstance(rt.deny("s", 2, "eu is frozen"), ApprovalSettled)
    assert isinstance(rt.approve("s", 1), ApprovalSettled)
    end = events.wait(ended())
    assert end.completed
    assert ran == ["prod"]
    assert server.errors == []
    # What went over the wire: both results, in call order, after the answer that asked.
    sent = server.requests[-1]["messages"]
    assert [m.get("tool_call_id") for m in sent if m["role"] == "tool"] == ["call_1", "call_2"]
    assert [m["content"] for m in sent if m["role"] == "tool"] == [
        "deployed to prod",
        "Denied: a person declined this call: eu is frozen.",
    ]


@port_tool(approval=True)
def slow_deploy(env: str, ctx: ToolContext) -> str:
    """Deploy, slowly: until the call is cancelled.

    Args:
        env: Where to.
    """
    started.set()
    ctx.cancelled.wait(WAIT)
    return "stopped"


started = threading.Event()


def slow_script(request: ModelRequest) -> Any:
    if request.session == "barrier":
        return reply("ok")
    if request.messages[-1].role == "user":
        return calls(("slow_deploy", {"env": "prod"}))
    return reply(tool_texts(request))


def test_a_call_cancelled_after_its_approval_leaves_no_request(loopd_runtime) -> None:
    started.clear()
    rt = loopd_runtime(slow_script, tools=[slow_deploy])
    events = Events(rt)
    rt.send_turn("s", "ship it")
    events.wait(requested())
    assert isinstance(rt.approve("s", 1), ApprovalSettled)
    assert started.wait(WAIT)
    assert rt.cancel("s") == ("s",)
    events.wait(ended())
    assert isinstance(rt.run_turn("barrier", "hi", timeout=WAIT), TurnCompleted)
    # Nothing is left for the next start to resume: the cancelled turn stays ended.
    assert stored_approvals(rt) == []


def test_a_passivated_turn_leaves_no_request_of_a_call_decided_before(loopd_runtime) -> None:
    from datetime import UTC, datetime, timedelta

    from messages import Tick

    ran.clear()
    rt = loopd_runtime(two_deploys, tools=[deploy])
    events = Events(rt)
    rt.send_turn("s", "ship both")
    events.wait(lambda e: requested()(e) and e.call_id == 2)
    assert isinstance(rt.approve("s", 2), ApprovalSettled)
    events.wait(lambda e: getattr(e, "call_id", None) == 2 and hasattr(e, "denied"))
    actor = rt.directory.get("session:s")
    rt.context.tell(Tick(now=datetime.now(UTC) + timedelta(hours=1)))
    assert actor.actor_stopped.wait(WAIT)  # type: ignore[union-attr]
    assert isinstance(rt.approve("s", 1), ApprovalSettled)
    events.wait(ended())
    assert sorted(ran) == ["eu", "prod"]
    assert isinstance(rt.run_turn("barrier", "hi", timeout=WAIT), TurnCompleted)
    assert stored_approvals(rt) == []


def test_cancelling_a_session_that_waits_since_the_start_drops_its_request(
    loopd_runtime,
) -> None:
    ran.clear()
    rt = loopd_runtime(deploy_script, tools=[deploy, status])
    events = Events(rt)
    rt.send_turn("s", "ship it")
    events.wait(requested())
    rt.stop()
    again = loopd_runtime(deploy_script, tools=[deploy, status], config=rt.config)
    later = Events(again)
    assert [r.call_id for r in again.pending_approvals()] == [1]
    assert again.cancel("s") == ("s",)
    assert later.wait(ended()).reason == "cancelled"
    assert again.pending_approvals() == ()
    assert isinstance(again.approve("s", 1), ApprovalRefused)
    # The session is free again; its next turn answers the cut-off call first.
    since = later.mark()
    again.send_turn("s", "try again")
    assert later.wait(requested(), since=since).call_id == 3
    tools = {m.tool_call_id: m.content for m in rt_history(again, "s") if m.role == "tool"}
    assert tools[1] == "Denied: the turn ended before this call returned a result."
    assert ran == []


def call_tool_script(request: ModelRequest) -> Any:
    if request.messages[-1].role == "user":
        return calls(("call_tool", {"name": "deploy", "arguments": {"env": "prod"}}))
    return reply(tool_texts(request))


def test_a_tool_reached_through_call_tool_waits_as_if_called_directly(loopd_runtime) -> None:
    # call_tool dispatches its inner call with the same checks: wrapping a tool that needs a
    # person in it must not skip the person.
    ran.clear()
    rt = loopd_runtime(call_tool_script, tools=[deploy, status])
    events = Events(rt)
    rt.send_turn("s", "ship it")
    request = events.wait(requested())
    assert (request.call_id, request.tool) == (1, "call_tool")  # as the model wrote it
    assert json.loads(request.arguments)["name"] == "deploy"
    assert ran == []
    assert isinstance(rt.deny("s", 1, "not today"), ApprovalSettled)
    assert events.wait(ended()).completed
    tools = [m for m in rt_history(rt, "s") if m.role == "tool"]
    assert tools[0].content == "Denied: a person declined this call: not today."
    assert ran == []
