"""asyncio access to a runtime: :class:`AsyncRuntime` for FastAPI, aiohttp, Textual and the like.

The actors run on their own threads as always; this module only bridges their answers onto an
event loop. Nothing here blocks the loop: a turn's outcome and every event come back through a
mailbox whose ``tell`` hands the message to the loop with ``call_soon_threadsafe``, and the few
calls that must wait for an actor (start, stop, cancel) wait in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Generator, Iterable
from datetime import datetime
from types import TracebackType
from typing import Any

from actors.core.config import Config
from actors.models.base import ChatModel
from actors.runtime import Runtime
from actors.services.tool_loop import tools_on
from actors.stores.memory import MemorySource
from actors.tools.tool import PortTool
from actors.tracing.base import Tracer
from messages import (
    ApprovalRefused,
    ApprovalRequested,
    ApprovalSettled,
    CancelTurn,
    SubagentStarted,
    TurnEvent,
    TurnOutcome,
    check_session_id,
)

__all__ = ["AsyncRuntime", "AsyncStart"]


class _LoopMailbox:
    """A mailbox at a directory address that resolves an asyncio future on its loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any]) -> None:
        self._loop = loop
        self._future = future

    def tell(self, message: Any) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            self._loop.call_soon_threadsafe(self._resolve, message)

    def _resolve(self, message: Any) -> None:
        if not self._future.done():
            self._future.set_result(message)


_END = object()
"""Put on an event queue when the runtime stops: the iterator ends."""


