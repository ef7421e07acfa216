"""Port tools that run long: the time limit answers for them, and cancel reaches them."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest

from actors.dispatcher.directory import Directory
from actors.services.pool import IdleQueue, PortRouter
from actors.shells.render import render_event
from actors.testing import Probe, ScriptedModel
from actors.testing.script import call, reply
from actors.tools.loader import load_tools
from actors.tools.tool import PortTool, ToolContext, port_error
from actors.tools.typed import port_tool
from messages import (
    FailReason,
    ModelRequest,
    PortCall,
    ToolCallFinished,
    ToolDone,
    ToolResult,
    ToolSpec,
    ToolWorkerLost,
    TurnCompleted,
    TurnEvent,
    TurnFailed,
)

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


# --- a tool's SystemExit is its own failure (issue 19, A3) ----------------------------------


def _exiting_tool(kind: str, exc: BaseException) -> PortTool:
    """The tool ``bye`` of each kind a user can write, raising ``exc``."""
    if kind == "typed":

        @port_tool
        def bye() -> str:
            """Exits."""
            raise exc

        return bye
    if kind == "typed-async":

        @port_tool(name="bye")
        async def bye_async() -> str:
            """Exits."""
            raise exc

        return bye_async
    if kind == "dict":

        @port_tool("bye", "Exits.")
        def bye_dict(args: dict[str, Any]) -> str:
            raise exc

        return bye_dict

    @port_tool("bye", "Exits.", {"type": "object", "properties": {}})
    async def bye_dict_async(args):
        raise exc

    return bye_dict_async


def _says(exc: BaseException) -> str:
    detail = f": {exc}" if str(exc) else ""
    return f"Error: the tool bye failed: {type(exc).__name__}{detail}"


def _echo_tool_results(request: ModelRequest) -> Any:
    last = request.messages[-1]
    if last.role == "user":
        return call("bye") if last.content == "go" else reply("still here")
    return reply(last.content or "")


@pytest.mark.parametrize("kind", ["typed", "typed-async", "dict", "dict-async"])
@pytest.mark.parametrize(
    "exc",
    [SystemExit(2), KeyboardInterrupt(), GeneratorExit("closed")],
    ids=["SystemExit", "KeyboardInterrupt", "GeneratorExit"],
)
def test_a_tool_that_exits_fails_its_call_and_the_runtime_goes_on(
    loopd_runtime, probe, kind: str, exc: BaseException
) -> None:
    """``sys.exit()`` or argparse's exit in a tool used to stop every actor of the runtime (and
    an async tool's ended the port's loop): now it is the call's error text, as any exception."""
    rt = loopd_runtime(_echo_tool_results, tools=[_exiting_tool(kind, exc)])
    events = probe(rt.directory)
    rt.subscribe(events.tell)
    assert rt.run_turn("s", "go", timeout=5) == TurnCompleted("s", _says(exc))
    finished = events.expect(ToolCallFinished, timeout=WAIT)
    assert (finished.session, finished.call_id, finished.name) == ("s", 1, "bye")
    # The runtime did not stop: the same tool again, and another session, both answered.
    assert rt.run_turn("s", "go", timeout=5) == TurnCompleted("s", _says(exc))
    assert rt.run_turn("t", "again", timeout=5) == TurnCompleted("t", "still here")


# --- stuck workers are replaced (issue 19, A5) -----------------------------------------------


