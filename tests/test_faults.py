"""Faults get an answer, never a hang: cancellation, child time limits, fan-out and depth limits,
turns cut off mid-call, and no leaked threads."""

from __future__ import annotations

import threading

import pytest

from actors.stores.sqlite import DB_NAME, SessionStore
from actors.testing import Probe, call, calls, reply
from messages import (
    FailReason,
    Inspect,
    ModelRequest,
    SubagentFinished,
    SubagentStarted,
    TurnCompleted,
    TurnEnded,
    TurnFailed,
)

WAIT = 10.0


def tool_texts(request: ModelRequest) -> list[str]:
    return [m.content or "" for m in request.messages if m.role == "tool"]


def recursive(release: threading.Event, depth: int):
    """Each level spawns one child; the deepest waits for ``release``."""

    def script(request: ModelRequest):
        if request.messages[-1].role == "tool":
            return reply(tool_texts(request)[-1])
        if request.session.count("sub-") < depth:
            return call("subagent", task="go deeper")
        release.wait(WAIT)
        return reply("bottom")

    return script


def test_cancel_ends_a_turn_and_every_child_below_it(loopd_runtime, loopd_config) -> None:
    release = threading.Event()
    rt = loopd_runtime(recursive(release, 2))
    events = Probe.start(rt.directory)
    rt.subscribe(events.tell)
    answer = Probe.start(rt.directory)
    try:
        rt.send_turn("top", "go", reply_to=answer.address)
        # A child is told started once its first write is stored; it asks the model before.
        events.expect(lambda e: isinstance(e, SubagentStarted) and e.child == "sub-sub-top-1-1")
        rt.model.wait_for_requests(3)
        cancelled = rt.cancel("top")
        assert set(cancelled) == {"top", "sub-top-1", "sub-sub-top-1-1"}
        failed = answer.expect(TurnFailed)
        assert failed.reason is FailReason.CANCELLED
        ended = events.expect_all(
            lambda e: isinstance(e, TurnEnded) and e.reason is FailReason.CANCELLED, 3
        )
        assert {e.session for e in ended} == set(cancelled)
    finally:
        release.set()  # the deepest model answer now arrives late, and is dropped
    after = rt.run_turn("other", "still working?", timeout=WAIT)
    assert after == TurnCompleted(
        "other", "sub-other-1 completed\nsub-sub-other-1-1 completed\nbottom"
    )
    assert rt.context.ask(Inspect(), timeout=WAIT).held == ()
    assert rt.cancel("top") == ()
    rt.stop()
    # Every call got a result, so the stored transcripts stay valid for the model API.
    with SessionStore(loopd_config.home_path / DB_NAME) as store:
        top = store.open("top").transcript
        middle = store.open("sub-top-1").transcript
    assert [m.role for m in top] == ["user", "assistant", "tool"]
    assert top[-1].content == "sub-top-1 failed"
    assert middle[-1].content == "sub-sub-top-1-1 failed"
    answer.stop()
    events.stop()


def test_a_child_past_its_time_limit_fails_promptly(loopd_runtime) -> None:
    release = threading.Event()
    rt = loopd_runtime(recursive(release, 1), loop={"child_timeout_s": 0.2})
    events = Probe.start(rt.directory)
    rt.subscribe(events.tell)
    try:
        outcome = rt.run_turn("p", "go", timeout=WAIT)
        assert outcome == TurnCompleted("p", "sub-p-1 failed")
        finished = events.expect(SubagentFinished)
        assert finished.reason is FailReason.TIMEOUT
        # The child itself is cancelled, not left running.
        ended = events.expect(lambda e: isinstance(e, TurnEnded) and e.session == "sub-p-1")
        assert ended.reason is FailReason.CANCELLED
    finally:
        release.set()
    assert rt.context.ask(Inspect(), timeout=WAIT).held == ()
    events.stop()


def test_a_fan_out_past_the_limits_is_denied(loopd_runtime) -> None:
    def script(request: ModelRequest):
        if request.session.startswith("sub-"):
            return reply("ok")
        if request.messages[-1].role == "user":
            return calls(*[("subagent", {"task": f"part {i}"}) for i in range(5)])
        return reply("\n".join(tool_texts(request)))

    rt = loopd_runtime(script, loop={"max_children": 3})
    outcome = rt.run_turn("fan", "go", timeout=WAIT)
    assert isinstance(outcome, TurnCompleted)
    lines = outcome.content.split("\n")
    assert lines[:6] == [
        "sub-fan-1 completed",
        "ok",
        "sub-fan-2 completed",
        "ok",
        "sub-fan-3 completed",
        "ok",
    ]
    denial = (
        "Denied: a limit of this runtime was reached: "
        "one answer may start 3 children (loop.max_children)."
    )
    assert lines[6:] == [denial, denial]


