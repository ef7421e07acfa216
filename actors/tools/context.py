"""What a port tool may know about the call it runs (:class:`ToolContext`), and the ticket a
call travels with through the port pool (:class:`Ticket`: its deadline and cancel signal)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ["Ticket", "ToolContext", "await_future"]

T = TypeVar("T")


@dataclass(frozen=True)
class ToolContext:
    """The call a tool runs for. A tool function gets it in a parameter annotated
    ``ToolContext``::

        @port_tool
        def delete_file(path: str, ctx: ToolContext) -> str:
            \"\"\"Delete a file.\"\"\"
            if ctx.untrusted:
                return "Refused: this session has read untrusted data."
            ...

    ``cancelled`` is set when nobody waits for the result any more: the turn was cancelled,
    the call outlived ``port.timeout_s``, or the runtime is stopping. A tool that runs long
    should check it (or ``wait`` on it) and return early; what it returns then is dropped.
    """

    session: str
    """The session whose model made the call."""
    call_id: int
    """The call's id in that session."""
    deadline: float | None = None
    """``time.monotonic()`` by which the call must be done (``port.timeout_s``), or None."""
    cancelled: threading.Event = field(default_factory=threading.Event)
    """Set once the call's result is no longer wanted."""
    untrusted: bool = False
    """The session has read untrusted data: refuse what it should not be trusted with."""

    def remaining(self) -> float | None:
        """Seconds left before the deadline (never negative), or None without one."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    async def await_future(self, future: asyncio.Future[T] | concurrent.futures.Future[T]) -> T:
        """Wait for ``future`` from an ``async def`` tool, whichever loop or thread resolves it.

        An ``asyncio.Future`` belongs to the loop that made it, and awaiting it from another
        loop fails; a tool of a :class:`~actors.Runtime` runs on the port's own loop, not the
        application's. This waits for a future of any loop (or a ``concurrent.futures.Future``)
        and returns its result, or raises its exception. Cancelling the tool stops the wait,
        not the future: it belongs to whoever made it.
        """
        return await await_future(future)


@dataclass
class Ticket:
    """One job on its way through the pool."""

    job: Any
    key: Hashable
    deadline: float | None = None
    """``time.monotonic()`` by which the job should be done, or None."""
    cancelled: threading.Event = field(default_factory=threading.Event)
    """Set when nobody waits for the job's result any more: the job should stop."""
    _answered: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def claim(self) -> bool:
        """True for the first caller only: that one answers the job."""
        with self._lock:
            if self._answered:
                return False
            self._answered = True
            return True


async def await_future(future: asyncio.Future[T] | concurrent.futures.Future[T]) -> T:
    """Await ``future`` on the running loop, whatever loop it belongs to (see
    :meth:`ToolContext.await_future`)."""
    if isinstance(future, concurrent.futures.Future):
        return await asyncio.wrap_future(future)
    if future.done():  # settled already: its loop need not run (or even be open) any more
        return future.result()
    here = asyncio.get_running_loop()
    there = future.get_loop()
    if there is here:
        return await future
    mine: asyncio.Future[T] = here.create_future()

    def settle(done: asyncio.Future[T]) -> None:  # on this loop: copy the outcome over
        if mine.done():
            return  # the waiter gave up
        if done.cancelled():
            mine.cancel()
        elif (exc := done.exception()) is not None:
            mine.set_exception(exc)
        else:
            mine.set_result(done.result())

    def copy(done: asyncio.Future[T]) -> None:  # on the future's loop, when it is done
        with contextlib.suppress(RuntimeError):  # this loop closed: nobody waits any more
            here.call_soon_threadsafe(settle, done)

    # asyncio futures are not thread-safe: add the callback on the future's own loop.
    there.call_soon_threadsafe(future.add_done_callback, copy)
    return await mine