class LogSeen(logging.Handler):
    """Sets ``seen`` when a record whose message contains ``text`` is logged."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.DEBUG)
        self.text = text
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


def test_workers_stuck_past_port_timeout_are_replaced_so_later_calls_still_run(
    loopd_runtime, probe, caplog
) -> None:
    """One worker, a tool that ignores ``ctx.cancelled``: each stuck call used to keep the
    worker, so the next call waited for ever. Now the worker is replaced, announced with
    ``ToolWorkerLost`` and counted, and the abandoned thread is stopped once it returns."""
    release = threading.Event()

    @port_tool
    def stuck(n: int) -> str:
        """Hangs, and does not listen."""
        release.wait(30)
        return "late"

    @port_tool
    def quick() -> str:
        """Answers at once."""
        return "quick!"

    model = ScriptedModel([call("stuck", n=1), call("stuck", n=2), call("quick"), reply("done")])
    rt = loopd_runtime(model=model, tools=[stuck, quick], port={"concurrency": 1, "timeout_s": 0.1})
    events = probe(rt.directory)
    rt.subscribe(events.tell)
    came_back = LogSeen("returned after its worker was replaced (0 tool threads still stuck)")
    caplog.set_level(logging.INFO, logger="actors.services.pool")
    logging.getLogger("actors.services.pool").addHandler(came_back)
    try:
        assert rt.run_turn("s", "go", timeout=5) == TurnCompleted("s", "done")
        timed_out = (
            "Error: the tool stuck did not finish within port.timeout_s (0.1 s); "
            "it was told to stop"
        )
        assert [r.messages[-1].content for r in model.requests[1:]] == [
            timed_out,
            timed_out,
            "quick!",
        ]
        lost = [events.expect(ToolWorkerLost, timeout=WAIT) for _ in range(2)]
        assert [(e.session, e.call_id, e.name, e.stuck) for e in lost] == [
            ("s", 1, "stuck", 1),
            ("s", 2, "stuck", 2),
        ]
        assert render_event(lost[0]).endswith(
            "s    call 1 stuck did not stop: worker replaced (1 stuck)"
        )
        release.set()  # both abandoned threads return now, and are stopped
        assert came_back.seen.wait(WAIT)
    finally:
        release.set()
        logging.getLogger("actors.services.pool").removeHandler(came_back)


def test_a_cancelled_call_whose_tool_ignores_it_frees_its_worker(loopd_runtime, probe) -> None:
    """Without ``port.timeout_s``, a cancelled turn's tool that never returns held its worker
    for ever; it is replaced after the grace too."""
    release = threading.Event()
    started = threading.Event()

    @port_tool
    def stuck() -> str:
        """Hangs, and does not listen."""
        started.set()
        release.wait(30)
        return "late"

    @port_tool
    def quick() -> str:
        """Answers at once."""
        return "quick!"

    model = ScriptedModel(
        lambda request: (
            call("stuck")
            if request.messages[-1].content == "hang"
            else (call("quick") if request.messages[-1].role == "user" else reply("ok"))
        )
    )
    rt = loopd_runtime(model=model, tools=[stuck, quick], port={"concurrency": 1})
    events = probe(rt.directory)
    rt.subscribe(events.tell)
    try:
        rt.send_turn("s", "hang")
        assert started.wait(WAIT)
        assert rt.cancel("s") == ("s",)
        assert rt.run_turn("t", "go", timeout=5) == TurnCompleted("t", "ok")
        assert model.requests[-1].messages[-1].content == "quick!"
        lost = events.expect(ToolWorkerLost, timeout=WAIT)
        assert (lost.session, lost.call_id, lost.name, lost.stuck) == ("s", 1, "stuck", 1)
    finally:
        release.set()


def test_tool_worker_lost_round_trips_and_is_a_turn_event() -> None:
    event = ToolWorkerLost(session="s", call_id=3, name="stuck", stuck=2)
    for codec in (msgspec.json, msgspec.msgpack):
        assert codec.decode(codec.encode(event), type=TurnEvent) == event
    assert msgspec.json.decode(msgspec.json.encode(event))["type"] == "ToolWorkerLost"


# --- --tools finds a module in the working folder (issue 19, B7) ----------------------------

NOTES_TOOL = '''
from actors import port_tool

@port_tool
def note(text: str) -> str:
    """Take a note."""
    return "noted: " + text

TOOLS = [note]
'''


def _loopd_script() -> list[str]:
    """The installed ``loopd`` command, as a user runs it: its ``sys.path`` starts at its bin
    folder, not the working folder (``python -P -m`` where the script is missing)."""
    script = Path(sys.executable).with_name("loopd")
    if script.exists():
        return [sys.executable, str(script)]
    return [sys.executable, "-P", "-m", "actors.shells.cli"]


def test_tools_flag_imports_a_module_from_the_working_folder(tmp_path: Path, chat_server) -> None:
    (tmp_path / "notes_tool.py").write_text(NOTES_TOOL)
    server = chat_server([call("note", text="buy milk"), reply("done")])
    root = str(Path(__file__).resolve().parent.parent)  # this checkout's actors, not another
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    env.update(HOME=str(tmp_path), PYTHONPATH=root)
    done = subprocess.run(
        [
            *_loopd_script(),
            "run",
            "-q",
            "--base-url",
            server.base_url,
            "--tools",
            "notes_tool:TOOLS",
            "note it",
        ],
        cwd=tmp_path,
        env=env,
        timeout=60,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done"
    assert server.requests[1]["messages"][-1]["content"] == "noted: buy milk"


def test_a_tools_module_that_breaks_while_loading_is_named_and_the_path_restored(
    tmp_path: Path, monkeypatch
) -> None:
    (tmp_path / "broken_tool.py").write_text("def (:\n")
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    with pytest.raises(ValueError, match="cannot import broken_tool: SyntaxError"):
        load_tools(["broken_tool:TOOLS"])
    assert sys.path == before


@pytest.mark.parametrize("sync", [True, False], ids=["worker", "async-job"])
def test_a_port_handler_that_exits_is_answered_and_the_pool_goes_on(probe, sync: bool) -> None:
    """Below the tools, the pool itself: a handler (or async job) that raises ``SystemExit``
    is answered with the error text, and the pool keeps serving."""
    directory = Directory()
    answers = probe(directory)

    def handler(job: PortCall, ticket: Any) -> ToolDone:
        if job.arguments == "exit":
            raise SystemExit(3)
        return ToolDone(job.session, ToolResult(job.call_id, "fine"))

    async def run_async(job: PortCall, ticket: Any) -> ToolDone:
        return handler(job, ticket)

    router = PortRouter.start(
        1,
        handler if sync else (lambda job, ticket: None),
        port_error,
        directory,
        async_job=None if sync else (lambda job, ticket: run_async(job, ticket)),
    )
    try:
        for call_id, arguments in ((1, "exit"), (2, "{}")):
            router.tell(PortCall("s", call_id, "x", arguments, answers.address))
        first, second = (answers.expect(ToolDone, timeout=WAIT) for _ in range(2))
        assert first.result == ToolResult(1, "Error: the tool x failed: SystemExit: 3")
        assert second.result == ToolResult(2, "fine")
    finally:
        router.stop()
