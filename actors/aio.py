"""asyncio access to a runtime: :class:`AsyncRuntime` for FastAPI, aiohttp, Textual and the like.

The actors run on their own threads as always; this module only bridges their answers onto an
event loop. Nothing here blocks the loop: a turn's outcome and every event come back through a
mailbox that hands the message to the loop through one
:class:`~actors.dispatcher.loop_inbox.LoopInbox` per loop (a burst of answers costs the loop one
wake-up), and the few calls that must wait for an actor (start, stop, cancel, live) wait in a
worker thread.

Its methods take the same arguments as :class:`~actors.Runtime`'s of the same name (a test
compares their signatures), and check them the same way, before anything is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Mapping
from datetime import datetime
from types import TracebackType
from typing import Any

from actors.core.approvals import check_call_id, decision_text
from actors.core.config import Config, check_wait
from actors.core.mcp_config import McpServerConfig
from actors.core.output import decoded
from actors.dispatcher.directory import Mailbox
from actors.dispatcher.loop_inbox import LoopInbox
from actors.models.base import AsyncChatModel, ChatModel
from actors.runtime import Runtime, check_outcome, output_kind
from actors.runtime.checks import _utc_now
from actors.services.tool_loop import tools_on
from actors.stores.memory import MemorySource
from actors.tools.tool import PortTool
from actors.tracing.base import Tracer
from messages import (
    ApprovalRefused,
    ApprovalRequested,
    ApprovalSettled,
    CancelTurn,
    Inspect,
    McpServerDown,
    McpServerUp,
    SubagentStarted,
    TurnEvent,
    TurnOutcome,
    check_session_id,
)

__all__ = ["AsyncRuntime", "AsyncStart"]

log = logging.getLogger(__name__)


Delivery = tuple[Callable[[Any], object], Any]
"""A call for the loop to make: a function and its one argument."""


def _deliver(delivery: Delivery) -> None:
    call, argument = delivery
    call(argument)


def _loop_inbox(
    inboxes: weakref.WeakKeyDictionary[Any, LoopInbox[Delivery]],
) -> LoopInbox[Delivery]:
    """The running loop's inbox in ``inboxes``, made on first use."""
    loop = asyncio.get_running_loop()
    inbox = inboxes.get(loop)
    if inbox is None:
        inbox = inboxes[loop] = LoopInbox(loop, _deliver, "aio")
    return inbox


class _LoopMailbox:
    """A mailbox at a directory address that resolves an asyncio future on its loop."""

    def __init__(self, inbox: LoopInbox[Delivery], future: asyncio.Future[Any]) -> None:
        self._inbox = inbox
        self._future = future

    def tell(self, message: Any) -> None:
        self._inbox.put((self._resolve, message))  # a closed loop: nobody waits any more

    def _resolve(self, message: Any) -> None:
        if not self._future.done():
            self._future.set_result(message)


_END = object()
"""Put on an event queue when the runtime stops: the iterator ends."""


class _EventFeed:
    """One ``events()`` iterator's queue, fed from the event bus thread."""

    def __init__(self, inbox: LoopInbox[Delivery], session: str | None) -> None:
        self.inbox = inbox
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        # A session's family: the session and every child it spawns, grown as children start.
        self.family: set[str] | None = None if session is None else {session}

    def offer(self, event: TurnEvent) -> None:
        """Called on the bus thread for every event of the runtime."""
        if self.family is not None:
            if isinstance(event, SubagentStarted) and event.session in self.family:
                self.family.add(event.child)
            if getattr(event, "session", None) not in self.family:  # an MCP server's too
                return
        self.push(event)

    def push(self, item: Any) -> None:
        self.inbox.put((self.queue.put_nowait, item))  # a closed loop: nobody iterates any more


