"""The dispatcher: a few threads that run the mailboxes of many actors, and one timer thread."""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, cast

import pykka

__all__ = [
    "DEFAULT_THROUGHPUT",
    "RUN_NEXT_LIMIT",
    "Dispatcher",
    "DispatcherClosed",
    "TimerHandle",
    "default_threads",
]

log = logging.getLogger(__name__)

DEFAULT_THROUGHPUT = 16
"""Messages an actor may handle in one go before it hands its thread to the next actor."""


RUN_NEXT_LIMIT = 32
"""Mailboxes a thread may run one after another from its run-next slot before the next one
goes to the shared queue (see :meth:`Dispatcher.execute`)."""


class _Worker(threading.local):
    """Per thread: whether it is one of the dispatcher's threads running a mailbox now, and
    the mailbox it runs next."""

    running = False
    lent = False
    next: Runnable | None = None


def default_threads() -> int:
    """A pool size that suits the machine: the CPU count, but at most 4 and at least 1.

    Handlers only compute (they never block), and the GIL runs one of them at a time, so more
    threads buy little; a few keep a slow handler from stalling every other actor.
    """
    return max(1, min(4, os.cpu_count() or 1))


class DispatcherClosed(RuntimeError):
    """An actor was started on a dispatcher that is shut down (or shutting down)."""


class Runnable(Protocol):
    """What the dispatcher runs: an actor's mailbox (see ``_actor._Mailbox``)."""

    def run(self) -> None:
        """Handle up to ``throughput`` messages, then queue itself again if more wait."""

    def stop_actor(self) -> pykka.Future[bool] | None:
        """Ask the actor to stop, after the messages it has already been sent."""

    def tell_stop(self) -> bool:
        """Tell the actor to stop, with no answer; False if it has stopped already."""

    def abandon(self) -> None:
        """Give up on an actor that did not stop in time: refuse what it was sent."""


def _nothing() -> None:
    return None


class TimerHandle:
    """A call scheduled with :meth:`Dispatcher.call_later`; :meth:`cancel` drops it."""

    __slots__ = ("_owner", "cancelled", "fn", "when")

    def __init__(
        self, when: float, fn: Callable[[], object], owner: Dispatcher | None = None
    ) -> None:
        self.when = when
        self.fn = fn
        self.cancelled = False
        self._owner = owner

    def cancel(self) -> None:
        """Do not make the call (no effect once it is made). The function is let go at once,
        and the dispatcher sweeps cancelled timers out once they are half of its timers: a
        child's time limit, cancelled when the child ends, holds nothing until it would fire."""
        if self.cancelled:
            return
        self.cancelled = True
        self.fn = _nothing
        if self._owner is not None:
            self._owner._timer_cancelled()


_STOP = None


