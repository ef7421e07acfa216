"""Approvals from every door (SPEC 11): AsyncRuntime, the REPL, the CLI, the live lines,
traces, and which calls wait. Real actors, a real SQLite store; every wait has a deadline."""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from approval_kit import (
    WAIT,
    Events,
    deploy,
    deploy_script,
    ended,
    fetch,
    ran,
    requested,
    rt_history,
    status,
    stored_approvals,
    tool_texts,
    untrusted_script,
)

from actors import PortTool, port_tool
from actors.testing import calls, reply
from messages import (
    ApprovalRefused,
    ApprovalRequested,
    ApprovalSettled,
    ModelRequest,
    ToolSpec,
    TurnCompleted,
)


def test_async_runtime_lists_approves_and_denies(tmp_path: Path) -> None:
    from actors import Config
    from actors.aio import AsyncRuntime
    from actors.testing import ScriptedModel

    async def main() -> None:
        cfg = Config(home=str(tmp_path / "home"))
        model = ScriptedModel(deploy_script)
        async with await AsyncRuntime.start(cfg, model=model, tools=[deploy, status]) as rt:
            feed = rt.events("s")
            task = asyncio.create_task(rt.run_turn("s", "ship it", timeout=WAIT))
            async for event in feed:
                if isinstance(event, ApprovalRequested):
                    break
            (request,) = await rt.pending_approvals()
            assert request.call_id == 1
            refused = await rt.deny("s", 9, "no such call")
            assert isinstance(refused, ApprovalRefused)
            settled = await rt.approve("s", 1)
            assert isinstance(settled, ApprovalSettled)
            outcome = await task
            assert isinstance(outcome, TurnCompleted)
            assert "deployed to prod" in outcome.content

    asyncio.run(asyncio.wait_for(main(), WAIT))


