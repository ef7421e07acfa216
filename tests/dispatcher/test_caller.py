"""A caller's thread lent to the dispatcher: the handler runs on it, and a Ctrl-C that arrives
meanwhile interrupts the caller once the handler is done, never the actor.

These tests stand alone: they import pykka and ``actors.dispatcher``, nothing else of loopd.
"""

from __future__ import annotations

import queue
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from actors.dispatcher import DispatchedActor, Dispatcher
from actors.dispatcher.caller import lend_caller

WAIT = 10.0


class Witness(DispatchedActor):
    """Records the thread each message runs on; ``"interrupt"`` raises SIGINT mid-handler."""

    def __init__(self, dispatcher: Dispatcher, seen: queue.SimpleQueue[tuple[str, str]]) -> None:
        super().__init__(dispatcher)
        self.seen = seen

    def on_receive(self, message: Any) -> Any:
        if message == "interrupt":
            signal.raise_signal(signal.SIGINT)  # its Python handler runs before the next line
        self.seen.put((message, threading.current_thread().name))
        return None


@pytest.fixture
def ctrl_c() -> Iterator[None]:
    """Python's own SIGINT handler (KeyboardInterrupt) for the test, whatever ran before."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_the_main_thread_runs_the_handler_and_a_ctrl_c_meanwhile_reaches_only_the_caller(
    dispatcher, ctrl_c
) -> None:
    assert threading.current_thread() is threading.main_thread()
    seen: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
    # Started inside the block, the actor's start and its first message both run here.
    with pytest.raises(KeyboardInterrupt), lend_caller(dispatcher):
        ref = Witness.start(dispatcher, seen)
        ref.tell("interrupt")
    try:
        # The handler ran to its end, on this thread, and the actor lives on.
        assert seen.get(timeout=WAIT) == ("interrupt", threading.current_thread().name)
        assert ref.is_alive()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        ref.tell("again")
        assert seen.get(timeout=WAIT)[0] == "again"
    finally:
        ref.stop()


def test_without_a_ctrl_c_the_main_thread_runs_the_handler_and_goes_on(dispatcher, ctrl_c) -> None:
    seen: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
    with lend_caller(dispatcher):
        ref = Witness.start(dispatcher, seen)
        ref.tell("hello")
    try:
        assert seen.get(timeout=WAIT) == ("hello", threading.current_thread().name)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        ref.stop()


def test_another_thread_is_lent_and_signal_handlers_are_left_alone(dispatcher, ctrl_c) -> None:
    seen: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
    handlers: list[Any] = []
    refs: list[Any] = []

    def caller() -> None:
        with lend_caller(dispatcher):
            refs.append(Witness.start(dispatcher, seen))
            refs[0].tell("from a thread")
            handlers.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=caller, name="the-caller")
    thread.start()
    thread.join(WAIT)
    try:
        assert seen.get(timeout=WAIT) == ("from a thread", "the-caller")
        assert handlers == [signal.default_int_handler]
    finally:
        refs[0].stop()


class Asker(DispatchedActor):
    """Answers whether the thread its message runs on is lent (``Dispatcher.lent_here``)."""

    def __init__(self, dispatcher: Dispatcher, seen: queue.SimpleQueue[tuple[str, bool]]) -> None:
        super().__init__(dispatcher)
        self.seen = seen

    def on_receive(self, message: Any) -> Any:
        self.seen.put((threading.current_thread().name, self.dispatcher.lent_here()))
        return None


def test_only_a_lent_callers_thread_counts_as_lent_not_the_dispatchers_own() -> None:
    # What may do blocking work in place (the store's commit) asks this: a caller's thread
    # only waits anyway, but a dispatcher thread held up would hold up every actor behind it.
    dispatcher = Dispatcher(1, name="lent-test")
    seen: queue.SimpleQueue[tuple[str, bool]] = queue.SimpleQueue()
    assert not dispatcher.lent_here()
    with lend_caller(dispatcher):
        assert dispatcher.lent_here()
        ref = Asker.start(dispatcher, seen)
        ref.tell("lent")
    try:
        assert seen.get(timeout=WAIT) == (threading.current_thread().name, True)
        assert not dispatcher.lent_here()
        ref.tell("not lent")
        assert seen.get(timeout=WAIT) == ("lent-test-0", False)
    finally:
        ref.stop()
        assert dispatcher.shutdown(WAIT)
