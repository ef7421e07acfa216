"""LoopInbox: items told from any thread reach the loop in order, a burst for one wake-up.

These tests stand alone: the standard library and ``actors.dispatcher`` only.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from actors.dispatcher.loop_inbox import LoopInbox

WAIT = 10.0


class LoopThread:
    """A real event loop running on a thread of its own, counting its thread-safe wake-ups."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.wakeups = 0
        plain = self.loop.call_soon_threadsafe

        def counted(callback: Any, *args: Any, context: Any = None) -> Any:
            self.wakeups += 1
            return plain(callback, *args, context=context)

        self.loop.call_soon_threadsafe = counted  # type: ignore[method-assign,assignment]
        self.thread = threading.Thread(target=self.loop.run_forever, name="the-loop")
        self.thread.start()

    def run(self, fn: Any) -> Any:
        """``fn()`` on the loop's thread; its result."""

        async def call() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(WAIT)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT)
        self.loop.close()


@pytest.fixture
def looped() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    if not lt.loop.is_closed():
        lt.close()


def test_items_from_many_threads_arrive_once_each_in_each_threads_order(
    looped: LoopThread,
) -> None:
    got: list[tuple[int, int]] = []
    done = threading.Event()
    inbox: LoopInbox[tuple[int, int]] = LoopInbox(looped.loop, got.append, "test")

    def producer(n: int) -> None:
        for i in range(500):
            assert inbox.put((n, i))

    threads = [threading.Thread(target=producer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    looped.run(done.set)  # after every drain the puts scheduled
    assert done.wait(WAIT)
    assert sorted(got) == [(n, i) for n in range(4) for i in range(500)]
    for n in range(4):
        assert [i for m, i in got if m == n] == list(range(500))


def test_a_burst_told_while_the_loop_is_busy_is_one_wake_up(looped: LoopThread) -> None:
    got: list[int] = []
    inbox: LoopInbox[int] = LoopInbox(looped.loop, got.append, "test")
    busy, release = threading.Event(), threading.Event()

    def hold_the_loop() -> None:
        busy.set()
        assert release.wait(WAIT)

    looped.loop.call_soon_threadsafe(hold_the_loop)
    assert busy.wait(WAIT)
    before = looped.wakeups
    for i in range(100):
        inbox.put(i)
    assert looped.wakeups - before == 1  # one drain scheduled for the hundred
    release.set()
    looped.run(lambda: None)
    assert got == list(range(100))


def test_a_failing_item_is_logged_and_the_rest_of_the_burst_handled(
    looped: LoopThread, caplog: pytest.LogCaptureFixture
) -> None:
    got: list[int] = []

    def handle(item: int) -> None:
        if item == 2:
            raise RuntimeError("item two is bad")
        got.append(item)

    inbox: LoopInbox[int] = LoopInbox(looped.loop, handle, "the test inbox")
    with caplog.at_level(logging.ERROR):
        for i in range(5):
            inbox.put(i)
        looped.run(lambda: None)
    assert got == [0, 1, 3, 4]
    assert "the test inbox: handling int failed" in caplog.text


def test_after_the_loop_closes_put_says_so_and_keeps_nothing(looped: LoopThread) -> None:
    inbox: LoopInbox[int] = LoopInbox(looped.loop, lambda item: None, "test")
    looped.loop.call_soon_threadsafe(looped.loop.stop)
    looped.thread.join(WAIT)
    assert inbox.put(1)  # a drain is scheduled on a loop that has stopped and never runs it
    looped.loop.close()
    assert inbox.put(2) is False
    assert inbox.put(3) is False
    assert "waiting=0" in repr(inbox)
