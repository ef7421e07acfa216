"""Passivation: an idle top-level session's actor stops, and its next turn finds it unchanged."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from actors import Config, Runtime
from actors.core.passivation import IdleSessions
from actors.testing import Probe, ScriptedModel, call, reply
from actors.tools.tool import ToolOutput
from actors.tools.typed import port_tool
from messages import (
    Inspect,
    ModelRequest,
    ScheduledTurn,
    Tick,
    TurnCompleted,
)

WAIT = 10.0
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)

# --- the decision alone ------------------------------------------------------------------------


def test_the_least_recently_used_idle_sessions_go_first_when_too_many_are_live() -> None:
    idle = IdleSessions(idle_s=0, max_live=3)
    for i, session in enumerate(["a", "b", "c", "d"]):
        idle.idle(session, float(i))
    idle.idle("a", 10.0)  # used again: now the most recent
    assert idle.order() == ("b", "c", "d", "a")
    assert idle.over_limit(live=3) == []
    assert idle.over_limit(live=5) == ["b", "c"]
    assert idle.order() == ("d", "a")  # the chosen ones are forgotten


def test_a_held_session_is_never_a_candidate() -> None:
    idle = IdleSessions(idle_s=5, max_live=1)
    idle.idle("held", 0.0)
    idle.idle("free", 1.0)
    idle.busy("held")  # a turn holds it again
    assert idle.over_limit(live=10) == ["free"]  # only one candidate, whatever the excess
    assert idle.expired(now=100.0) == []
    assert "held" not in idle and len(idle) == 0


def test_idle_sessions_expire_after_idle_s_and_not_before() -> None:
    idle = IdleSessions(idle_s=600, max_live=0)
    idle.idle("early", 0.0)
    idle.idle("late", 100.0)
    assert idle.expired(now=599.9) == []
    assert idle.expired(now=600.0) == ["early"]
    assert idle.expired(now=699.9) == []
    assert idle.expired(now=700.0) == ["late"]
    assert idle.over_limit(live=1_000_000) == []  # max_live 0: no limit


def test_zero_turns_each_limit_off_and_negatives_are_refused() -> None:
    idle = IdleSessions(idle_s=0, max_live=0)
    idle.idle("s", 0.0)
    assert idle.expired(now=1e12) == [] and idle.over_limit(live=10**9) == []
    with pytest.raises(ValueError, match="idle_s and max_live must be >= 0"):
        IdleSessions(idle_s=-1, max_live=0)


# --- the runtime -------------------------------------------------------------------------------


class Clock:
    """A wall clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def start(tmp_path) -> Iterator[Callable[..., tuple[Runtime, ScriptedModel]]]:
    started: list[Runtime] = []

    def start_runtime(
        script: Any, *, clock: Clock | None = None, tools: Any = None, **sessions: Any
    ) -> tuple[Runtime, ScriptedModel]:
        config = Config(home=str(tmp_path / f"home{len(started)}"))  # one runtime per home
        config = config.replace(sessions=msgspec.structs.replace(config.sessions, **sessions))
        model = ScriptedModel(script)
        rt = Runtime.start(config, model=model, tools=tools, clock=clock or Clock())
        started.append(rt)
        return rt, model

    yield start_runtime
    for rt in started:
        rt.stop()


def wait_stopped(rt: Runtime, session: str) -> None:
    """Wait until ``session``'s actor has stopped (passivation stops it without waiting)."""
    ref = rt.directory.get(f"session:{session}")
    if ref is not None:
        assert ref.actor_stopped.wait(WAIT), f"{session}'s actor did not stop"  # type: ignore[attr-defined]


@port_tool("fetch", "Fetch a web page.", untrusted=True)
def fetch(args: dict[str, Any]) -> ToolOutput:
    return ToolOutput("<html>a page from the web</html>")


def two_turns(request: ModelRequest) -> Any:
    """Turn one fetches (untrusted) and answers; turn two asks to remember and answers."""
    last = request.messages[-1]
    if last.role == "user":
        return call("fetch", url="x") if last.content == "one" else call("remember", text="hi")
    return reply(f"after {last.content}")


def test_a_passivated_session_continues_as_if_it_had_stayed_live(start) -> None:
    clock = Clock()
    rt, model = start(two_turns, clock=clock, tools=[fetch])
    assert rt.run_turn("s", "one", timeout=WAIT) == TurnCompleted(
        "s", "after <html>a page from the web</html>"
    )
    before = rt.directory.get("session:s").ask(Inspect(), timeout=WAIT)  # type: ignore[union-attr]
    assert before.untrusted and before.next_call_id == 2

    clock.now = T0 + timedelta(seconds=600)
    rt.context.tell(Tick())  # what the sweep's timer tells; the clock says 600 s idle
    wait_stopped(rt, "s")
    assert rt.live() == ()

    outcome = rt.run_turn("s", "two", timeout=WAIT)
    # The rebuilt session is still untrusted, so the model sees remember refused.
    assert isinstance(outcome, TurnCompleted) and "may not write to memory" in outcome.content
    assert rt.live() == ("s",)
    last_of_one, first_of_two = model.requests[1], model.requests[2]
    # The same history: turn two's prompt is turn one's, extended (the server's cache holds).
    assert first_of_two.messages[: len(last_of_one.messages)] == last_of_one.messages
    assert [m.role for m in first_of_two.messages[len(last_of_one.messages) :]] == [
        "assistant",
        "user",
    ]
    assert (first_of_two.slot, first_of_two.session) == (last_of_one.slot, "s")
    # Call ids go on: fetch was 1, remember is 2.
    assert model.requests[3].messages[-2].tool_calls[0].id == 2
    after = rt.directory.get("session:s").ask(Inspect(), timeout=WAIT)  # type: ignore[union-attr]
    assert (after.turns, after.next_call_id, after.untrusted) == (2, 3, True)