def test_the_runtime_wide_child_limit_is_a_denial(loopd_runtime) -> None:
    release = threading.Event()

    def script(request: ModelRequest):
        if request.session.startswith("sub-"):
            release.wait(WAIT)
            return reply("ok")
        if request.messages[-1].role == "user":
            return calls(("subagent", {"task": "a"}), ("subagent", {"task": "b"}))
        return reply("\n".join(tool_texts(request)))

    rt = loopd_runtime(script, loop={"max_children_total": 2})
    events = Probe.start(rt.directory)
    rt.subscribe(events.tell)
    first = Probe.start(rt.directory)
    try:
        rt.send_turn("one", "go", reply_to=first.address)
        events.expect_all(lambda e: isinstance(e, SubagentStarted), 2)
        second = rt.run_turn("two", "go", timeout=WAIT)
    finally:
        release.set()
    denial = (
        "Denied: a limit of this runtime was reached: "
        "the runtime already runs 2 children (loop.max_children_total)."
    )
    assert second == TurnCompleted("two", f"{denial}\n{denial}")
    assert first.expect(TurnCompleted).content.startswith("sub-one-1 completed")
    first.stop()
    events.stop()


def test_recursion_stops_at_the_depth_limit(loopd_runtime) -> None:
    def script(request: ModelRequest):
        if request.messages[-1].role == "tool":
            return reply(tool_texts(request)[-1])
        return call("subagent", task="again, forever")

    rt = loopd_runtime(script, loop={"max_depth": 2})
    outcome = rt.run_turn("r", "go", timeout=WAIT)
    assert outcome == TurnCompleted(
        "r",
        "sub-r-1 completed\nsub-sub-r-1-1 completed\n"
        "Denied: a limit of this runtime was reached: "
        "sub-sub-sub-r-1-1-1 would be 3 levels deep; loop.max_depth is 2.",
    )


def test_a_turn_cut_off_mid_call_is_repaired_on_the_next_turn(loopd_runtime, loopd_config):
    # A turn left with calls but no results, as a SIGKILL mid-call leaves it in the store.
    from messages import Baseline, ChatMessage, ToolCall

    loopd_config.home_path.mkdir(parents=True)
    with SessionStore(loopd_config.home_path / DB_NAME) as store:
        store.create("s", Baseline("system"), 0)
        cut = ChatMessage(
            role="assistant",
            tool_calls=(ToolCall(1, "subagent", '{"task": "t"}'), ToolCall(2, "clock", "{}")),
        )
        store.append(
            "s",
            [ChatMessage(role="user", content="before"), cut],
            turns=1,
            next_call_id=3,
            untrusted=False,
        )
    rt = loopd_runtime([call("clock"), reply("after")])
    assert rt.run_turn("s", "again", timeout=WAIT) == TurnCompleted("s", "after")
    first = rt.model.requests[0]
    assert [(m.role, m.tool_call_id, m.content) for m in first.messages[3:]] == [
        ("tool", 1, "sub-s-1 failed"),
        ("tool", 2, "Denied: the turn ended before this call returned a result."),
        ("user", None, "again"),
    ]
    # Call ids go on after the cut-off ones: never reused.
    assert rt.model.requests[1].messages[-2].tool_calls[0].id == 3


def test_no_actor_thread_outlives_the_runtime(loopd_runtime) -> None:
    before = {t.ident for t in threading.enumerate()}
    done = threading.Event()
    done.set()
    rt = loopd_runtime(recursive(done, 0))
    for i in range(3):
        rt.run_turn(f"s{i}", "go", timeout=WAIT)
    rt.stop()
    left = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    assert left == [], f"threads left running: {[t.name for t in left]}"


@pytest.mark.parametrize("bad", ["..", "../x", "a/b", "a\x00b", "\u0430", "\uff41", "x" * 65])
def test_a_session_id_never_names_a_path(loopd_runtime, loopd_config, bad) -> None:
    rt = loopd_runtime([reply("never")])
    with pytest.raises(ValueError, match="invalid session id"):
        rt.run_turn(bad, "hi", timeout=WAIT)
    rt.stop()
    assert sorted(p.name for p in loopd_config.home_path.iterdir()) == sorted(
        p.name
        for p in loopd_config.home_path.iterdir()
        if p.name.startswith("loopd.db") or p.name == "loopd.lock"
    )


def test_sigterm_stops_loopd_run_cleanly(chat_server, tmp_path) -> None:
    import os
    import signal
    import subprocess
    import sys

    release = threading.Event()

    def script(body):
        release.wait(WAIT)
        return reply("too late")

    server = chat_server(script)
    home = tmp_path / "home"
    env = {**os.environ, "HOME": str(tmp_path)}
    command = [sys.executable, "-m", "actors.shells.cli", "run", "--home", str(home)]
    command += ["--base-url", server.base_url, "--session", "s", "hello"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        server.wait_for_requests(1, timeout=WAIT)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=WAIT)
    finally:
        release.set()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert b"Traceback" not in err
    with SessionStore(home / DB_NAME) as store:
        assert [m.content for m in store.open("s").transcript] == ["hello"]