def test_the_cli_lists_and_settles_on_a_home_no_runtime_holds(loopd_runtime, capsys) -> None:
    from actors.shells.cli import main

    ran.clear()
    rt = loopd_runtime(untrusted_script, tools=[deploy, fetch])
    events = Events(rt)
    assert isinstance(rt.run_turn("s", "read", timeout=WAIT), TurnCompleted)
    rt.send_turn("s", "now deploy")
    events.wait(requested())
    home = rt.config.home
    # A runtime holds the home: the CLI refuses to write behind it.
    assert main(["approve", "s", "2", "--home", home]) == 2
    assert "in use by another loopd runtime" in capsys.readouterr().err
    rt.stop()
    # loopd sessions says the session waits for a person (not "running" or "stored").
    assert main(["sessions", "--home", home]) == 0
    row = next(r for r in capsys.readouterr().out.splitlines() if r.startswith("s "))
    assert row.split()[1:3] == ["default", "waiting"]
    assert main(["sessions", "--home", home, "--json"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line)["state"] == "waiting"
    assert main(["approvals", "--home", home]) == 0
    listing = capsys.readouterr().out
    assert "deploy" in listing and "UNTRUSTED" in listing
    assert main(["approve", "s", "2", "--home", home, "--note", "checked"]) == 0
    capsys.readouterr()
    assert main(["deny", "s", "2", "--home", home, "--reason", "late"]) == 1
    assert capsys.readouterr().out.strip() == "call 2 of session s is not waiting for a decision"
    assert main(["approvals", "--home", home]) == 0
    assert capsys.readouterr().out.strip() == "no call waits for a decision"
    # The next start carries the decision out: the turn resumes and completes.
    again = loopd_runtime(untrusted_script, tools=[deploy, fetch], config=rt.config)
    later = Events(again)
    end = later.wait(ended())
    assert end.completed
    assert ran == ["prod"]
    assert stored_approvals(again) == []


def test_the_repl_helpers_show_untrusted_and_decide(loopd_runtime, capsys) -> None:
    from actors.shells.repl import Helpers

    rt = loopd_runtime(untrusted_script, tools=[deploy, fetch])
    events = Events(rt)
    assert isinstance(rt.run_turn("s", "read", timeout=WAIT), TurnCompleted)
    rt.send_turn("s", "now deploy")
    events.wait(requested())
    helpers = Helpers(rt)
    names = helpers.namespace()
    (request,) = names["approvals"]()
    assert request.untrusted
    assert "UNTRUSTED" in capsys.readouterr().out
    assert isinstance(names["deny"]("s", 2, "no"), ApprovalSettled)
    assert isinstance(names["approve"]("s", 2), ApprovalRefused)


def test_the_live_lines_show_requests_and_decisions() -> None:
    from actors.shells.render import render_event

    request = ApprovalRequested(
        session="s", call_id=2, tool="deploy", arguments='{"env": "prod"}', untrusted=True
    )
    line = render_event(request)
    assert line.endswith('call 2 deploy waits for a person (untrusted session): {"env": "prod"}')
    settled = ApprovalSettled(session="s", call_id=2, approved=False)
    assert render_event(settled).endswith("call 2 declined")


def test_which_calls_wait_names_patterns_profiles_and_marked_tools() -> None:
    from actors import Config
    from actors.core.approvals import approval_policies, timeout_reason

    config = Config.from_toml(
        """
        [approvals]
        tools = ["send_email", "github__*"]
        timeout_s = 86400
        [agents.ops]
        approve = ["restart"]
        """
    )
    policies = approval_policies(config, marked=["deploy"])
    default, ops = policies["default"], policies["ops"]
    assert default.needs("send_email") and default.needs("github__merge")
    assert default.needs("deploy")  # @port_tool(approval=True)
    assert not default.needs("github_merge") and not default.needs("restart")
    assert ops.needs("restart") and ops.needs("send_email")
    assert timeout_reason(config.approvals.timeout_s) == "no decision within 86400 s"
    assert timeout_reason(604800.0) == "no decision within 604800 s"
    assert timeout_reason(0.25) == "no decision within 0.25 s"


def test_a_profiles_approve_list_makes_its_calls_wait(loopd_runtime, loopd_config) -> None:
    from actors.core.config import AgentConfig

    config = loopd_config.replace(agents={"ops": AgentConfig(approve=("status",))})
    rt = loopd_runtime(deploy_script, tools=[deploy, status], config=config)
    events = Events(rt)
    rt.send_turn("s", "ship it", agent="ops")
    first = events.wait(requested())
    second = events.wait(lambda e: requested()(e) and e is not first)
    assert sorted((first.tool, second.tool)) == ["deploy", "status"]


def test_the_wait_is_two_events_on_the_calls_span(loopd_runtime) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from actors.tracing.otel import OtelTracer

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = OtelTracer(tracer_provider=provider)
    rt = loopd_runtime(deploy_script, tools=[deploy, status], tracer=tracer)
    events = Events(rt)
    rt.send_turn("s", "ship it")
    events.wait(requested())
    assert isinstance(rt.approve("s", 1), ApprovalSettled)
    events.wait(ended())
    rt.stop()  # every span ended and exported
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "execute_tool deploy"]
    assert [(e.name, dict(e.attributes or {})) for e in span.events] == [
        ("loopd.approval.requested", {"loopd.untrusted": False}),
        ("loopd.approval.settled", {"loopd.approved": True}),
    ]


def test_results_go_to_the_model_in_call_order_whatever_order_they_were_stored_in() -> None:
    from actors.core.approval_steps import call_ordered, open_calls
    from messages import ChatMessage, ToolCall

    ask = ChatMessage(role="user", content="go")
    answer = ChatMessage(
        role="assistant", tool_calls=(ToolCall(1, "deploy", "{}"), ToolCall(2, "status", "{}"))
    )
    two = ChatMessage(role="tool", content="green", tool_call_id=2)
    one = ChatMessage(role="tool", content="deployed", tool_call_id=1)
    stored = (ask, answer, two, one)
    assert call_ordered(stored) == (ask, answer, one, two)
    in_order = (ask, answer, one, two)
    assert call_ordered(in_order) is in_order  # nothing copied in the usual case
    # What a resumed turn continues: the calls without a result, and where the turn began.
    calls_left, start = open_calls((ask, answer, two))
    assert ([c.id for c in calls_left], start) == ([1], 0)
    assert open_calls(in_order) == ([], 0)


