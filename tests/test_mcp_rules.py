"""MCP tools under loopd's other rules, with the real test server (tests/mcp_servers): a
person approves or declines their calls (``[approvals] tools``), and a tool denied to untrusted
sessions (``[mcp.NAME] deny_untrusted``) is denied once another MCP result tainted the session."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from approval_kit import Events, requested
from mcp_helpers import WAIT, LogWatch, calls_what_it_is_told, stdio

from actors import Config, Runtime
from actors.core.config import AgentConfig
from actors.core.mcp_config import McpServerConfig
from actors.testing import Probe, ScriptedModel
from messages import ApprovalSettled, TurnCompleted

pytestmark = pytest.mark.timeout(60)


def start(home: Path, mcp: dict[str, McpServerConfig], **config: Any) -> Runtime:
    model = ScriptedModel(calls_what_it_is_told)
    return Runtime.start(Config(home=str(home), **config), model=model, mcp=mcp)


def text_of(rt: Runtime, session: str, text: str) -> str:
    outcome = rt.run_turn(session, text, timeout=WAIT)
    assert isinstance(outcome, TurnCompleted), outcome
    return outcome.content


@pytest.fixture
def probe() -> Any:
    """The probes :func:`answers` makes in a test, stopped at its end."""
    made: list[Probe] = []
    yield made
    for p in made:
        p.stop()


def answers(rt: Runtime, made: list[Probe]) -> Probe:
    """A probe the turns of ``rt`` answer to."""
    made.append(Probe.start(rt.directory))
    return made[-1]


def answered(probe: Probe) -> str:
    outcome = probe.expect(TurnCompleted, timeout=WAIT)
    return outcome.content


# Approvals.


def test_an_mcp_call_named_in_approvals_waits_and_runs_once_approved(tmp_path, probe) -> None:
    rt = start(tmp_path / "home", {"files": stdio()}, approvals={"tools": ["files__read"]})
    events = Events(rt)
    to = answers(rt, probe)
    try:
        with LogWatch() as log:
            rt.send_turn("s", 'files__read {"path": "plan.txt"}', reply_to=to.address)
            request = events.wait(requested("s"), timeout=WAIT)
            assert (request.tool, request.arguments) == ("files__read", '{"path": "plan.txt"}')
            assert request.untrusted is False
            assert rt.pending_approvals() == (request,)
            assert not any("read plan.txt" in line for line in log.lines)  # not sent yet
            settled = rt.approve("s", request.call_id)
            assert isinstance(settled, ApprovalSettled) and settled.approved
            assert answered(to) == "contents of plan.txt"
            log.wait_for("read plan.txt")  # the server ran it
        # A tool the list does not name runs at once.
        assert text_of(rt, "t", 'files__search {"word": "w", "limit": 1}') == "w 0"
    finally:
        rt.stop()


def test_a_server_pattern_waits_and_a_declined_call_never_reaches_the_server(
    tmp_path, probe
) -> None:
    rt = start(tmp_path / "home", {"files": stdio()}, approvals={"tools": ["files__*"]})
    events = Events(rt)
    to = answers(rt, probe)
    try:
        with LogWatch() as log:
            rt.send_turn("s", 'files__read {"path": "secret"}', reply_to=to.address)
            request = events.wait(requested("s"), timeout=WAIT)
            assert request.tool == "files__read"
            settled = rt.deny("s", request.call_id, "not that file")
            assert isinstance(settled, ApprovalSettled) and not settled.approved
            assert answered(to) == "Denied: a person declined this call: not that file."
            # A later approved call reaches the server; the declined one never did (one
            # stderr, in order).
            rt.send_turn("t", 'files__read {"path": "public"}', reply_to=to.address)
            rt.approve("t", events.wait(requested("t"), timeout=WAIT).call_id)
            assert answered(to) == "contents of public"
            log.wait_for("read public")
            assert not any("read secret" in line for line in log.lines)
    finally:
        rt.stop()


def test_call_tool_does_not_get_past_an_approval(tmp_path, probe) -> None:
    agents = {"ops": AgentConfig(approve=("files__read",))}
    rt = start(tmp_path / "home", {"files": stdio()}, agents=agents)
    events = Events(rt)
    to = answers(rt, probe)
    try:
        inner = json.dumps({"name": "files__read", "arguments": {"path": "x"}})
        rt.send_turn("s", f"call_tool {inner}", agent="ops", reply_to=to.address)
        request = events.wait(requested("s"), timeout=WAIT)
        assert (request.tool, request.arguments) == ("call_tool", inner)
        rt.approve("s", request.call_id)
        assert answered(to) == "contents of x"
    finally:
        rt.stop()


# Trust.


def test_a_tool_denied_to_untrusted_sessions_is_denied_after_an_mcp_result(tmp_path) -> None:
    files = stdio(tools=("read", "search"), deny_untrusted=("read",))
    rt = start(tmp_path / "home", {"files": files}, approvals={"tools": ["files__read"]})
    try:
        with LogWatch() as log:
            # Trusted still: the call waits for a person as listed, then runs on the server.
            to = Probe.start(rt.directory)
            events = Events(rt)
            rt.send_turn("s", 'files__read {"path": "first"}', reply_to=to.address)
            rt.approve("s", events.wait(requested("s"), timeout=WAIT).call_id)
            assert answered(to) == "contents of first"
            to.stop()
            log.wait_for("read first")
            # Untrusted now (that result): denied at once, nobody asked, nothing sent.
            assert text_of(rt, "s", 'files__read {"path": "second"}') == (
                "Denied: this session has read untrusted data: mcp.files.deny_untrusted names read."
            )
            assert rt.pending_approvals() == ()
            # Whatever its origin, the built-in remember is denied to it too.
            assert text_of(rt, "s", 'remember {"text": "x"}').startswith(
                "Denied: this session has read untrusted data: it may not write to memory"
            )
            # A tool the option does not name still runs for it; it was the next to reach
            # the server (its stderr is in order).
            assert text_of(rt, "s", 'files__search {"word": "w", "limit": 1}') == "w 0"
            rt.stop()
        assert not any("read second" in line for line in log.lines)
    finally:
        rt.stop()


def test_deny_untrusted_must_name_listed_tools() -> None:
    bad = McpServerConfig(command=("x",), tools=("read",), deny_untrusted=("write",))
    assert bad.check("files") == "mcp.files.deny_untrusted names write, which tools leaves out"
    twice = McpServerConfig(command=("x",), deny_untrusted=("w", "w"))
    assert twice.check("files") == "mcp.files.deny_untrusted names a tool twice"
    assert McpServerConfig(command=("x",), deny_untrusted=("w",)).check("files") is None
