"""Dispatched actors keep every pykka promise on a few shared threads.

These tests stand alone: they import pykka and ``actors.dispatcher``, nothing else of loopd.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import weakref
from typing import Any

import pykka
import pytest

from actors.dispatcher import (
    RUN_NEXT_LIMIT,
    DispatchedActor,
    Dispatcher,
    DispatcherClosed,
    TimerHandle,
)

WAIT = 30.0  # for waiting only: what a test waits for takes milliseconds on an idle machine


class Recorder(DispatchedActor):
    """Keeps what it receives; answers an ask with the message itself."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        super().__init__(dispatcher)
        self.received: list[Any] = []
        self.events: list[str] = []
        self.stopped = threading.Event()
        self.failure: BaseException | None = None
        self.failed = threading.Event()

    def on_start(self) -> None:
        self.events.append(f"start on {threading.current_thread().name}")

    def on_stop(self) -> None:
        self.events.append("stop")
        self.stopped.set()

    def on_failure(self, exception_type: Any, exception_value: Any, traceback: Any) -> None:
        self.failure = exception_value
        self.failed.set()

    def on_receive(self, message: Any) -> Any:
        if message == "boom":
            raise ValueError("boom")
        if message == "stop yourself":
            self.stop()
        self.received.append(message)
        return message

    def thread_name(self) -> str:
        return threading.current_thread().name


