"""AsyncRuntime: turns, cancellation and events from one asyncio loop, with real actors."""

from __future__ import annotations

import asyncio
import inspect
import threading
from pathlib import Path

import pytest

from actors import AgentConfig, Config, Runtime
from actors.aio import AsyncRuntime
from actors.stores.sqlite import DB_NAME, SessionStore
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


class GatedMemory:
    """A memory source whose ``block`` (read by the Context for each new session) waits while
    the gate is shut: it holds the Context, so messages queue behind it in order."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.open.set()
        self.entered = threading.Event()

    def block(self) -> str:
        if not self.open.is_set():
            self.entered.set()
            self.open.wait(WAIT)
        return ""

    def updated(self, session: str, turns: int) -> None:
        pass


def test_cancelling_a_task_refused_busy_leaves_the_running_turn_alone(tmp_path: Path) -> None:
    """Issue 19 A6: a second run_turn on a busy session is refused busy; cancelling its task
    before that answer came back must not cancel the first caller's turn."""
    release = threading.Event()
    memory = GatedMemory()

    def script(request: ModelRequest):
        if request.session == "s":
            release.wait(WAIT)
        return reply(f"done {request.session}")

    model = ScriptedModel(script)

    async def main() -> tuple[object, object]:
        async with AsyncRuntime.start(config(tmp_path), model=model, memory=memory) as rt:
            first = asyncio.create_task(rt.run_turn("s", "one", timeout=WAIT))
            await asyncio.to_thread(model.wait_for_requests, 1, WAIT)
            # Hold the Context in a new session's memory read: what comes next queues behind.
            memory.open.clear()
            other = asyncio.create_task(rt.run_turn("other", "x", timeout=WAIT))
            assert await asyncio.to_thread(memory.entered.wait, WAIT)
            second = asyncio.create_task(rt.run_turn("s", "two", timeout=WAIT))
            await asyncio.sleep(0)  # it has sent its StartTurn, not yet heard the refusal
            second.cancel()
            with pytest.raises(asyncio.CancelledError):
                await second
            memory.open.set()
            assert await other == TurnCompleted("other", "done other")
            await asyncio.to_thread(rt.runtime.live)  # the Context has taken all it was sent
            release.set()
            return await first, await rt.run_turn("s", "three", timeout=WAIT)

    try:
        outcome, again = asyncio.run(main())
    finally:
        release.set()
        memory.open.set()
    assert outcome == TurnCompleted("s", "done s")
    assert again == TurnCompleted("s", "done s")


@pytest.mark.parametrize("timeout", [-1, 0, float("nan"), "5", float("inf"), 1e308, True])
def test_a_bad_timeout_is_refused_before_anything_is_sent(tmp_path: Path, timeout) -> None:
    """Issue 19 A7: the same ValueError as Runtime.run_turn, before the turn is sent or stored,
    and the loop's timers still work afterwards."""
    model = ScriptedModel([reply("never")])

    async def main() -> None:
        async with AsyncRuntime.start(config(tmp_path), model=model) as rt:
            with pytest.raises(ValueError, match="timeout must be") as refused:
                await rt.run_turn("s", "hi", timeout=timeout)
            with pytest.raises(ValueError) as sync_refused:
                rt.runtime.run_turn("s", "hi", timeout=timeout)
            assert str(refused.value) == str(sync_refused.value)
            await asyncio.wait_for(asyncio.sleep(0.01), WAIT)  # a timer still fires
            assert await rt.live() == ()

    asyncio.run(main())
    assert model.requests == []
    with SessionStore(Path(config(tmp_path).home) / DB_NAME) as store:
        assert store.list_sessions() == []