class Dispatcher:
    """A pool of ``threads`` threads shared by every :class:`DispatchedActor` started on it.

    A mailbox with messages waits in one FIFO queue; a free thread takes it and runs up to
    ``throughput`` of its messages, then queues it again behind the others if more wait. The
    threads are daemons named ``<name>-<n>``. :meth:`call_later` runs short callbacks (telling
    an actor a message, say) on one more thread, ``<name>-timer``, started on first use.
    :meth:`shutdown` stops every actor still on the dispatcher and ends its threads.
    """

    def __init__(
        self, threads: int | None = None, *, name: str = "dispatcher", throughput: int = 0
    ) -> None:
        size = default_threads() if threads is None else threads
        if size < 1:
            raise ValueError(f"a dispatcher needs at least 1 thread, not {size}")
        self.name = name
        self.throughput = throughput if throughput > 0 else DEFAULT_THROUGHPUT
        self._ready: queue.SimpleQueue[Runnable | None] = queue.SimpleQueue()
        self._worker = _Worker()
        self._lock = threading.Lock()
        # A dict for its order: stopping in start order finds each actor near the front of
        # pykka's registry (a list), so stopping n actors costs O(n), not O(n**2).
        self._mailboxes: dict[Runnable, None] = {}
        self._stopped = threading.Condition(self._lock)
        self._awaited: list[set[Runnable]] = []  # one set per stop_actors call waiting
        self._closed = False
        self._timers: list[tuple[float, int, TimerHandle]] = []
        self._cancelled_timers = 0  # cancelled handles still in _timers
        self._timer_seq = itertools.count()
        self._timer_cond = threading.Condition()
        self._timer_thread: threading.Thread | None = None
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        """Every thread of this dispatcher: the pool, and the timer once it has started."""
        timer = (self._timer_thread,) if self._timer_thread is not None else ()
        return (*self._threads, *timer)

    @property
    def closed(self) -> bool:
        """True once :meth:`shutdown` has begun: no actor may start on it any more."""
        return self._closed

    def actor_count(self) -> int:
        """How many actors are started on this dispatcher and not stopped yet."""
        with self._lock:
            return len(self._mailboxes)

    # The actors' side.

    def attach(self, mailbox: Runnable) -> None:
        """Count ``mailbox``'s actor as started here; raises DispatcherClosed after shutdown."""
        with self._lock:
            if self._closed:
                raise DispatcherClosed(f"dispatcher {self.name} is shut down")
            self._mailboxes[mailbox] = None

    def detach(self, mailbox: Runnable) -> None:
        """``mailbox``'s actor has stopped."""
        with self._lock:
            self._mailboxes.pop(mailbox, None)
            for awaited in self._awaited:
                awaited.discard(mailbox)
                if not awaited:
                    self._stopped.notify_all()

    def execute(self, mailbox: Runnable, *, later: bool = False) -> None:
        """Queue ``mailbox`` for a thread (its owner makes sure it is queued once at a time).

        Called on one of this dispatcher's threads while it runs an actor, the first mailbox
        goes to that thread's run-next slot: the thread runs it as soon as its current run
        ends, and no other thread is woken. A message is usually the last thing its handler
        does, and waking a sleeping thread (on another CPU, as often as not) costs more than
        most handlers. Any more go to the shared queue, where idle threads take them.
        ``later`` always uses the shared queue, behind everything waiting there (a mailbox
        that used up its ``throughput`` and queues itself again).
        """
        worker = self._worker
        if not later and worker.running and worker.next is None:
            worker.next = mailbox
            return
        self._ready.put(mailbox)

    def lent_here(self) -> bool:
        """Whether the calling thread is lent to this dispatcher now (inside :meth:`lend`, and
        not one of the dispatcher's own threads): a thread that would otherwise only wait."""
        return self._worker.lent

    @contextlib.contextmanager
    def lend(self) -> Iterator[None]:
        """Lend the calling thread to the dispatcher for the messages told inside the block.

        For a thread of another actor that answers dispatched actors and then waits for its
        next request (a store's, an event loop's): the first mailbox its answers make ready
        goes to this thread's run-next slot and runs here when the block ends, with what it
        tells in turn, instead of waking a dispatcher thread. Its handlers must not block,
        which dispatched actors' never do. On one of the dispatcher's own threads, or inside
        another ``lend``, it changes nothing.
        """
        worker = self._worker
        if worker.running:
            yield
            return
        worker.running = worker.lent = True
        try:
            yield
        finally:
            try:
                mailbox, worker.next = worker.next, None
                if mailbox is not None:
                    self._run_chain(worker, mailbox)
            finally:
                worker.running = worker.lent = False

    def _work(self) -> None:
        worker = self._worker
        while True:
            mailbox = self._ready.get()
            if mailbox is _STOP:
                return
            worker.running = True
            self._run_chain(worker, mailbox)
            worker.running = False

    def _run_chain(self, worker: _Worker, mailbox: Runnable | None) -> None:
        """Run ``mailbox``, then whatever each run leaves in the run-next slot."""
        chained = 0
        while mailbox is not None:
            try:
                mailbox.run()
            except BaseException:  # a bug in the mailbox itself: the thread must live on
                log.exception("dispatcher %s: a mailbox run failed", self.name)
            mailbox, worker.next = worker.next, None
            chained += 1
            if mailbox is not None and chained >= RUN_NEXT_LIMIT:
                # Two actors telling each other back and forth would keep this thread to
                # themselves: after so many, the next one waits its turn in the queue.
                self._ready.put(mailbox)
                mailbox = None

    # Timers.

    def call_later(self, delay: float, fn: Callable[[], object]) -> TimerHandle:
        """Call ``fn()`` on the timer thread after ``delay`` seconds; keep ``fn`` short.

        Calls made while shutting down are dropped. An exception in ``fn`` is logged.
        """
        handle = TimerHandle(time.monotonic() + max(0.0, delay), fn, self)
        with self._timer_cond:
            if self._closed:
                handle.cancel()
                return handle
            heapq.heappush(self._timers, (handle.when, next(self._timer_seq), handle))
            if self._timer_thread is None:
                self._timer_thread = threading.Thread(
                    target=self._run_timers, name=f"{self.name}-timer", daemon=True
                )
                self._timer_thread.start()
            elif self._timers[0][2] is handle:
                # Only a new earliest timer changes how long the timer thread sleeps: waking
                # it for every child's time limit would cost a wake-up per child.
                self._timer_cond.notify()
        return handle

    def _timer_cancelled(self) -> None:
        with self._timer_cond:
            self._cancelled_timers += 1
            if self._cancelled_timers > 64 and 2 * self._cancelled_timers > len(self._timers):
                self._timers = [entry for entry in self._timers if not entry[2].cancelled]
                heapq.heapify(self._timers)
                self._cancelled_timers = 0

    def _run_timers(self) -> None:
        with self._timer_cond:
            while not self._closed:
                if not self._timers:
                    self._timer_cond.wait()
                    continue
                when, _, handle = self._timers[0]
                wait = when - time.monotonic()
                if wait > 0 and not handle.cancelled:
                    self._timer_cond.wait(wait)
                    continue
                heapq.heappop(self._timers)
                if handle.cancelled:
                    self._cancelled_timers = max(0, self._cancelled_timers - 1)
                    continue
                self._timer_cond.release()
                try:
                    handle.fn()
                except Exception:
                    log.exception("dispatcher %s: a timer callback failed", self.name)
                finally:
                    self._timer_cond.acquire()

    def stop_actors(self, refs: Iterable[pykka.ActorRef[Any]], timeout: float | None) -> bool:
        """Stop the actors of ``refs`` (all on this dispatcher) together, and wait until each
        has stopped (its ``on_stop`` has run) or ``timeout`` has passed; True if all did.

        It does what ``ref.stop(block=False)`` on each and a wait on every future does, without
        two futures per actor: that matters when a runtime stops 100,000 of them. Refs in the
        order the actors started stop fastest (see the note on ``_mailboxes``).
        """
        awaited: set[Runnable] = set()
        mailboxes: list[Runnable] = []
        with self._lock:
            for ref in refs:
                mailbox = cast(Runnable, ref.actor_inbox)
                if mailbox in self._mailboxes:  # else stopped already, or not one of ours
                    awaited.add(mailbox)
                    mailboxes.append(mailbox)
            self._awaited.append(awaited)
        try:
            for mailbox in mailboxes:
                mailbox.tell_stop()
            with self._lock:
                return self._stopped.wait_for(lambda: not awaited, timeout)
        finally:
            with self._lock:
                self._awaited.remove(awaited)

    # The end.

    def shutdown(self, timeout: float | None = 10.0) -> bool:
        """Stop every actor still on this dispatcher, in parallel, then end every thread.

        Each actor handles what it was sent before it stops (``on_stop`` runs). Whatever is
        not done after ``timeout`` seconds is given up: the actors left are marked stopped and
        removed from pykka's registry, and what they were sent is answered ``ActorDeadError``.
        Returns True if every thread ended in time. Calling it again does no harm; calling it
        from one of its actors (on its own thread) raises RuntimeError.
        """
        if threading.current_thread() in self.threads:
            raise RuntimeError(f"dispatcher {self.name} cannot be shut down from its own thread")
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        with self._lock:
            first = not self._closed
            self._closed = True
            mailboxes = list(self._mailboxes)
        futures = [f for f in (m.stop_actor() for m in mailboxes) if f is not None]
        for future in futures:
            try:
                future.get(timeout=left())
            except pykka.Timeout:
                break
        with self._timer_cond:
            self._timers.clear()
            self._cancelled_timers = 0
            self._timer_cond.notify_all()
        if first:
            for _ in self._threads:
                self._ready.put(_STOP)
        for thread in self.threads:
            thread.join(left())
        with self._lock:
            stuck = list(self._mailboxes)
        for mailbox in stuck:
            mailbox.abandon()
        return not any(thread.is_alive() for thread in self.threads)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Dispatcher {self.name} threads={len(self._threads)} {state}>"
