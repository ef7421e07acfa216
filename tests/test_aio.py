"""AsyncRuntime: turns, cancellation and events from one asyncio loop, with real actors."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from actors import Config
from actors.aio import AsyncRuntime
from actors.testing import ScriptedModel, call, reply
from messages import (
    FailReason,
    ModelRequest,
    SubagentStarted,
    TurnCompleted,
    TurnEnded,
    TurnEvent,
    TurnFailed,
)

WAIT = 10.0


def config(tmp_path: Path) -> Config:
    return Config(home=str(tmp_path / "home"))


def test_many_concurrent_turns_from_one_loop_while_the_loop_stays_free(tmp_path: Path) -> None:
    """Fifty turns wait on a model that answers only when the loop itself says so: a run_turn
    that blocked the loop would never let that happen."""
    count = 50
    release = threading.Event()

    def script(request: ModelRequest):
        release.wait(WAIT)
        return reply(f"echo {request.session}")

    model = ScriptedModel(script)

    async def main() -> list[object]:
        async with AsyncRuntime.start(config(tmp_path), model=model) as rt:
            turns = [
                asyncio.create_task(rt.run_turn(f"s{i}", "hi", timeout=WAIT)) for i in range(count)
            ]
            # The loop is free while every turn waits: it hears from a thread, then releases the
            # model (its pool of 8 workers is busy by then).
            await asyncio.wait_for(asyncio.to_thread(model.wait_for_requests, 8, WAIT), WAIT)
            release.set()
            return list(await asyncio.gather(*turns))

    outcomes = asyncio.run(main())
    assert outcomes == [TurnCompleted(f"s{i}", f"echo s{i}") for i in range(count)]


def test_cancelling_the_awaiting_task_cancels_the_turn_and_its_child(tmp_path: Path) -> None:
    child_asked = threading.Event()
    release = threading.Event()

    def script(request: ModelRequest):
        if request.session == "boss":
            return call("subagent", task="dig")
        child_asked.set()
        release.wait(WAIT)
        return reply("too late")

    async def main() -> list[TurnEvent]:
        async with AsyncRuntime.start(config(tmp_path), model=ScriptedModel(script)) as rt:
            seen: list[TurnEvent] = []
            ended: set[str] = set()

            async def watch() -> None:
                async for event in rt.events("boss"):
                    seen.append(event)
                    if isinstance(event, TurnEnded):
                        ended.add(event.session)
                        if ended == {"boss", "sub-boss-1"}:
                            return

            watcher = asyncio.create_task(watch())
            await asyncio.sleep(0)  # the watcher subscribes before the turn starts
            turn = asyncio.create_task(rt.run_turn("boss", "go", timeout=WAIT))
            await asyncio.wait_for(asyncio.to_thread(child_asked.wait, WAIT), WAIT)
            turn.cancel()
            with pytest.raises(asyncio.CancelledError):
                await turn
            await asyncio.wait_for(watcher, WAIT)
            release.set()
            # The session is free again: a new turn runs.
            return seen

    try:
        seen = asyncio.run(main())
    finally:
        release.set()
    ends = {e.session: e for e in seen if isinstance(e, TurnEnded)}
    assert ends["boss"].reason is FailReason.CANCELLED
    assert ends["sub-boss-1"].reason is FailReason.CANCELLED
    assert any(isinstance(e, SubagentStarted) and e.child == "sub-boss-1" for e in seen)


def test_cancel_answers_the_cancelled_ids_and_the_waiter_sees_cancelled(tmp_path: Path) -> None:
    release = threading.Event()

    def script(request: ModelRequest):
        release.wait(WAIT)
        return reply("late")

    model = ScriptedModel(script)

    async def main() -> tuple[tuple[str, ...], object, tuple[str, ...]]:
        async with AsyncRuntime.start(config(tmp_path), model=model) as rt:
            turn = asyncio.create_task(rt.run_turn("s", "hi", timeout=WAIT))
            await asyncio.to_thread(model.wait_for_requests, 1)
            cancelled = await rt.cancel("s")
            outcome = await turn
            again = await rt.cancel("s")
            return cancelled, outcome, again

    try:
        cancelled, outcome, again = asyncio.run(main())
    finally:
        release.set()
    assert cancelled == ("s",)
    assert isinstance(outcome, TurnFailed) and outcome.reason is FailReason.CANCELLED
    assert again == ()


def test_events_of_one_session_and_the_iterator_ends_when_the_runtime_stops(
    tmp_path: Path,
) -> None:
    model = ScriptedModel([reply("one"), reply("two")])

    async def main() -> tuple[list[TurnEvent], list[TurnEvent]]:
        rt = await AsyncRuntime.start(config(tmp_path), model=model)
        only_a: list[TurnEvent] = []
        every: list[TurnEvent] = []

        async def collect(into: list[TurnEvent], session: str | None) -> None:
            async for event in rt.events(session):
                into.append(event)

        tasks = [
            asyncio.create_task(collect(only_a, "a")),
            asyncio.create_task(collect(every, None)),
        ]
        await asyncio.sleep(0)
        assert await rt.run_turn("a", "x", timeout=WAIT) == TurnCompleted("a", "one")
        assert await rt.run_turn("b", "y", timeout=WAIT) == TurnCompleted("b", "two")
        await rt.stop()
        # Both iterators end by themselves once the runtime has stopped.
        await asyncio.wait_for(asyncio.gather(*tasks), WAIT)
        return only_a, every

    only_a, every = asyncio.run(main())
    assert {e.session for e in only_a} == {"a"}
    assert isinstance(only_a[-1], TurnEnded)
    assert {e.session for e in every} == {"a", "b"}


def test_bad_input_and_timeouts(tmp_path: Path) -> None:
    release = threading.Event()

    def script(request: ModelRequest):
        release.wait(WAIT)
        return reply("eventually")

    model = ScriptedModel(script)

    async def main() -> None:
        async with AsyncRuntime.start(config(tmp_path), model=model) as rt:
            with pytest.raises(ValueError, match="invalid session id"):
                await rt.run_turn("../x", "hi")
            with pytest.raises(TimeoutError, match=r"did not end within 0\.2 s; it goes on"):
                await rt.run_turn("s", "hi", timeout=0.2)
            release.set()

    try:
        asyncio.run(main())
    finally:
        release.set()
    assert len(model.requests) == 1
