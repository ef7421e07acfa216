"""The port's pool of worker actors, which run blocking jobs (port tools) in parallel.

The router hands each job to an idle worker, or queues it until one is free; a worker runs the
job, tells the result to the job's ``reply_to`` address and reports itself idle. A job in flight
never blocks a session: the session told the router and went on.

Each job travels with a :class:`Ticket`: its cancel signal (set when the session stops waiting,
when the job outlives the pool's time limit, or when the pool stops) and the rule that a job is
answered once. A job past the time limit is answered by the router with ``on_timeout``'s reply;
the worker's late reply is then dropped.

A job for an ``async def`` tool takes no worker: the router starts it as a task on the pool's
event loop (:class:`~actors.services.tool_loop.ToolLoop`, or the application's
:class:`~actors.services.tool_loop.AppLoop`), with the same ticket, time limit and cancel;
cancelling it cancels the task.

Capacity never drops. A worker whose job was told to stop (it timed out, or its caller
cancelled it) and has not returned a grace later (``port.timeout_s``, at most
:data:`STOP_GRACE_S`) is replaced by a new worker; the stuck thread is abandoned, counted,
logged and announced with ``on_lost``'s event, and stopped if its job ever returns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Hashable
from dataclasses import dataclass
from typing import Any

import pykka

from actors.dispatcher.directory import EVENTS, Directory
from actors.dispatcher.inbox import SimpleInbox
from actors.services.tool_loop import AppLoop, ToolLoop
from actors.tools.context import Ticket
from messages import CancelPortCall

__all__ = ["STOP_GRACE_S", "IdleQueue", "PoolWorker", "PortRouter"]

log = logging.getLogger(__name__)


Handler = Callable[[Any, Ticket], Any]
"""Runs one job and returns the reply (turning expected failures into reply messages)."""

ErrorReply = Callable[[Any, BaseException], Any]
"""The reply to a job whose handler raised anyway: every job is answered."""

TimeoutReply = Callable[[Any, float], Any]
"""The reply to a job that outlived the pool's time limit (given in seconds)."""

AsyncJob = Callable[[Any, Ticket], Coroutine[Any, Any, Any] | None]
"""The coroutine that answers a job on the event loop (an ``async def`` tool), else None."""

LostNotice = Callable[[Any, int], Any]
"""The event told to ``events`` when a job's worker is replaced (the job, the stuck count)."""

STOP_GRACE_S = 1.0
"""The longest a job told to stop may keep its worker before the worker is replaced."""

STOP_JOIN_S = 10.0
"""The longest the router's stop waits for its idle workers' threads to end."""


class IdleQueue:
    """Which worker runs which job: idle workers in turn, queued jobs first come first served."""

    def __init__(self, size: int) -> None:
        self.idle: deque[int] = deque(range(size))
        self.waiting: deque[Any] = deque()

    def submit(self, job: Any) -> tuple[int, Any] | None:
        """A job arrived: the ``(worker, job)`` to start now, or None if it must wait."""
        if self.idle:
            return self.idle.popleft(), job
        self.waiting.append(job)
        return None

    def free(self, worker: int) -> tuple[int, Any] | None:
        """``worker`` finished: the next ``(worker, job)`` to start, or None if it goes idle."""
        if self.waiting:
            return worker, self.waiting.popleft()
        self.idle.append(worker)
        return None

    def withdraw(self, match: Callable[[Any], bool]) -> Any | None:
        """Take the first waiting job ``match`` accepts out of the queue; None if none."""
        for job in self.waiting:
            if match(job):
                self.waiting.remove(job)
                return job
        return None


@dataclass(frozen=True)
class _WorkerIdle:
    worker: int
    ticket: Ticket


@dataclass(frozen=True)
class _Run:
    ticket: Ticket


@dataclass(frozen=True)
class _TimedOut:
    ticket: Ticket


@dataclass(frozen=True)
class _Stuck:
    """The grace of a job told to stop is over: if it still holds its worker, replace it."""

    worker: int
    ticket: Ticket


@dataclass(frozen=True)
class _AsyncDone:
    ticket: Ticket
    reply: Any