class _EventFeed:
    """One ``events()`` iterator's queue, fed from the event bus thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, session: str | None) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        # A session's family: the session and every child it spawns, grown as children start.
        self.family: set[str] | None = None if session is None else {session}

    def offer(self, event: TurnEvent) -> None:
        """Called on the bus thread for every event of the runtime."""
        if self.family is not None:
            if isinstance(event, SubagentStarted) and event.session in self.family:
                self.family.add(event.child)
            if event.session not in self.family:
                return
        self.push(event)

    def push(self, item: Any) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody iterates any more
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class AsyncRuntime:
    """A started :class:`~actors.Runtime`, driven from an asyncio event loop::

        async with AsyncRuntime.start(config, model=model) as rt:
            outcome = await rt.run_turn("mm-thread", "hello", timeout=120)

    Cancelling the task that awaits :meth:`run_turn` cancels the turn and its children, as
    :meth:`cancel` does. :meth:`events` iterates over turn events until the runtime stops.
    The underlying thread-side facade is :attr:`runtime`.
    """

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._feeds: set[_EventFeed] = set()
        self._stopped = False

    @staticmethod
    def start(
        config: Config,
        *,
        model: ChatModel | None = None,
        tools: Iterable[PortTool] | None = None,
        memory: MemorySource | None = None,
        clock: Callable[[], datetime] | None = None,
        tracer: Tracer | None = None,
    ) -> AsyncStart:
        """Start a runtime with the arguments of :meth:`Runtime.start`.

        Use the result with ``async with`` (the runtime stops when the block ends) or await it
        (then call :meth:`stop` yourself). The actors start in a worker thread, off the loop.
        """
        options: dict[str, Any] = {} if clock is None else {"clock": clock}
        return AsyncStart(
            lambda: Runtime.start(
                config, model=model, tools=tools, memory=memory, tracer=tracer, **options
            )
        )

    @property
    def context(self) -> Any:
        """The Context actor's ref (``tell`` never blocks; do not ``ask().get()`` on the loop)."""
        return self.runtime.context

    async def run_turn(
        self, session: str, text: str, timeout: float | None = None, *, speaker: str | None = None
    ) -> TurnOutcome:
        """Run one turn of ``session`` and return how it ended, without blocking the loop.

        Raises ``ValueError`` for an invalid session id before anything is stored and
        ``TimeoutError`` after ``timeout`` seconds (the turn goes on). Cancelling the awaiting
        task cancels the turn and every child below it.
        """
        check_session_id(session)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[TurnOutcome] = loop.create_future()
        mailbox = _LoopMailbox(loop, future)
        directory = self.runtime.directory
        address = directory.unique("aio")
        directory.register(address, mailbox)
        try:
            self.runtime.send_turn(session, text, speaker=speaker, reply_to=address)
            try:
                async with asyncio.timeout(timeout):
                    return await asyncio.shield(future)
            except TimeoutError:
                raise TimeoutError(
                    f"the turn of {session} did not end within {timeout} s; it goes on"
                ) from None
            except asyncio.CancelledError:
                if not future.done() and not self._stopped:
                    # tell, not ask: the loop does not wait for the Context's answer
                    self.runtime.context.tell(
                        CancelTurn(session, "the awaiting task was cancelled")
                    )
                raise
        finally:
            directory.unregister(address, mailbox)

    async def cancel(self, session: str, timeout: float = 10.0) -> tuple[str, ...]:
        """Cancel ``session``'s running turn and its children; the ids that were cancelled."""
        check_session_id(session)
        return await asyncio.to_thread(self.runtime.cancel, session, timeout)

    async def pending_approvals(self, timeout: float = 10.0) -> tuple[ApprovalRequested, ...]:
        """The calls waiting for a person's decision, oldest ``at`` first."""
        return await asyncio.to_thread(self.runtime.pending_approvals, timeout)

    async def approve(
        self, session: str, call_id: int, note: str | None = None, timeout: float = 10.0
    ) -> ApprovalSettled | ApprovalRefused:
        """Say yes to a waiting call (see :meth:`Runtime.approve`)."""
        check_session_id(session)
        return await asyncio.to_thread(self.runtime.approve, session, call_id, note, timeout)

    async def deny(
        self, session: str, call_id: int, reason: str, timeout: float = 10.0
    ) -> ApprovalSettled | ApprovalRefused:
        """Say no to a waiting call (see :meth:`Runtime.deny`)."""
        check_session_id(session)
        return await asyncio.to_thread(self.runtime.deny, session, call_id, reason, timeout)

    async def events(self, session: str | None = None) -> AsyncIterator[TurnEvent]:
        """Every turn event from now on (only ``session``'s and its children's, if given).

        The iterator ends when the runtime stops.
        """
        if session is not None:
            check_session_id(session)
        feed = _EventFeed(asyncio.get_running_loop(), session)
        if self._stopped:
            return
        self._feeds.add(feed)
        unsubscribe = self.runtime.subscribe(feed.offer)
        try:
            while True:
                item = await feed.queue.get()
                if item is _END:
                    return
                yield item
        finally:
            unsubscribe()
            self._feeds.discard(feed)

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop every actor (in a worker thread); every event iterator then ends."""
        if self._stopped:
            return
        self._stopped = True
        await asyncio.to_thread(self.runtime.stop, timeout)
        # The bus has stopped: nothing comes after this in any queue.
        for feed in list(self._feeds):
            feed.push(_END)

    async def __aenter__(self) -> AsyncRuntime:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


class AsyncStart:
    """What :meth:`AsyncRuntime.start` returns: use it with ``async with``, or await it."""

    def __init__(self, start: Callable[[], Runtime]) -> None:
        self._start = start
        self._runtime: AsyncRuntime | None = None

    async def _run(self) -> AsyncRuntime:
        # The port runs async def tools on this loop, where the app's futures live.
        with tools_on(asyncio.get_running_loop()):
            runtime = await asyncio.to_thread(self._start)
        return AsyncRuntime(runtime)

    def __await__(self) -> Generator[Any, None, AsyncRuntime]:
        return self._run().__await__()

    async def __aenter__(self) -> AsyncRuntime:
        self._runtime = await self._run()
        return self._runtime

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._runtime is not None:
            await self._runtime.stop()
