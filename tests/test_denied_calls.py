"""Every denied call is published as denied, wherever it was denied: in the session, in the
Context, or at the port (issue 19, B8). The model is told ``Denied: ...``; the event and the
CLI's live line say so too."""

from __future__ import annotations

import threading
from typing import Any

from actors import port_tool
from actors.shells.render import render_event
from actors.testing import call, calls, reply
from messages import ModelRequest, ToolCallFinished, TurnCompleted

WAIT = 10.0


def finished_calls(rt: Any, count: int) -> tuple[list[ToolCallFinished], threading.Event]:
    seen: list[ToolCallFinished] = []
    enough = threading.Event()

    def on_event(event: Any) -> None:
        if isinstance(event, ToolCallFinished) and event.session == "s":
            seen.append(event)
            if len(seen) >= count:
                enough.set()

    rt.subscribe(on_event)
    return seen, enough


def tool_texts(request: ModelRequest) -> str:
    return "\n".join(m.content or "" for m in request.messages if m.role == "tool")


def test_a_subagent_call_the_context_denies_is_published_denied(loopd_runtime) -> None:
    def script(request: ModelRequest):
        last = request.messages[-1]
        if request.session != "s":
            return reply("child done")
        if last.role == "user":
            return calls(("subagent", {"task": "a"}), ("subagent", {"task": "b"}))
        return reply(tool_texts(request))

    # One child at a time in the whole runtime: the second call is refused by the Context.
    rt = loopd_runtime(script, loop={"max_children_total": 1})
    seen, enough = finished_calls(rt, 2)
    outcome = rt.run_turn("s", "go", timeout=WAIT)
    assert isinstance(outcome, TurnCompleted)
    assert "Denied: " in outcome.content
    assert enough.wait(WAIT)
    by_call = {e.call_id: e for e in seen}
    assert by_call[1].denied is False  # the child ran
    assert by_call[2].denied is True
    assert render_event(by_call[2]).endswith("call 2 subagent denied")


def test_a_port_tool_called_with_bad_arguments_is_published_denied(loopd_runtime) -> None:
    @port_tool
    def lookup(word: str) -> str:
        """Look a word up.

        Args:
            word: The word.
        """
        return f"{word}: found"

    def script(request: ModelRequest):
        if request.messages[-1].role == "user":
            return calls(("lookup", {"word": 7}), ("lookup", {"word": "tea"}))
        return reply(tool_texts(request))

    rt = loopd_runtime(script, tools=[lookup])
    seen, enough = finished_calls(rt, 2)
    outcome = rt.run_turn("s", "go", timeout=WAIT)
    assert isinstance(outcome, TurnCompleted)
    denial, found = outcome.content.splitlines()
    assert denial.startswith("Denied: the arguments are not valid for this tool:")
    assert found == "tea: found"
    assert enough.wait(WAIT)
    by_call = {e.call_id: e for e in seen}
    assert (by_call[1].denied, by_call[2].denied) == (True, False)
    assert render_event(by_call[1]).endswith("call 1 lookup denied")
    assert render_event(by_call[2]).endswith("call 2 lookup done")


def test_a_plain_port_tool_given_no_json_object_is_published_denied(loopd_runtime) -> None:
    from actors.tools.tool import PortTool
    from messages import ToolSpec

    echo = PortTool(ToolSpec("echo", "Echoes.", {"type": "object"}), lambda args: str(args))

    def script(request: ModelRequest):
        if request.messages[-1].role == "user":
            return call("echo", "[1, 2]")
        return reply(tool_texts(request))

    rt = loopd_runtime(script, tools=[echo])
    seen, enough = finished_calls(rt, 1)
    outcome = rt.run_turn("s", "go", timeout=WAIT)
    assert isinstance(outcome, TurnCompleted)
    assert outcome.content.startswith("Denied: the arguments are not valid for this tool:")
    assert enough.wait(WAIT)
    (finished,) = seen
    assert finished.denied is True
