"""The loop ``async def`` tools run on: the port's own (:class:`ToolLoop`), or the
application's (:class:`AppLoop`) when the runtime was started by ``AsyncRuntime``.

The port's own loop is one daemon thread per runtime, started with the first async call and
stopped with the port. A tool coroutine that awaits I/O holds no thread while it waits, so a
thousand slow async tools cost a thousand tasks, not a thousand threads.

An asyncio application's futures, events and clients belong to its own loop; a tool awaiting
one from another loop fails or never wakes. So ``AsyncRuntime.start`` names its loop with
:func:`tools_on` while the runtime starts, and the port then runs async tools there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import logging
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

__all__ = ["AppLoop", "ToolLoop", "app_loop", "tools_on"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_APP_LOOP: contextvars.ContextVar[asyncio.AbstractEventLoop | None] = contextvars.ContextVar(
    "loopd_app_loop", default=None
)


@contextlib.contextmanager
def tools_on(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """A runtime started inside this block (in this context, or a thread given a copy of it,
    as ``asyncio.to_thread`` gives) runs its ``async def`` tools on ``loop``."""
    token = _APP_LOOP.set(loop)
    try:
        yield
    finally:
        _APP_LOOP.reset(token)


def app_loop() -> asyncio.AbstractEventLoop | None:
    """The loop :func:`tools_on` named here, or None: the port makes a loop of its own."""
    return _APP_LOOP.get()


class ToolLoop:
    """An asyncio loop on its own thread; :meth:`submit` runs a coroutine there."""

    def __init__(self, name: str = "loopd-tools") -> None:
        self._loop = asyncio.new_event_loop()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        while not self._stopping:
            try:
                self._loop.run_forever()
            except BaseException:  # SystemExit out of a task: the loop must outlive it
                log.exception("the port's event loop was interrupted; it goes on")

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the loop; its future is done when the coroutine is."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel what still runs and end the loop's thread."""
        if self._loop.is_closed():
            return

        def cancel_all() -> None:
            self._stopping = True
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            self._loop.call_soon(self._loop.stop)

        self._loop.call_soon_threadsafe(cancel_all)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._loop.close()


class AppLoop:
    """The application's running loop, lent to the port: :meth:`submit` runs a coroutine
    there. The port cancels its own tasks when it stops; the loop is the application's, so
    :meth:`stop` leaves it alone."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the application's loop. ``RuntimeError`` if that loop is closed
        (``coro`` is closed then, never left unawaited)."""
        try:
            return asyncio.run_coroutine_threadsafe(coro, self._loop)
        except RuntimeError:
            coro.close()
            raise RuntimeError("the application's event loop is closed") from None

    def stop(self, timeout: float = 5.0) -> None:
        """Nothing to stop: the loop belongs to the application."""