class PoolWorker(pykka.ThreadingActor):
    """Runs jobs one at a time with ``handler``; owns nothing but its thread."""

    # A worker may be stuck in a request when the runtime stops; it must not keep the process up.
    use_daemon_thread = True

    @staticmethod
    def _create_actor_inbox() -> SimpleInbox:
        return SimpleInbox()

    def __init__(
        self,
        index: int,
        handler: Handler,
        on_error: ErrorReply,
        router: pykka.ActorRef[Any],
        directory: Directory,
        threads: dict[int, threading.Thread] | None = None,
    ) -> None:
        super().__init__()
        self.index = index
        self.handler = handler
        self.on_error = on_error
        self.router = router
        self.directory = directory
        self.threads = threads

    def on_start(self) -> None:
        if self.threads is not None:  # so the router can join this thread when it stops
            self.threads[self.index] = threading.current_thread()

    def on_receive(self, message: Any) -> None:
        if not isinstance(message, _Run):
            log.warning("pool worker: unexpected message %r", message)
            return
        ticket = message.ticket
        job = ticket.job
        try:
            reply = self.handler(job, ticket)
        except BaseException as exc:
            # A handler bug must neither kill the worker nor lose a reply; and pykka stops
            # every actor of the process on a BaseException (SystemExit...) out of a handler.
            log.exception("pool handler failed on %s", type(job).__name__)
            reply = self.on_error(job, exc)
        if ticket.claim():  # not answered already (timed out)
            self.directory.tell(job.reply_to, reply)
        with contextlib.suppress(pykka.ActorDeadError):  # the pool stopped while the tool ran
            self.router.tell(_WorkerIdle(self.index, ticket))


def _port_key(job: Any) -> Hashable:
    return (job.session, job.call_id)