def test_a_child_actor_that_raises_answers_its_parent_and_frees_the_hold(loopd_runtime) -> None:
    from actors.testing import Answer

    def script(request: ModelRequest):
        if request.session == "p":
            if request.messages[-1].role == "user":
                return call("subagent", task="t")
            return reply(tool_texts(request)[-1])
        # A buggy in-process model: tool_calls is not a tuple, and the child's handler raises.
        return Answer(content="broken", tool_calls=None)  # type: ignore[arg-type]

    rt = loopd_runtime(script)
    events = Probe.start(rt.directory)
    rt.subscribe(events.tell)
    assert rt.run_turn("p", "go", timeout=WAIT) == TurnCompleted("p", "sub-p-1 failed")
    finished = events.expect(SubagentFinished)
    assert finished.reason is FailReason.CRASHED
    assert rt.context.ask(Inspect(), timeout=WAIT).held == ()
    assert rt.directory.get("session:sub-p-1") is None
    # The crashed child's actor is gone: the parent's is the only live session left.
    assert rt.live() == ("p",)
    # The parent and the runtime go on.
    assert isinstance(rt.run_turn("p", "again", timeout=WAIT), TurnCompleted)
    events.stop()


class BlockingMemory:
    """A memory source whose remember() blocks the Context until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def block(self) -> str:
        return ""

    def updated(self, session: str, turns: int) -> None:
        pass

    def remember(self, line: str) -> None:
        self.entered.set()
        self.release.wait(WAIT)


def test_the_context_survives_a_child_that_died_before_its_cancel(loopd_runtime) -> None:
    from messages import CancelTurn

    memory = BlockingMemory()

    def script(request: ModelRequest):
        if request.session == "p" and request.messages[-1].role == "user":
            return call("subagent", task="t")
        if request.session == "p":
            return reply(tool_texts(request)[-1])
        return call("remember", text="x")

    rt = loopd_runtime(script, memory_source=memory)
    answer = Probe.start(rt.directory)
    try:
        rt.send_turn("p", "go", reply_to=answer.address)
        assert memory.entered.wait(WAIT)  # the Context is busy writing memory for the child
        rt.context.tell(CancelTurn("p"))
        rt.directory.get("session:sub-p-1").stop()  # dies; its news queues behind the cancel
    finally:
        memory.release.set()
    assert answer.expect(TurnFailed).reason is FailReason.CANCELLED
    assert rt.context.is_alive()
    assert rt.context.ask(Inspect(), timeout=WAIT).held == ()
    answer.stop()


def test_a_tool_that_returns_no_text_answers_an_error(loopd_runtime) -> None:
    from actors import port_tool

    @port_tool("count", "Count.")
    def count(args):
        return 42

    def script(request: ModelRequest):
        if request.messages[-1].role == "user":
            return call("count")
        return reply(tool_texts(request)[-1])

    rt = loopd_runtime(script, tools=[count])
    assert rt.run_turn("s", "go", timeout=WAIT) == TurnCompleted(
        "s", "Error: the tool count failed: TypeError: it returned int, not text"
    )


def test_calls_to_one_port_tool_run_concurrently(loopd_runtime) -> None:
    from actors import port_tool

    both = threading.Barrier(2, timeout=WAIT)

    @port_tool("slow", "Slow.")
    def slow(args):
        both.wait()  # only returns once the other call is running too
        return "done"

    def script(request: ModelRequest):
        if request.messages[-1].role == "user":
            return calls(("slow", {}), ("slow", {}))
        return reply(" ".join(tool_texts(request)))

    rt = loopd_runtime(script, tools=[slow])
    assert rt.run_turn("s", "go", timeout=WAIT) == TurnCompleted("s", "done done")


def test_stopping_the_runtime_stops_turns_rather_than_only_answering_them(
    loopd_runtime, loopd_config
) -> None:
    release = threading.Event()

    def script(request: ModelRequest):
        if request.session == "p" and request.messages[-1].role == "user":
            return call("subagent", task="t")
        if request.session == "p":
            return reply("the parent went on after the stop")
        release.wait(WAIT)
        return reply("child")

    rt = loopd_runtime(script)
    answer = Probe.start(rt.directory)
    try:
        rt.send_turn("p", "go", reply_to=answer.address)
        rt.model.wait_for_requests(2)
        rt.stop()
        assert answer.expect(TurnFailed).reason is FailReason.CANCELLED
    finally:
        release.set()
    answer.stop()
    with SessionStore(loopd_config.home_path / DB_NAME) as store:
        parent = store.open("p").transcript
    assert [(m.role, m.content) for m in parent[1:]] == [
        ("assistant", None),
        ("tool", "sub-p-1 failed"),
    ]
    assert len(rt.model.requests) == 2


def test_a_childs_finish_is_published_before_its_parent_goes_on(loopd_runtime) -> None:
    from messages import ToolCallFinished

    def script(request: ModelRequest):
        if request.session == "p" and request.messages[-1].role == "user":
            return call("subagent", task="t")
        return reply("ok")

    rt = loopd_runtime(script)
    events = Probe.start(rt.directory)
    rt.subscribe(events.tell)
    for i in range(20):
        rt.run_turn("p", f"go {i}", timeout=WAIT)
    seen = events.expect_all(
        lambda e: isinstance(e, SubagentFinished | ToolCallFinished) and e.session == "p", 40
    )
    kinds = [type(e).__name__ for e in seen]
    assert kinds == ["SubagentFinished", "ToolCallFinished"] * 20
    events.stop()