class GatedStart:
    """A tracer whose ``configure`` (called inside ``Runtime.start``) waits for a gate."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.go = threading.Event()

    def configure(self, config: Config) -> None:
        self.entered.set()
        self.go.wait(WAIT)

    def caller_trace(self) -> None:
        return None

    def on_event(self, event: TurnEvent, trace: object) -> None:
        pass

    def call_trace(self, session: str, call_id: int) -> None:
        return None


def test_cancelling_the_start_stops_what_it_started(tmp_path: Path) -> None:
    """Issue 19 A8: when the cancelled start's task has ended, the runtime it was starting is
    stopped and the home is free for the next start."""
    # A sync model's pool thread of an earlier test may outlive its runtime while its script
    # blocks (see DaemonExecutor): only the threads this test starts must be gone.
    before = set(threading.enumerate())
    gate = GatedStart()

    async def main() -> object:
        starting = asyncio.create_task(
            AsyncRuntime.start(config(tmp_path), model=ScriptedModel([]), tracer=gate)._run()
        )
        await asyncio.to_thread(gate.entered.wait, WAIT)
        starting.cancel()
        await asyncio.sleep(0)
        assert not starting.done()  # it waits for the start to end, then stops it
        gate.go.set()
        with pytest.raises(asyncio.CancelledError):
            await starting
        async with AsyncRuntime.start(config(tmp_path), model=ScriptedModel([reply("hi")])) as rt:
            return await rt.run_turn("s", "hi", timeout=WAIT)

    try:
        assert asyncio.run(main()) == TurnCompleted("s", "hi")
    finally:
        gate.go.set()
    started = set(threading.enumerate()) - before
    assert not [t for t in started if t.name.startswith("loopd")]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["stop", "async with"])
def test_a_cancelled_stop_ends_before_the_cancellation_goes_on(tmp_path: Path, how: str) -> None:
    """Issue 32 A24: the task that started a runtime is cancelled while it stops it (its own
    ``stop``, or the end of its ``async with`` block): the stop ends first, so the home is free
    at once for the next start in this very process (it was refused HomeInUse)."""

    async def main() -> object:
        if how == "stop":
            rt = await AsyncRuntime.start(config(tmp_path), model=ScriptedModel([]))
            stopping = asyncio.create_task(rt.stop())
        else:
            started = asyncio.Event()

            async def block() -> None:
                async with AsyncRuntime.start(config(tmp_path), model=ScriptedModel([])):
                    started.set()
                    await asyncio.Event().wait()  # until cancelled

            stopping = asyncio.create_task(block())
            await started.wait()
        await asyncio.sleep(0)  # the stop is under way
        stopping.cancel()
        if how == "async with":  # that ended the block: cancel again while it stops
            await asyncio.sleep(0)
            stopping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stopping
        async with AsyncRuntime.start(config(tmp_path), model=ScriptedModel([reply("hi")])) as rt:
            return await rt.run_turn("s", "hi", timeout=WAIT)

    assert asyncio.run(main()) == TurnCompleted("s", "hi")


def test_a_second_stop_waits_for_the_first(tmp_path: Path) -> None:
    async def main() -> None:
        rt = await AsyncRuntime.start(config(tmp_path), model=ScriptedModel([]))
        await asyncio.gather(rt.stop(), rt.stop())
        assert not rt.runtime.context.is_alive()

    asyncio.run(main())


def test_the_two_facades_take_the_same_arguments() -> None:
    """Issue 19 B3: every method both facades have takes the same parameters (names, kinds,
    defaults and annotations)."""
    shared = ["start", "send_turn", "run_turn", "cancel", "live", "stop"]
    for name in shared:
        sync = inspect.signature(getattr(Runtime, name))
        aio = inspect.signature(getattr(AsyncRuntime, name))
        assert list(aio.parameters.values()) == list(sync.parameters.values()), name


def test_run_turn_and_send_turn_pick_the_agent(tmp_path: Path) -> None:
    """Issue 19 B3: ``agent=`` picks the profile of a new session, as Runtime.run_turn does."""
    model = ScriptedModel([reply("small one"), reply("sent")])
    cfg = config(tmp_path).replace(agents={"small": AgentConfig(model="small-model")})

    async def main() -> tuple[object, object]:
        async with AsyncRuntime.start(cfg, model=model) as rt:
            outcome = await rt.run_turn("s", "hi", timeout=WAIT, agent="small")
            with pytest.raises(ValueError, match="no agent profile is named 'nope'"):
                await rt.run_turn("t", "hi", agent="nope")
            with pytest.raises(ValueError, match="small"):
                await rt.run_turn("s", "hi", timeout=WAIT, agent="default")
            ended = asyncio.Event()

            async def watch() -> TurnEvent:
                async for event in rt.events("u"):
                    if isinstance(event, TurnEnded):
                        return event
                raise AssertionError("no end")

            watcher = asyncio.create_task(watch())
            await asyncio.sleep(0)
            await rt.send_turn("u", "go", agent="small")
            ended.set()
            return outcome, await asyncio.wait_for(watcher, WAIT)

    outcome, end = asyncio.run(main())
    assert outcome == TurnCompleted("s", "small one")
    assert end.completed
    assert [r.agent for r in model.requests] == ["small", "small"]
    assert model.requests[0].options.model == "small-model"


def test_future_mailbox_resolves_its_future_once_from_any_thread(tmp_path: Path) -> None:
    """The mailbox the service registers for a waiting HTTP turn: the first message told it, from
    an actor's thread, resolves its future on the loop; a later one changes nothing; once the
    loop is closed, telling it raises nothing (nobody waits any more)."""
    count = 32

    async def main() -> tuple[list[object], list[object]]:
        async with AsyncRuntime.start(config(tmp_path), model=ScriptedModel([])) as rt:
            loop = asyncio.get_running_loop()
            futures = [loop.create_future() for _ in range(count)]
            boxes = [rt.future_mailbox(future) for future in futures]

            def tell_all() -> None:
                for i, box in enumerate(boxes):
                    box.tell(f"first {i}")
                    box.tell(f"second {i}")

            threads = [threading.Thread(target=tell_all) for _ in range(2)]
            for thread in threads:
                thread.start()
            answers = await asyncio.wait_for(asyncio.gather(*futures), WAIT)
            for thread in threads:
                thread.join(WAIT)
            return answers, boxes

    answers, boxes = asyncio.run(main())
    assert answers == [f"first {i}" for i in range(count)]
    boxes[0].tell("after the loop closed")  # raises nothing