class PortRouter(pykka.ThreadingActor):
    """Owns ``size`` workers and spreads port calls over them (see :class:`IdleQueue`).

    :class:`~messages.CancelPortCall` drops a queued call, or sets the cancel signal of a
    running one. With ``timeout_s``, a call still running after that long is answered with
    ``on_timeout``'s reply and its cancel signal is set. A worker whose call was told to stop
    and still runs after a grace (``timeout_s``, at most :data:`STOP_GRACE_S`) is replaced,
    so ``size`` workers are always there for new calls (see the module's doc).

    ``app_loop`` is the application's event loop, on which ``async def`` tools then run;
    without it the router starts a loop of its own with the first async call.
    """

    @staticmethod
    def _create_actor_inbox() -> SimpleInbox:
        return SimpleInbox()

    def __init__(
        self,
        size: int,
        handler: Handler,
        on_error: ErrorReply,
        directory: Directory,
        *,
        timeout_s: float | None = None,
        on_timeout: TimeoutReply | None = None,
        async_job: AsyncJob | None = None,
        on_lost: LostNotice | None = None,
        app_loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__()
        self.size = size
        self.handler = handler
        self.on_error = on_error
        self.directory = directory
        self.timeout_s = timeout_s
        self.on_timeout = on_timeout
        self.on_lost = on_lost
        self.grace_s = STOP_GRACE_S if timeout_s is None else min(timeout_s, STOP_GRACE_S)
        self.queue = IdleQueue(size)
        self.workers: dict[int, pykka.ActorRef[Any]] = {}
        self.assigned: dict[int, Ticket] = {}  # worker -> the sync job it runs
        self.abandoned: dict[int, pykka.ActorRef[Any]] = {}  # replaced, their job still runs
        self.threads: dict[int, threading.Thread] = {}  # each worker's, once it started
        self.next_worker = size
        self.running: dict[Hashable, Ticket] = {}
        self.timers: dict[Hashable, threading.Timer] = {}
        self.async_job = async_job
        self.app_loop = app_loop
        self.loop: ToolLoop | AppLoop | None = None  # started with the first async job
        self.tasks: dict[Hashable, concurrent.futures.Future[Any]] = {}

    def on_start(self) -> None:
        for i in range(self.size):
            self.workers[i] = self._worker(i)

    def _worker(self, index: int) -> pykka.ActorRef[Any]:
        return PoolWorker.start(
            index, self.handler, self.on_error, self.actor_ref, self.directory, self.threads
        )

    def on_stop(self) -> None:
        for timer in self.timers.values():
            timer.cancel()
        for ticket in self.running.values():
            ticket.cancelled.set()  # a tool that listens stops now
        for task in self.tasks.values():
            task.cancel()  # on the application's loop too, which is not ours to stop
        for worker in [*self.workers.values(), *self.abandoned.values()]:
            worker.stop(block=False)
        # The idle workers end now; a stop returns once their threads have (a worker in a tool
        # call is not waited for: its call may never return, and its thread is a daemon).
        deadline = time.monotonic() + STOP_JOIN_S
        for index, worker in self.workers.items():
            if index in self.assigned:
                continue
            worker.actor_stopped.wait(max(0.0, deadline - time.monotonic()))
            thread = self.threads.get(index)
            if thread is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
        if self.loop is not None:
            self.loop.stop()  # the port's own loop: cancels what still runs, ends its thread

    def on_receive(self, message: Any) -> None:
        if isinstance(message, _WorkerIdle):
            start = self._worker_idle(message.worker, message.ticket)
        elif isinstance(message, CancelPortCall):
            self._cancel((message.session, message.call_id))
            return
        elif isinstance(message, _TimedOut):
            self._timed_out(message.ticket)
            return
        elif isinstance(message, _Stuck):
            start = self._stuck(message.worker, message.ticket)
        elif isinstance(message, _AsyncDone):
            if message.ticket.claim():
                self.directory.tell(message.ticket.job.reply_to, message.reply)
            self._done(message.ticket)
            return
        elif self._ran_async(message):
            return
        else:
            start = self.queue.submit(message)
        if start is not None:
            self._run(*start)

    def _ticket(self, job: Any) -> Ticket:
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        return Ticket(job, _port_key(job), deadline)

    def _after(self, ticket: Ticket, seconds: float, message: Any) -> None:
        """Tell ``message`` to the router in ``seconds``: the ticket's one timer (it replaces
        the one before)."""
        old = self.timers.pop(ticket.key, None)
        if old is not None:
            old.cancel()
        timer = threading.Timer(seconds, self._tell_self, [message])
        timer.daemon = True
        self.timers[ticket.key] = timer
        timer.start()

    def _tell_self(self, message: Any) -> None:
        with contextlib.suppress(pykka.ActorDeadError):  # the pool stopped meanwhile
            self.actor_ref.tell(message)

    def _track(self, ticket: Ticket) -> None:
        self.running[ticket.key] = ticket
        if self.timeout_s is not None:
            self._after(ticket, self.timeout_s, _TimedOut(ticket))

    def _run(self, worker: int, job: Any) -> None:
        ticket = self._ticket(job)
        self._track(ticket)
        self.assigned[worker] = ticket
        self.workers[worker].tell(_Run(ticket))

    def _worker_idle(self, worker: int, ticket: Ticket) -> tuple[int, Any] | None:
        """``worker`` finished ``ticket``'s job: the next ``(worker, job)`` to start, if any."""
        lost = self.abandoned.pop(worker, None)
        if lost is not None:  # replaced long ago; its thread is free again, and not needed
            lost.stop(block=False)
            log.info(
                "the port tool %s returned after its worker was replaced (%d tool threads "
                "still stuck)",
                _name(ticket.job),
                len(self.abandoned),
            )
            return None
        self.assigned.pop(worker, None)
        self._done(ticket)
        return self.queue.free(worker)

    def _ran_async(self, job: Any) -> bool:
        """Start ``job`` on the event loop if it is an async tool's; False if it is not."""
        if self.async_job is None:
            return False
        ticket = self._ticket(job)
        coro = self.async_job(job, ticket)
        if coro is None:
            return False
        self._track(ticket)
        router = self.actor_ref
        on_error = self.on_error

        async def guarded() -> Any:
            # asyncio re-raises SystemExit and KeyboardInterrupt out of the loop itself: a
            # job's own must be its answer, never the end of the loop's thread.
            try:
                return await coro
            except (SystemExit, KeyboardInterrupt) as exc:
                return on_error(job, exc)

        def finished(done: concurrent.futures.Future[Any]) -> None:
            try:
                reply = done.result()
            except concurrent.futures.CancelledError:  # cancelled, timed out or stopping
                reply = on_error(job, RuntimeError("it was cancelled"))
            except BaseException as exc:  # GeneratorExit too: answered all the same
                log.warning("async port job %s failed", _name(job), exc_info=exc)
                reply = on_error(job, exc)
            with contextlib.suppress(pykka.ActorDeadError):  # a stopped pool: nobody waits
                router.tell(_AsyncDone(ticket, reply))

        try:
            if self.loop is None:
                self.loop = ToolLoop() if self.app_loop is None else AppLoop(self.app_loop)
            task = self.loop.submit(guarded())
        except RuntimeError as exc:  # the application's loop is closed
            coro.close()  # never started: close it, so Python does not warn about it
            log.warning("cannot start the async port tool %s: %s", _name(job), exc)
            if ticket.claim():
                self.directory.tell(job.reply_to, on_error(job, exc))
            self._done(ticket)
            return True
        self.tasks[ticket.key] = task
        task.add_done_callback(finished)
        return True

    def _done(self, ticket: Ticket) -> None:
        """``ticket``'s job is over: forget it (unless the key is another job's by now)."""
        if self.running.get(ticket.key) is not ticket:
            return
        del self.running[ticket.key]
        self.tasks.pop(ticket.key, None)
        timer = self.timers.pop(ticket.key, None)
        if timer is not None:
            timer.cancel()

    def _cancel(self, key: Hashable) -> None:
        if self.queue.withdraw(lambda job: _port_key(job) == key) is not None:
            return  # it never started; nobody waits for it
        ticket = self.running.get(key)
        if ticket is None:
            return
        ticket.cancelled.set()
        task = self.tasks.get(key)
        if task is not None:
            task.cancel()
        else:  # a worker runs it: give the tool a grace to return, then replace the worker
            self._after(ticket, self.grace_s, _Stuck(self._worker_of(ticket), ticket))

    def _timed_out(self, ticket: Ticket) -> None:
        if self.running.get(ticket.key) is not ticket or self.timeout_s is None:
            return  # finished meanwhile
        self.timers.pop(ticket.key, None)
        # Answer first: a tool that listens returns as soon as it is told, and must not win.
        if self.on_timeout is not None and ticket.claim():
            self.directory.tell(ticket.job.reply_to, self.on_timeout(ticket.job, self.timeout_s))
        ticket.cancelled.set()
        task = self.tasks.get(ticket.key)
        if task is not None:
            task.cancel()
        else:
            self._after(ticket, self.grace_s, _Stuck(self._worker_of(ticket), ticket))

    def _worker_of(self, ticket: Ticket) -> int:
        return next((w for w, t in self.assigned.items() if t is ticket), -1)

    def _stuck(self, worker: int, ticket: Ticket) -> tuple[int, Any] | None:
        """The grace of ``ticket``'s job is over: replace its worker if it still runs it; the
        new worker's first ``(worker, job)``, if one waits."""
        if self.assigned.get(worker) is not ticket:
            return None  # it returned meanwhile
        del self.assigned[worker]
        self.abandoned[worker] = self.workers.pop(worker)
        self._done(ticket)
        fresh = self.next_worker
        self.next_worker += 1
        self.workers[fresh] = self._worker(fresh)
        log.warning(
            "the port tool %s did not return within %g s of being told to stop; its worker "
            "was replaced and its thread abandoned (%d tool threads stuck)",
            _name(ticket.job),
            self.grace_s,
            len(self.abandoned),
        )
        if self.on_lost is not None:
            self.directory.tell(EVENTS, self.on_lost(ticket.job, len(self.abandoned)))
        return self.queue.free(fresh)


def _name(job: Any) -> str:
    """A job's tool name, for the log."""
    return str(getattr(job, "name", type(job).__name__))
