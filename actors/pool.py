"""A pool of worker actors that run blocking jobs (model requests, port tools) in parallel.

The router hands each job to an idle worker, or queues it until one is free; a worker runs the
job, tells the result to the job's ``reply_to`` address and reports itself idle. A job in flight
never blocks a session: the session told the router and went on.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pykka

from actors.directory import Directory

__all__ = ["IdleQueue", "PoolRouter", "PoolWorker"]

log = logging.getLogger(__name__)

Handler = Callable[[Any], Any]
"""Runs one job and returns the reply (turning expected failures into reply messages)."""

ErrorReply = Callable[[Any, Exception], Any]
"""The reply to a job whose handler raised anyway: every job is answered."""


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


@dataclass(frozen=True)
class _WorkerIdle:
    worker: int


class PoolWorker(pykka.ThreadingActor):
    """Runs jobs one at a time with ``handler``; owns nothing but its thread."""

    # A worker may be stuck in a request when the runtime stops; it must not keep the process up.
    use_daemon_thread = True

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
        try:
            reply = self.handler(message)
        except Exception as exc:  # a handler bug must neither kill the worker nor lose a reply
            log.exception("pool handler failed on %s", type(message).__name__)
            reply = self.on_error(message, exc)
        self.directory.tell(message.reply_to, reply)
        self.router.tell(_WorkerIdle(self.index))


class PoolRouter(pykka.ThreadingActor):
    """Owns ``size`` workers and spreads jobs over them (see :class:`IdleQueue`)."""

    def __init__(
        self, size: int, handler: Handler, on_error: ErrorReply, directory: Directory
    ) -> None:
        super().__init__()
        self.size = size
        self.handler = handler
        self.on_error = on_error
        self.directory = directory
        self.queue = IdleQueue(size)
        self.workers: list[pykka.ActorRef[Any]] = []

    def on_start(self) -> None:
        self.workers = [
            PoolWorker.start(i, self.handler, self.on_error, self.actor_ref, self.directory)
            for i in range(self.size)
        ]

    def on_stop(self) -> None:
        for worker in self.workers:
            worker.stop(block=False)

    def on_receive(self, message: Any) -> None:
        if isinstance(message, _WorkerIdle):
            start = self.queue.free(message.worker)
        else:
            start = self.queue.submit(message)
        if start is not None:
            worker, job = start
            self.workers[worker].tell(job)
