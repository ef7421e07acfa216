"""The port's pool of worker actors, which run blocking jobs (port tools) in parallel.

The router hands each job to an idle worker, or queues it until one is free; a worker runs the
job, tells the result to the job's ``reply_to`` address and reports itself idle. A job in flight
never blocks a session: the session told the router and went on.

Each job travels with a :class:`Ticket`: its cancel signal (set when the session stops waiting,
when the job outlives the pool's time limit, or when the pool stops) and the rule that a job is
answered once. A job past the time limit is answered by the router with ``on_timeout``'s reply;
the worker's late reply is then dropped.

A job for an ``async def`` tool takes no worker: the router starts it as a task on the pool's
event loop (:class:`~actors.services.tool_loop.ToolLoop`), with the same ticket, time limit
and cancel;
cancelling it cancels the task.
"""

from __future__ import annotations

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

from actors.dispatcher.directory import Directory
from actors.dispatcher.inbox import SimpleInbox
from actors.services.tool_loop import ToolLoop
from actors.tools.context import Ticket
from messages import CancelPortCall

__all__ = ["IdleQueue", "PoolWorker", "PortRouter"]

log = logging.getLogger(__name__)


Handler = Callable[[Any, Ticket], Any]
"""Runs one job and returns the reply (turning expected failures into reply messages)."""

ErrorReply = Callable[[Any, Exception], Any]
"""The reply to a job whose handler raised anyway: every job is answered."""

TimeoutReply = Callable[[Any, float], Any]
"""The reply to a job that outlived the pool's time limit (given in seconds)."""

AsyncJob = Callable[[Any, Ticket], Coroutine[Any, Any, Any] | None]
"""The coroutine that answers a job on the event loop (an ``async def`` tool), else None."""


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
    key: Hashable


@dataclass(frozen=True)
class _Run:
    ticket: Ticket


@dataclass(frozen=True)
class _TimedOut:
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
    ) -> None:
        super().__init__()
        self.index = index
        self.handler = handler
        self.on_error = on_error
        self.router = router
        self.directory = directory

    def on_receive(self, message: Any) -> None:
        if not isinstance(message, _Run):
            log.warning("pool worker: unexpected message %r", message)
            return
        ticket = message.ticket
        job = ticket.job
        try:
            reply = self.handler(job, ticket)
        except Exception as exc:  # a handler bug must neither kill the worker nor lose a reply
            log.exception("pool handler failed on %s", type(job).__name__)
            reply = self.on_error(job, exc)
        if ticket.claim():  # not answered already (timed out)
            self.directory.tell(job.reply_to, reply)
        self.router.tell(_WorkerIdle(self.index, ticket.key))


def _port_key(job: Any) -> Hashable:
    return (job.session, job.call_id)


class PortRouter(pykka.ThreadingActor):
    """Owns ``size`` workers and spreads port calls over them (see :class:`IdleQueue`).

    :class:`~messages.CancelPortCall` drops a queued call, or sets the cancel signal of a
    running one. With ``timeout_s``, a call still running after that long is answered with
    ``on_timeout``'s reply and its cancel signal is set; its worker is busy until the tool
    returns.
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
    ) -> None:
        super().__init__()
        self.size = size
        self.handler = handler
        self.on_error = on_error
        self.directory = directory
        self.timeout_s = timeout_s
        self.on_timeout = on_timeout
        self.queue = IdleQueue(size)
        self.workers: list[pykka.ActorRef[Any]] = []
        self.running: dict[Hashable, Ticket] = {}
        self.timers: dict[Hashable, threading.Timer] = {}
        self.async_job = async_job
        self.loop: ToolLoop | None = None  # started with the first async job
        self.tasks: dict[Hashable, concurrent.futures.Future[Any]] = {}

    def on_start(self) -> None:
        self.workers = [
            PoolWorker.start(i, self.handler, self.on_error, self.actor_ref, self.directory)
            for i in range(self.size)
        ]

    def on_stop(self) -> None:
        for timer in self.timers.values():
            timer.cancel()
        for ticket in self.running.values():
            ticket.cancelled.set()  # a tool that listens stops now
        for worker in self.workers:
            worker.stop(block=False)
        if self.loop is not None:
            self.loop.stop()  # cancels the async tools still running

    def on_receive(self, message: Any) -> None:
        if isinstance(message, _WorkerIdle):
            self._done(message.key)
            start = self.queue.free(message.worker)
        elif isinstance(message, CancelPortCall):
            self._cancel((message.session, message.call_id))
            return
        elif isinstance(message, _TimedOut):
            self._timed_out(message.ticket)
            return
        elif isinstance(message, _AsyncDone):
            if message.ticket.claim():
                self.directory.tell(message.ticket.job.reply_to, message.reply)
            self._done(message.ticket.key)
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

    def _track(self, ticket: Ticket) -> None:
        self.running[ticket.key] = ticket
        if self.timeout_s is not None:
            timer = threading.Timer(self.timeout_s, self.actor_ref.tell, [_TimedOut(ticket)])
            timer.daemon = True
            self.timers[ticket.key] = timer
            timer.start()

    def _run(self, worker: int, job: Any) -> None:
        ticket = self._ticket(job)
        self._track(ticket)
        self.workers[worker].tell(_Run(ticket))

    def _ran_async(self, job: Any) -> bool:
        """Start ``job`` on the event loop if it is an async tool's; False if it is not."""
        if self.async_job is None:
            return False
        ticket = self._ticket(job)
        coro = self.async_job(job, ticket)
        if coro is None:
            return False
        self._track(ticket)
        if self.loop is None:
            self.loop = ToolLoop()
        task = self.loop.submit(coro)
        self.tasks[ticket.key] = task
        router = self.actor_ref

        def finished(done: concurrent.futures.Future[Any]) -> None:
            try:
                reply = done.result()
            except concurrent.futures.CancelledError:  # cancelled, timed out or stopping
                reply = self.on_error(job, RuntimeError("it was cancelled"))
            except Exception as exc:  # answered all the same
                reply = self.on_error(job, exc)
            with contextlib.suppress(pykka.ActorDeadError):  # a stopped pool: nobody waits
                router.tell(_AsyncDone(ticket, reply))

        task.add_done_callback(finished)
        return True

    def _done(self, key: Hashable) -> None:
        self.tasks.pop(key, None)
        self.running.pop(key, None)
        timer = self.timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def _cancel(self, key: Hashable) -> None:
        if self.queue.withdraw(lambda job: _port_key(job) == key) is not None:
            return  # it never started; nobody waits for it
        ticket = self.running.get(key)
        if ticket is not None:
            ticket.cancelled.set()
            task = self.tasks.get(key)
            if task is not None:
                task.cancel()

    def _timed_out(self, ticket: Ticket) -> None:
        if self.running.get(ticket.key) is not ticket or self.timeout_s is None:
            return  # finished meanwhile
        self.timers.pop(ticket.key, None)
        ticket.cancelled.set()
        task = self.tasks.get(ticket.key)
        if task is not None:
            task.cancel()
        if self.on_timeout is not None and ticket.claim():
            self.directory.tell(ticket.job.reply_to, self.on_timeout(ticket.job, self.timeout_s))