def test_a_session_stays_live_until_idle_s_and_zero_never_passivates(start) -> None:
    clock = Clock()
    rt, _ = start([reply("a"), reply("b")], clock=clock, idle_s=600)
    rt.run_turn("s", "hi", timeout=WAIT)
    rt.context.tell(Tick(now=T0 + timedelta(seconds=599)))
    assert rt.live() == ("s",)
    rt.context.tell(Tick(now=T0 + timedelta(seconds=600)))
    assert rt.live() == ()

    off, _ = start([reply("a")], clock=clock, idle_s=0)
    off.run_turn("t", "hi", timeout=WAIT)
    off.context.tell(Tick(now=T0 + timedelta(days=365)))
    assert off.live() == ("t",)


def test_the_sweep_runs_by_itself_on_the_dispatchers_timer(start) -> None:
    rt, _ = start([reply("a")], clock=lambda: datetime.now(UTC), idle_s=0.05)
    rt.run_turn("s", "hi", timeout=WAIT)
    wait_stopped(rt, "s")  # nobody told a Tick: the timer did
    assert rt.live() == ()


def test_past_max_live_the_least_recently_used_idle_session_goes(start) -> None:
    clock = Clock()
    rt, _ = start(lambda r: reply(f"hi {r.session}"), clock=clock, idle_s=0, max_live=2)
    for i, session in enumerate(["a", "b"]):
        clock.now = T0 + timedelta(seconds=i)
        rt.run_turn(session, "hi", timeout=WAIT)
    assert rt.live() == ("a", "b")
    clock.now = T0 + timedelta(seconds=2)
    rt.run_turn("c", "hi", timeout=WAIT)
    assert rt.live() == ("b", "c")  # a was the least recently used
    clock.now = T0 + timedelta(seconds=3)
    rt.run_turn("b", "again", timeout=WAIT)  # b is used again...
    rt.run_turn("d", "hi", timeout=WAIT)  # ...so c goes, not b
    assert rt.live() == ("b", "d")
    # A passivated session comes back with its history.
    assert rt.run_turn("a", "back", timeout=WAIT) == TurnCompleted("a", "hi a")
    record = rt.directory.get("session:a").ask(Inspect(), timeout=WAIT)  # type: ignore[union-attr]
    assert [m.content for m in record.transcript] == ["hi", "hi a", "back", "hi a"]


def test_a_held_session_is_never_passivated(start, caplog) -> None:
    clock = Clock()
    entered, release = threading.Event(), threading.Event()

    def script(request: ModelRequest) -> Any:
        if request.messages[-1].content == "take your time":
            entered.set()
            assert release.wait(WAIT)
        return reply(f"done {request.session}")

    rt, _ = start(script, clock=clock, idle_s=60, max_live=1)
    rt.run_turn("slow", "warm up", timeout=WAIT)  # slow is live and idle: a candidate...
    waiter = Probe.start(rt.directory)
    rt.send_turn("slow", "take your time", reply_to=waiter.address)  # ...until held again
    assert entered.wait(WAIT)
    rt.run_turn("quick", "hi", timeout=WAIT)  # 2 live > max_live 1, but slow is held
    assert rt.live() == ("quick", "slow")
    rt.context.tell(Tick(now=T0 + timedelta(hours=1)))
    assert rt.live() == ("slow",)  # idle quick went; held slow stays
    release.set()
    assert waiter.expect(TurnCompleted) == TurnCompleted("slow", "done slow")
    assert "not passivated" not in caplog.text  # never even chosen, not just refused
    waiter.stop()


def test_a_scheduled_turn_on_a_passivated_session_runs(start) -> None:
    clock = Clock()
    rt, model = start([reply("first"), reply("scheduled")], clock=clock)
    rt.run_turn("job", "hello", timeout=WAIT)
    rt.context.tell(Tick(now=T0 + timedelta(hours=1)))
    assert rt.live() == ()
    waiter = Probe.start(rt.directory)
    rt.context.tell(ScheduledTurn("heartbeat:job", "job", "wake up", waiter.address))
    assert waiter.expect(TurnCompleted) == TurnCompleted("job", "scheduled")
    assert [m.content for m in model.requests[1].messages[1:]] == ["hello", "first", "wake up"]
    waiter.stop()