class AsyncRuntime:
    """A started :class:`~actors.Runtime`, driven from an asyncio event loop::

        async with AsyncRuntime.start(config, model=model) as rt:
            outcome = await rt.run_turn("mm-thread", "hello", timeout=120)

    Cancelling the task that awaits :meth:`run_turn` cancels the turn that task started and its
    children, as :meth:`cancel` does; never another caller's turn (a run_turn refused
    ``busy`` started none). :meth:`events` iterates over turn events until the runtime stops.
    The underlying thread-side facade is :attr:`runtime`.
    """

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._feeds: set[_EventFeed] = set()
        # Per event loop: what actor threads hand it (answers, events), one wake-up a burst.
        self._inboxes: weakref.WeakKeyDictionary[Any, LoopInbox[Delivery]] = (
            weakref.WeakKeyDictionary()
        )
        self._stopped = False
        self._stopping: asyncio.Future[None] | None = None
        # The checks of cancelled run_turn tasks still under way (strong refs: a task that
        # nobody holds may be collected before it ends).
        self._checks: set[asyncio.Task[None]] = set()

    @staticmethod
    def start(
        config: Config,
        *,
        model: ChatModel | AsyncChatModel | None = None,
        tools: Iterable[PortTool] | None = None,
        memory: MemorySource | None = None,
        clock: Callable[[], datetime] = _utc_now,
        tracer: Tracer | None = None,
        mcp: Mapping[str, McpServerConfig] | None = None,
        subscribe: Iterable[Callable[[TurnEvent], Any]] = (),
    ) -> AsyncStart:
        """Start a runtime with the arguments of :meth:`Runtime.start`.

        Use the result with ``async with`` (the runtime stops when the block ends) or await it
        (then call :meth:`stop` yourself). The actors start in a worker thread, off the loop.
        Cancelling the task that awaits the start stops what it started before the
        cancellation goes on, so the home is free again when the task has ended.
        """
        return AsyncStart(
            lambda: Runtime.start(
                config,
                model=model,
                tools=tools,
                memory=memory,
                clock=clock,
                tracer=tracer,
                mcp=mcp,
                subscribe=subscribe,
            )
        )

    @property
    def context(self) -> Any:
        """The Context actor's ref (``tell`` never blocks; do not ``ask().get()`` on the loop)."""
        return self.runtime.context

    async def send_turn(
        self,
        session: str,
        text: str,
        *,
        speaker: str | None = None,
        reply_to: str | None = None,
        agent: str | None = None,
        output: Any = None,
    ) -> None:
        """Start a turn without waiting for it, as :meth:`Runtime.send_turn` does (it only tells
        the Context, so it never blocks the loop); its outcome goes to ``reply_to``, if any."""
        self.runtime.send_turn(
            session, text, speaker=speaker, reply_to=reply_to, agent=agent, output=output
        )

    def future_mailbox(self, future: asyncio.Future[Any]) -> Mailbox:
        """A mailbox to register at a directory address: the first message told it, on any
        thread, resolves ``future`` on the running loop. It goes through the loop's one inbox,
        so the answers of many turns waited on at once wake the loop once a burst."""
        return _LoopMailbox(_loop_inbox(self._inboxes), future)

    async def run_turn(
        self,
        session: str,
        text: str,
        timeout: float | None = None,
        *,
        speaker: str | None = None,
        agent: str | None = None,
        output: Any = None,
    ) -> TurnOutcome:
        """Run one turn of ``session`` and return how it ended, without blocking the loop.

        ``agent`` and ``output`` are :meth:`Runtime.run_turn`'s: a profile for a new session,
        and a typed result (a msgspec Struct or a JSON schema) whose validated value is
        ``TurnCompleted.output``, decoded to that type. Raises what that raises, before
        anything is sent or stored: ``ValueError`` for an invalid session id, a ``timeout``
        that is not a finite number of seconds above 0, or an unknown ``agent``; ``TypeError``
        for text that is not a ``str``. ``ValueError`` too when ``agent`` or the output schema
        is not the stored session's. ``TimeoutError`` after ``timeout`` seconds (the turn goes
        on). Cancelling the awaiting task cancels the turn it started and every child below
        it; a turn it did not start (it was refused ``busy``) is left alone.
        """
        check_session_id(session)
        check_wait(timeout, "timeout")  # before anything is sent: no nan deadline on the loop
        loop = asyncio.get_running_loop()
        future: asyncio.Future[TurnOutcome] = loop.create_future()
        mailbox = _LoopMailbox(_loop_inbox(self._inboxes), future)
        directory = self.runtime.directory
        address = directory.unique("aio")
        directory.register(address, mailbox)
        kept = False  # the mailbox outlives this call while a cancelled task's check runs
        try:
            self.runtime.send_turn(
                session, text, speaker=speaker, reply_to=address, agent=agent, output=output
            )
            try:
                async with asyncio.timeout(timeout):
                    outcome = await asyncio.shield(future)
            except TimeoutError:
                raise TimeoutError(
                    f"the turn of {session} did not end within {timeout} s; it goes on"
                ) from None
            except asyncio.CancelledError:
                if not future.done() and not self._stopped:
                    kept = True
                    check = loop.create_task(
                        self._cancel_if_started(session, future, address, mailbox)
                    )
                    self._checks.add(check)
                    check.add_done_callback(self._checks.discard)
                raise
            kind = output_kind(self.runtime.config, output, agent)
            return decoded(check_outcome(outcome), kind)
        finally:
            if not kept:
                directory.unregister(address, mailbox)

    async def _cancel_if_started(
        self,
        session: str,
        future: asyncio.Future[TurnOutcome],
        address: str,
        mailbox: _LoopMailbox,
    ) -> None:
        """Cancel ``session``'s turn only if the StartTurn this ``future`` waits on holds it.

        The Context answers its messages in order, and refuses a StartTurn (``busy``) the
        moment it takes it: so once it has answered an :class:`~messages.Inspect` sent after
        that StartTurn, a refusal has reached ``future`` (its callback was queued on the loop
        before this task wakes). A future still open then means our turn holds the session.
        """
        try:
            await asyncio.to_thread(self.runtime.context.ask, Inspect(), timeout=10.0)
            if not future.done() and not self._stopped:
                # tell, not ask: the loop does not wait for the Context's answer
                self.runtime.context.tell(CancelTurn(session, "the awaiting task was cancelled"))
        except Exception:  # the runtime is stopping: the Context answers every turn itself
            log.debug("the Context did not answer; the turn of %s was not cancelled", session)
        finally:
            self.runtime.directory.unregister(address, mailbox)

    async def cancel(self, session: str, timeout: float = 10.0) -> tuple[str, ...]:
        """Cancel ``session``'s running turn and its children; the ids that were cancelled."""
        check_session_id(session)
        return await asyncio.to_thread(self.runtime.cancel, session, timeout)

    def mcp_servers(self) -> dict[str, McpServerUp | McpServerDown]:
        """Each ``[mcp.NAME]`` server's last ``McpServerUp`` or ``McpServerDown`` event
        (:meth:`Runtime.mcp_servers`: a read of what the runtime holds, it never blocks)."""
        return self.runtime.mcp_servers()

    async def live(self, timeout: float = 10.0) -> tuple[str, ...]:
        """The ids of the sessions whose actor is live now (:meth:`Runtime.live`)."""
        return await asyncio.to_thread(self.runtime.live, timeout)

    async def wait_family(self, session: str, timeout: float | None = None) -> None:
        """Return once ``session`` and every descendant are idle and no background report for
        them is pending (:meth:`Runtime.wait_family`), without blocking the loop."""
        check_session_id(session)
        await asyncio.to_thread(self.runtime.wait_family, session, timeout)

    async def pending_approvals(self, timeout: float = 10.0) -> tuple[ApprovalRequested, ...]:
        """The calls waiting for a person's decision, oldest ``at`` first."""
        return await asyncio.to_thread(self.runtime.pending_approvals, timeout)

    async def approve(
        self, session: str, call_id: int, note: str | None = None, timeout: float = 10.0
    ) -> ApprovalSettled | ApprovalRefused:
        """Say yes to a waiting call (see :meth:`Runtime.approve`: the same checks, made here
        before anything is told)."""
        check_session_id(session)
        check_call_id(call_id)
        if note is not None:
            decision_text(note, "the note")
        return await asyncio.to_thread(self.runtime.approve, session, call_id, note, timeout)

    async def deny(
        self, session: str, call_id: int, reason: str, timeout: float = 10.0
    ) -> ApprovalSettled | ApprovalRefused:
        """Say no to a waiting call (see :meth:`Runtime.deny`: the same checks, made here
        before anything is told)."""
        check_session_id(session)
        check_call_id(call_id)
        decision_text(reason, "the reason")
        return await asyncio.to_thread(self.runtime.deny, session, call_id, reason, timeout)

    async def events(self, session: str | None = None) -> AsyncIterator[TurnEvent]:
        """Every turn event from now on (only ``session``'s and its children's, if given).

        The iterator ends when the runtime stops.
        """
        if session is not None:
            check_session_id(session)
        feed = _EventFeed(_loop_inbox(self._inboxes), session)
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
        """Stop every actor (in a worker thread); every event iterator then ends.

        A task cancelled while it awaits the stop lets the stop end first (the home is then
        free for the next start), and only then goes on cancelled; a second call waits for
        the first call's stop.
        """
        if self._stopping is None:
            self._stopped = True
            self._stopping = asyncio.ensure_future(self._stop(timeout))
        stopping = self._stopping
        try:
            await asyncio.shield(stopping)
        except asyncio.CancelledError:
            await _outlast(stopping)
            raise

    async def _stop(self, timeout: float) -> None:
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
        # The port runs async def tools on this loop, where the app's futures live (the
        # thread's task copies this context).
        with tools_on(asyncio.get_running_loop()):
            starting = asyncio.ensure_future(asyncio.to_thread(self._start))
        try:
            runtime = await asyncio.shield(starting)
        except asyncio.CancelledError:
            # The start goes on in its thread: stop what it starts, and only then let the
            # cancellation go on, so nothing is left running and the home is free.
            await _outlast(asyncio.ensure_future(_stop_when_started(starting)))
            raise
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


async def _outlast(work: asyncio.Future[Any]) -> None:
    """Wait until ``work`` has ended, whatever cancels the waiting task meanwhile (the caller
    goes on cancelled afterwards). A failure of ``work`` has logged why and is not raised."""
    while not work.done():
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.shield(work)
    if not work.cancelled():
        work.exception()  # retrieved: never "exception was never retrieved"


async def _stop_when_started(starting: asyncio.Future[Runtime]) -> None:
    """Stop the runtime ``starting`` gives, once it has one (a failed start left nothing)."""
    try:
        runtime = await starting
    except Exception:
        return
    await asyncio.to_thread(runtime.stop)