@pytest.mark.skipif(
    os.environ.get("LOOPD_CLUSTER_TESTS") != "1", reason="PostgreSQL runs in tox -e cluster"
)
def test_the_cli_refuses_a_decision_behind_a_runtime_on_a_shared_store(
    loopd_runtime, loopd_config, pg_database, tmp_path: Path, capsys
) -> None:
    from actors.core.config import StoreConfig
    from actors.shells.cli import main

    ran.clear()
    url = pg_database()
    rt = loopd_runtime(
        deploy_script,
        tools=[deploy, status],
        config=loopd_config.replace(store=StoreConfig(url=url)),
    )
    events = Events(rt)
    rt.send_turn("s", "ship it")
    events.wait(requested())
    # Another process's view of the same store: the CLI with its own config file.
    path = tmp_path / "shell.toml"
    path.write_text(f'home = "{tmp_path / "shell"}"\n\n[store]\nurl = "{url}"\n')
    assert main(["approve", "s", "1", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "session s is run by another loopd process now" in err
    assert "docs/runbook.md#approval-held-elsewhere" in err
    assert [r.call_id for r in rt.pending_approvals()] == [1]  # nothing was decided behind it
    assert isinstance(rt.approve("s", 1), ApprovalSettled)
    assert events.wait(ended()).completed
    assert ran == ["prod"]


@pytest.mark.skipif(
    os.environ.get("LOOPD_CLUSTER_TESTS") != "1", reason="PostgreSQL runs in tox -e cluster"
)
def test_the_cli_says_a_decision_on_a_shared_store_can_be_overtaken(
    loopd_runtime, loopd_config, pg_database, tmp_path: Path, capsys
) -> None:
    # A runtime holding the session with no actor takes no lock the CLI could see: the CLI
    # records the decision but does not promise it is the one carried out.
    from actors.core.config import StoreConfig
    from actors.shells.cli import main

    url = pg_database()
    rt = loopd_runtime(
        deploy_script,
        tools=[deploy, status],
        config=loopd_config.replace(store=StoreConfig(url=url)),
    )
    events = Events(rt)
    rt.send_turn("s", "ship it")
    events.wait(requested())
    rt.stop()
    path = tmp_path / "shell.toml"
    path.write_text(f'home = "{tmp_path / "shell"}"\n\n[store]\nurl = "{url}"\n')
    capsys.readouterr()
    assert main(["approve", "s", "1", "--config", str(path)]) == 0
    said = capsys.readouterr().out
    assert said.startswith("call 1 of session s approved; its turn resumes at the next start (")
    assert "does not see this decision" in said and "#approval-held-elsewhere)" in said


# A call is checked first: arguments a port tool's schema refuses are denied, nobody is asked.


@port_tool(
    name="release",
    parameters={
        "type": "object",
        "properties": {"service": {"type": "string"}},
        "required": ["service"],
        "additionalProperties": False,
    },
    approval=True,
)
def release(args: dict[str, Any]) -> str:
    ran.append(f"release {args}")
    return "released"


def _restart(args: dict[str, Any]) -> str:
    ran.append(f"restart {args}")
    return "restarted"


# A plain PortTool with a hand-written schema, made to wait by [approvals] tools.
restart = PortTool(
    ToolSpec(
        "restart",
        "Restart a service.",
        {"type": "object", "properties": {"service": {"type": "string"}}, "required": ["service"]},
    ),
    _restart,
)


def bad_arguments_script(request: ModelRequest) -> Any:
    if request.messages[-1].role == "user":
        return calls(
            ("release", {}),  # service is required
            ("deploy", {}),  # @port_tool(approval=True): env is required
            ("deploy", {"env": 3}),
            ("restart", {"service": 1}),  # [approvals] tools names it
            ("call_tool", {"name": "deploy", "arguments": {"where": "prod"}}),
            ("release", {"service": "api"}),  # valid: this one waits
        )
    return reply(tool_texts(request))


def test_arguments_the_schema_refuses_are_denied_at_once_and_nobody_is_asked(
    loopd_runtime,
) -> None:
    ran.clear()
    rt = loopd_runtime(
        bad_arguments_script,
        tools=[release, deploy, restart],
        approvals={"tools": ["restart", "call_tool"]},
    )
    events = Events(rt)
    rt.send_turn("s", "go")
    request = events.wait(requested())
    assert (request.call_id, request.tool) == (6, "release")  # the only one asked
    assert [r.call_id for r in rt.pending_approvals()] == [6]
    assert isinstance(rt.approve("s", 6), ApprovalSettled)
    assert events.wait(ended()).completed
    texts = [m.content for m in rt_history(rt, "s") if m.role == "tool"]
    bad = "Denied: the arguments are not valid for this tool: "
    assert texts == [
        bad + "'service' is a required property.",
        bad + "env is required.",
        bad + "env: expected `str`, got `int`.",
        bad + "service: 1 is not of type 'string'.",
        bad + "unknown field: where.",
        "released",
    ]
    assert ran == ["release {'service': 'api'}"]
    assert [e.call_id for e in events.seen if isinstance(e, ApprovalRequested)] == [6]


# Patterns: a name ending in '*' is a prefix, '*' alone every tool, the clock included.


def clock_script(request: ModelRequest) -> Any:
    if request.messages[-1].role == "user":
        return calls(("clock", {}), ("call_tool", {"name": "clock"}))
    return reply(tool_texts(request))


@pytest.mark.parametrize("pattern", ["*", "clock*", "c*", "clock"])
def test_a_pattern_that_names_the_clock_makes_it_wait(loopd_runtime, pattern: str) -> None:
    rt = loopd_runtime(clock_script, approvals={"tools": [pattern]})
    events = Events(rt)
    rt.send_turn("s", "time?")
    events.wait(lambda e: isinstance(e, ApprovalRequested) and e.call_id == 2)
    assert [(r.call_id, r.tool) for r in rt.pending_approvals()] == [(1, "clock"), (2, "call_tool")]
    assert isinstance(rt.approve("s", 1), ApprovalSettled)
    assert isinstance(rt.deny("s", 2, "no"), ApprovalSettled)
    assert events.wait(ended()).completed
    texts = [m.content for m in rt_history(rt, "s") if m.role == "tool"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", texts[0]), texts
    assert texts[1] == "Denied: a person declined this call: no."


def test_a_clock_call_waiting_at_a_stop_is_answered_when_approved_after_the_start(
    loopd_runtime,
) -> None:
    rt = loopd_runtime(clock_script, approvals={"tools": ["clock"]})
    events = Events(rt)
    rt.send_turn("s", "time?")
    events.wait(lambda e: isinstance(e, ApprovalRequested) and e.call_id == 1)
    rt.stop()
    again = loopd_runtime(clock_script, config=rt.config, approvals={"tools": ["clock"]})
    later = Events(again)
    # call_tool(clock) waits too: the tool it routes to is listed.
    assert [r.call_id for r in again.pending_approvals()] == [1, 2]
    assert isinstance(again.approve("s", 1), ApprovalSettled)
    assert isinstance(again.deny("s", 2, "once is enough"), ApprovalSettled)
    assert later.wait(ended()).completed
    texts = [m.content for m in rt_history(again, "s") if m.role == "tool"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", texts[0]), texts
    assert texts[1] == "Denied: a person declined this call: once is enough."
