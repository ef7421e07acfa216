"""Port tools that run long: the time limit answers for them, and cancel reaches them."""

from __future__ import annotations

import threading
from typing import Any

from actors.services.pool import IdleQueue
from actors.testing import Probe
from actors.testing.script import call, reply
from actors.tools.tool import PortTool, ToolContext
from actors.tools.typed import port_tool
from messages import FailReason, ModelRequest, ToolResult, ToolSpec, TurnCompleted, TurnFailed

WAIT = 10.0


def calls_then_echoes(tool: str):
    def script(request: ModelRequest) -> Any:
        if request.messages[-1].role == "user":
            return call(tool)
        return reply(request.messages[-1].content or "")

    return script


class Stubborn:
    """A tool that runs until it is told to stop, and says what it saw."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.told_to_stop = threading.Event()
        self.context: ToolContext | None = None

    def tool(self) -> PortTool:
        @port_tool("stubborn", "Runs until told to stop.")
        def stubborn(args: dict[str, Any], ctx: ToolContext) -> str:
            self.context = ctx
            self.started.set()
            if ctx.cancelled.wait(WAIT):
                self.told_to_stop.set()
            return "finished after all"

        return stubborn


def test_a_call_past_port_timeout_is_answered_and_the_turn_goes_on(loopd_runtime) -> None:
    stubborn = Stubborn()
    rt = loopd_runtime(
        calls_then_echoes("stubborn"), tools=[stubborn.tool()], port={"timeout_s": 0.2}
    )
    outcome = rt.run_turn("s", "go", timeout=WAIT)
    assert outcome == TurnCompleted(
        "s",
        "Error: the tool stubborn did not finish within port.timeout_s (0.2 s); "
        "it was told to stop",
    )
    assert stubborn.told_to_stop.wait(WAIT)
    assert stubborn.context is not None and stubborn.context.deadline is not None
    assert (stubborn.context.session, stubborn.context.call_id) == ("s", 1)


def test_a_tool_learns_that_its_turn_was_cancelled(loopd_runtime) -> None:
    stubborn = Stubborn()
    rt = loopd_runtime(calls_then_echoes("stubborn"), tools=[stubborn.tool()])
    probe = Probe.start(rt.directory)
    rt.send_turn("s", "go", reply_to=probe.address)
    assert stubborn.started.wait(WAIT)
    assert rt.cancel("s") == ("s",)
    assert probe.expect(TurnFailed, timeout=WAIT).reason is FailReason.CANCELLED
    assert stubborn.told_to_stop.wait(WAIT)
    assert stubborn.context is not None and stubborn.context.deadline is None
    probe.stop()


def test_a_tool_without_a_context_parameter_runs_as_before() -> None:
    @port_tool("plain", "No context.")
    def plain(args: dict[str, Any]) -> str:
        return f"got {sorted(args)}"

    assert plain.run(3, '{"a": 1}') == ToolResult(3, "got ['a']")


def test_a_queued_call_can_be_withdrawn() -> None:
    queue = IdleQueue(1)
    assert queue.submit("a") == (0, "a")
    assert queue.submit("b") is None
    assert queue.submit("c") is None
    assert queue.withdraw(lambda job: job == "b") == "b"
    assert queue.withdraw(lambda job: job == "b") is None
    assert queue.free(0) == (0, "c")


def test_a_tool_may_be_any_callable_object() -> None:
    class Counter:
        """Unhashable (it defines __eq__), as a dataclass instance would be."""

        def __eq__(self, other: object) -> bool:
            return self is other

        __hash__ = None  # type: ignore[assignment]

        def __call__(self, args: dict[str, Any], ctx: ToolContext) -> str:
            return f"call {ctx.call_id}"

    tool = PortTool(ToolSpec("count", "Counts.", {}), Counter())
    assert tool.run(7, "{}", ToolContext("s", 7)) == ToolResult(7, "call 7")