class Gate(DispatchedActor):
    """Holds the thread it runs on until ``release`` is set: lets a test line up mailboxes."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        super().__init__(dispatcher)
        self.entered = threading.Event()
        self.release = threading.Event()

    def on_receive(self, message: Any) -> None:
        self.entered.set()
        assert self.release.wait(WAIT)


def hold_every_thread(dispatcher: Dispatcher, count: int) -> list[Gate]:
    gates = []
    for _ in range(count):
        gate: Gate = actor_of(Gate.start(dispatcher))
        gate.actor_ref.tell("hold")
        assert gate.entered.wait(WAIT)
        gates.append(gate)
    return gates


def actor_of(ref: pykka.ActorRef[Any]) -> Any:
    actor = ref._actor_weakref()
    assert actor is not None
    return actor


def test_messages_arrive_in_order_and_asks_are_answered(dispatcher) -> None:
    ref = Recorder.start(dispatcher)
    for i in range(1000):
        ref.tell(i)
    assert ref.ask("last", timeout=WAIT) == "last"
    assert actor_of(ref).received == [*range(1000), "last"]
    [started] = actor_of(ref).events
    assert started.startswith("start on test-dispatcher-")  # on a thread of the pool
    ref.stop()


def test_on_start_runs_before_messages_told_before_the_start(dispatcher) -> None:
    class Early(Recorder):
        def __init__(self, dispatcher: Dispatcher) -> None:
            super().__init__(dispatcher)
            self.actor_ref.tell("told in __init__")

        def on_receive(self, message: Any) -> Any:
            self.events.append(f"got {message}")
            return None

    ref = Early.start(dispatcher)
    ref.ask("sync", timeout=WAIT)
    events = actor_of(ref).events
    assert [e.split(" on ")[0] for e in events] == ["start", "got told in __init__", "got sync"]
    ref.stop()


def test_one_actor_never_runs_on_two_threads_at_once(new_dispatcher) -> None:
    # Bounded work (1,000 messages to the counter, 1,000 to the others, from four threads at
    # once) on four threads that hand mailboxes back every 3 messages: the property, not a
    # throughput, so a loaded machine only makes it slower, and the deadlines are for waiting.
    dispatcher = new_dispatcher(4, name="overlap", throughput=3)
    senders_count, per_sender = 4, 250

    class Counter(DispatchedActor):
        def __init__(self, dispatcher: Dispatcher) -> None:
            super().__init__(dispatcher)
            self.inside = False
            self.overlaps = 0
            self.count = 0
            self.threads: set[str] = set()

        def on_receive(self, message: Any) -> Any:
            if self.inside:
                self.overlaps += 1
            self.inside = True
            self.threads.add(threading.current_thread().name)
            os.sched_yield()  # invite another thread in, if the mailbox would let it
            self.count += 1
            self.inside = False
            return self.count

    ref = Counter.start(dispatcher)
    others = [Recorder.start(dispatcher) for _ in range(8)]

    def send(n: int) -> None:
        for i in range(n):
            ref.tell(i)
            others[i % len(others)].tell(i)

    senders = [threading.Thread(target=send, args=(per_sender,)) for _ in range(senders_count)]
    for t in senders:
        t.start()
    for t in senders:
        t.join(WAIT)
    assert not any(t.is_alive() for t in senders)
    assert ref.ask("done", timeout=WAIT) == senders_count * per_sender + 1
    counter = actor_of(ref)
    assert counter.overlaps == 0
    assert counter.threads <= {t.name for t in dispatcher.threads}
    assert dispatcher.shutdown(WAIT)


def test_a_busy_actor_hands_its_thread_back_after_throughput_messages(new_dispatcher) -> None:
    dispatcher = new_dispatcher(1, name="fair", throughput=5)
    [gate] = hold_every_thread(dispatcher, 1)
    busy = Recorder.start(dispatcher)
    quiet_saw: list[int] = []

    class Quiet(DispatchedActor):
        def on_receive(self, message: Any) -> None:
            quiet_saw.append(len(actor_of(busy).received))

    quiet = Quiet.start(dispatcher)
    for i in range(100):
        busy.tell(i)  # 100 messages wait before the quiet actor's one
    quiet.tell("hello")
    gate.release.set()
    assert busy.ask("sync", timeout=WAIT) == "sync"
    # The quiet actor ran after the busy one's first 5 messages, not after all 100.
    assert quiet_saw == [5]
    assert dispatcher.shutdown(WAIT)


class Relay(DispatchedActor):
    """Tells ``to`` (if any) what it receives, and keeps the thread each message ran on."""

    def __init__(self, dispatcher: Dispatcher, to: pykka.ActorRef[Any] | None = None) -> None:
        super().__init__(dispatcher)
        self.to = to
        self.threads: list[str] = []

    def on_receive(self, message: Any) -> Any:
        self.threads.append(threading.current_thread().name)
        if self.to is not None:
            self.to.tell(message)
        return None


def test_an_actor_told_from_a_handler_runs_next_on_the_same_thread(dispatcher) -> None:
    # The run-next slot: no other thread is woken for a message a handler sends on.
    last = Relay.start(dispatcher)
    first = Relay.start(dispatcher, last)
    for i in range(50):
        first.tell(i)
        last.ask("sync", timeout=WAIT)  # one at a time, so the other thread is idle each time
    assert actor_of(last).threads[::2] == actor_of(first).threads


def test_a_lent_thread_runs_what_its_tells_make_ready_when_the_block_ends(dispatcher) -> None:
    # What a store's or an event loop's thread does with its answers: no dispatcher thread
    # is woken, and the chain the answer starts runs on the lent thread too.
    last = Relay.start(dispatcher)
    first = Relay.start(dispatcher, last)
    first.ask("started")
    last.ask("started")  # both idle now: no thread holds their mailboxes
    actor_of(first).threads.clear()
    actor_of(last).threads.clear()
    here = threading.current_thread().name
    for i in range(20):
        with dispatcher.lend():
            first.tell(i)
            assert actor_of(first).threads == [here] * i  # not before the block ends
        assert actor_of(first).threads == [here] * (i + 1)
        assert actor_of(last).threads == [here] * (i + 1)
    first.stop()
    last.stop()


def test_two_actors_telling_each_other_leave_the_thread_to_others(new_dispatcher) -> None:
    dispatcher = new_dispatcher(1, name="ping-pong")
    [gate] = hold_every_thread(dispatcher, 1)
    bounces: list[int] = []

    class Ping(DispatchedActor):
        def __init__(self, dispatcher: Dispatcher) -> None:
            super().__init__(dispatcher)
            self.other: pykka.ActorRef[Any] | None = None

        def on_receive(self, message: Any) -> None:
            if isinstance(message, pykka.ActorRef):
                self.other = message
            elif message < 10_000:
                bounces.append(message)
                assert self.other is not None
                self.other.tell(message + 1)

    a, b = Ping.start(dispatcher), Ping.start(dispatcher)
    a.tell(b)
    b.tell(a)
    quiet_saw: list[int] = []

    class Quiet(DispatchedActor):
        def on_receive(self, message: Any) -> None:
            if message == "hello":
                quiet_saw.append(len(bounces))

    quiet = Quiet.start(dispatcher)
    a.tell(0)  # from outside: both wait in the shared queue, the ping-pong first
    quiet.tell("hello")
    gate.release.set()
    quiet.ask("sync", timeout=WAIT)
    # Before the quiet actor's turn came: a's run and b's, each taken from the queue, and
    # from b's on a chain of at most RUN_NEXT_LIMIT runs (not all 10,000 bounces).
    [seen] = quiet_saw
    assert 2 <= seen <= RUN_NEXT_LIMIT + 1
    assert dispatcher.shutdown(WAIT)


def test_ask_proxy_and_futures_behave_as_in_pykka(dispatcher) -> None:
    ref = Recorder.start(dispatcher)
    future = ref.ask("later", block=False)
    assert future.get(timeout=WAIT) == "later"
    proxy = ref.proxy()
    assert proxy.thread_name().get(timeout=WAIT).startswith("test-dispatcher-")
    proxy.received = ["replaced"]  # a proxy's attribute set is a message too
    assert proxy.received.get(timeout=WAIT) == ["replaced"]
    joined = pykka.get_all([ref.ask(i, block=False) for i in range(5)], timeout=WAIT)
    assert joined == [0, 1, 2, 3, 4]
    # An exception in an ask goes back to the asker; the actor lives on.
    with pytest.raises(ValueError, match="boom"):
        ref.ask("boom", timeout=WAIT)
    assert ref.is_alive()
    assert ref.ask("still here", timeout=WAIT) == "still here"
    ref.stop()


def test_an_exception_in_a_told_message_calls_on_failure_and_ends_the_actor(dispatcher) -> None:
    ref = Recorder.start(dispatcher)
    actor = actor_of(ref)
    ref.tell("boom")
    assert actor.failed.wait(WAIT)
    assert isinstance(actor.failure, ValueError)
    assert not ref.is_alive()
    assert ref not in pykka.ActorRegistry.get_all()
    assert "stop" not in actor.events  # on_failure instead of on_stop, as in pykka
    with pytest.raises(pykka.ActorDeadError):
        ref.tell("anyone?")
    with pytest.raises(pykka.ActorDeadError):
        ref.ask("anyone?", timeout=WAIT)
    assert dispatcher.actor_count() == 0


def test_stop_handles_what_was_sent_before_and_refuses_what_comes_after(dispatcher) -> None:
    gates = hold_every_thread(dispatcher, 2)
    ref = Recorder.start(dispatcher)
    ref.tell("before")
    stopping = ref.stop(block=False)
    after = ref.ask("after", block=False)  # queued behind the stop
    for gate in gates:
        gate.release.set()
    assert stopping.get(timeout=WAIT) is True
    with pytest.raises(pykka.ActorDeadError):
        after.get(timeout=WAIT)
    actor = actor_of(ref)
    assert actor.received == ["before"]
    assert actor.events[-1] == "stop"
    assert ref.stop(timeout=WAIT) is False  # already dead
    with pytest.raises(pykka.ActorDeadError):
        ref.ask("late", timeout=WAIT)


def test_an_actor_can_stop_itself_from_inside(dispatcher) -> None:
    gates = hold_every_thread(dispatcher, 2)
    ref = Recorder.start(dispatcher)
    ref.tell("stop yourself")
    ref.tell("queued before the stop")  # ahead of the stop the actor tells itself
    for gate in gates:
        gate.release.set()
    actor = actor_of(ref)
    assert actor.stopped.wait(WAIT)
    assert actor.received == ["stop yourself", "queued before the stop"]
    assert not ref.is_alive()
    with pytest.raises(pykka.ActorDeadError):
        ref.ask("after", timeout=WAIT)


def test_the_registry_lists_an_actor_only_while_it_lives(dispatcher) -> None:
    refs = [Recorder.start(dispatcher) for _ in range(3)]
    assert set(refs) <= set(pykka.ActorRegistry.get_by_class(Recorder))
    assert pykka.ActorRegistry.get_by_urn(refs[0].actor_urn) is refs[0]
    refs[0].stop()
    refs[1].tell("boom")
    assert actor_of(refs[1]).failed.wait(WAIT)
    assert set(pykka.ActorRegistry.get_by_class(Recorder)) == {refs[2]}
    refs[2].stop()
    assert pykka.ActorRegistry.get_by_class(Recorder) == []
    assert dispatcher.actor_count() == 0


def test_a_stopped_actor_leaves_the_registry_wherever_it_stands_in_it(dispatcher) -> None:
    # Stopping looks at the newest entries first: the oldest, one in the middle and the
    # newest of 300 must each leave, and every other entry stay, in start order.
    refs = [Recorder.start(dispatcher) for _ in range(300)]
    for index in (0, 150, 299, 298, 1):
        refs[index].stop()
    left = [ref for ref in pykka.ActorRegistry.get_all() if ref in set(refs)]
    assert left == [ref for i, ref in enumerate(refs) if i not in {0, 1, 150, 298, 299}]
    dispatcher.stop_actors(refs, WAIT)
    assert not set(pykka.ActorRegistry.get_all()) & set(refs)


def test_stop_actors_stops_them_together_after_what_they_were_sent(dispatcher) -> None:
    refs = [Recorder.start(dispatcher) for _ in range(200)]
    for ref in refs:
        ref.tell("last words")
    outsider = pykka.ThreadingActor.start()  # not on this dispatcher: left alone
    assert dispatcher.stop_actors([*refs, outsider], timeout=WAIT)
    for ref in refs:
        assert not ref.is_alive()
        assert (actor_of(ref).received, actor_of(ref).events[-1]) == (["last words"], "stop")
    assert outsider.is_alive()
    outsider.stop()
    assert dispatcher.stop_actors(refs, timeout=WAIT)  # all stopped already: nothing to wait for
    assert dispatcher.actor_count() == 0


def test_stop_actors_says_when_its_time_ran_out(new_dispatcher) -> None:
    dispatcher = new_dispatcher(1, name="slow-stop")
    [gate] = hold_every_thread(dispatcher, 1)
    ref = Recorder.start(dispatcher)
    assert dispatcher.stop_actors([ref], timeout=0.1) is False  # the gate holds the thread
    gate.release.set()
    assert actor_of(ref).stopped.wait(WAIT)  # the stop it was told still comes
    assert dispatcher.shutdown(WAIT)


@pytest.mark.timeout(300)  # 10,000 real starts: seconds on an idle machine, 25 s loaded
def test_ten_thousand_actors_share_two_threads(new_dispatcher) -> None:
    before = set(threading.enumerate())
    dispatcher = new_dispatcher(2, name="many")
    refs = [Recorder.start(dispatcher) for _ in range(10_000)]
    answers = pykka.get_all([ref.ask(i, block=False) for i, ref in enumerate(refs)], timeout=120)
    assert answers == list(range(10_000))
    assert set(threading.enumerate()) - before == set(dispatcher.threads)
    assert len(dispatcher.threads) == 2
    assert dispatcher.shutdown(120)
    assert all(not ref.is_alive() for ref in refs)
    assert pykka.ActorRegistry.get_by_class(Recorder) == []


def test_shutdown_stops_every_actor_and_leaves_no_thread(new_dispatcher) -> None:
    before = set(threading.enumerate())
    dispatcher = new_dispatcher(3, name="ending")
    refs = [Recorder.start(dispatcher) for _ in range(50)]
    fired = threading.Event()
    dispatcher.call_later(0, fired.set)
    assert fired.wait(WAIT)
    dispatcher.call_later(3600, fired.clear)  # pending at shutdown: dropped
    for ref in refs:
        ref.tell("last words")
    assert dispatcher.shutdown(WAIT)
    assert set(threading.enumerate()) - before == set()
    for ref in refs:
        actor = actor_of(ref)
        assert (actor.received, actor.events[-1]) == (["last words"], "stop")
    assert pykka.ActorRegistry.get_by_class(Recorder) == []
    assert fired.is_set()
    with pytest.raises(DispatcherClosed, match="ending"):
        Recorder.start(dispatcher)
    assert pykka.ActorRegistry.get_by_class(Recorder) == []


def test_shutdown_gives_up_on_an_actor_that_does_not_stop_in_time(new_dispatcher) -> None:
    dispatcher = new_dispatcher(1, name="stuck")
    [gate] = hold_every_thread(dispatcher, 1)
    waiting = Recorder.start(dispatcher)
    pending = waiting.ask("never handled", block=False)
    assert dispatcher.shutdown(0.2) is False  # the gate holds the only thread
    assert pykka.ActorRegistry.get_by_class(Recorder) == []
    assert pykka.ActorRegistry.get_by_class(Gate) == []
    with pytest.raises(pykka.ActorDeadError):
        pending.get(timeout=WAIT)
    gate.release.set()
    assert dispatcher.shutdown(WAIT)


def hold_the_timer_thread(dispatcher: Dispatcher) -> threading.Event:
    """Blocks the timer thread in a callback until the event returned is set: timers made
    meanwhile are all due by then, so what fires, and in what order, depends on the timers'
    deadlines alone, not on how fast this thread made them."""
    held, release = threading.Event(), threading.Event()
    dispatcher.call_later(0, lambda: (held.set(), release.wait(WAIT)))
    assert held.wait(WAIT)
    return release


def in_deadline_order(handles: dict[Any, TimerHandle]) -> list[Any]:
    """The keys of ``handles`` in the order their timers are due (ties: in the order made)."""
    return sorted(handles, key=lambda key: handles[key].when)


def test_call_later_calls_once_and_cancel_prevents_it(dispatcher) -> None:
    calls: list[str] = []
    done = threading.Event()
    release = hold_the_timer_thread(dispatcher)
    cancelled = dispatcher.call_later(0, lambda: calls.append("cancelled"))
    handles = {
        "later": dispatcher.call_later(0.1, lambda: (calls.append("later"), done.set())),
        "now": dispatcher.call_later(0, lambda: calls.append("now")),
    }
    cancelled.cancel()  # due already: the held timer thread has not come to it
    release.set()
    assert done.wait(WAIT)
    assert calls == in_deadline_order(handles)
    assert sorted(calls) == ["later", "now"]  # each once, the cancelled one never


def test_cancelled_timers_hold_nothing_and_the_rest_still_fire_in_order(dispatcher) -> None:
    # A child's time limit is cancelled when the child ends, long before it would fire: a
    # runtime that spawns many children must not keep every one of them until then.
    class Callback:
        def __call__(self) -> None:
            raise AssertionError("a cancelled timer fired")

    far = [Callback() for _ in range(1000)]
    refs = [weakref.ref(fn) for fn in far]
    handles = [dispatcher.call_later(3600, fn) for fn in far]
    del far
    fired: list[int] = []
    done = threading.Event()
    # Made latest-first, due earliest-first (a loaded machine may stall this thread between
    # two calls and so change which is due first: the order expected is the deadlines').
    near = {i: dispatcher.call_later(0.01 * (5 - i), lambda i=i: fired.append(i)) for i in range(5)}
    dispatcher.call_later(0.1, done.set)
    for handle in handles:
        handle.cancel()
    gc.collect()
    assert all(ref() is None for ref in refs)  # let go at cancel, not at 3600 s
    assert done.wait(WAIT)
    assert fired == in_deadline_order(near)
    assert sorted(fired) == [0, 1, 2, 3, 4]


def test_an_actor_cannot_shut_down_its_own_dispatcher(dispatcher) -> None:
    class Suicidal(DispatchedActor):
        def on_receive(self, message: Any) -> Any:
            return self.dispatcher.shutdown(1)

    ref = Suicidal.start(dispatcher)
    with pytest.raises(RuntimeError, match="from its own thread"):
        ref.ask("go", timeout=WAIT)
    assert ref.is_alive() and not dispatcher.closed
    ref.stop()


def test_a_dispatcher_needs_a_thread() -> None:
    with pytest.raises(ValueError, match="at least 1 thread"):
        Dispatcher(0)


def pykka_debug(caplog: pytest.LogCaptureFixture, refs: list[pykka.ActorRef[Any]]) -> list[str]:
    """The DEBUG texts of the ``pykka`` logger, each ref's urn shown as its number in refs."""
    texts = []
    for record in caplog.records:
        if record.name == "pykka" and record.levelno == logging.DEBUG:
            text = record.getMessage()
            for number, ref in enumerate(refs):
                text = text.replace(ref.actor_urn, f"#{number}")
            texts.append(text)
    caplog.clear()
    return texts


def test_the_registry_records_are_pykkas(dispatcher, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="pykka")

    class Dispatched(Recorder):
        pass

    class Threaded(pykka.ThreadingActor):
        def on_receive(self, message: Any) -> Any:
            raise ValueError(message)

    Threaded.__name__ = Dispatched.__name__ = "Same"  # so that the records can be compared
    seen = []
    for start in (Threaded.start, lambda: Dispatched.start(dispatcher)):
        first, second, third = start(), start(), start()
        first.stop()
        pykka.ActorRegistry.unregister(second)  # as pykka's own tests do, then a stop
        second.stop()
        third.tell("boom")  # a failure unregisters it
        assert third.actor_stopped.wait(WAIT)
        seen.append(pykka_debug(caplog, [first, second, third]))
    threaded, dispatched = seen
    assert dispatched == threaded
    assert [text for text in dispatched if "Registered" not in text and "Starting" not in text] == [
        "Unregistered Same (#0)",
        "Stopped Same (#0)",
        "Unregistered Same (#1)",
        "Unregistered Same (#1) (not found in registry)",
        "Stopped Same (#1)",
        "Unregistered Same (#2)",
    ]
