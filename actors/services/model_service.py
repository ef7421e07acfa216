"""The model service: every model request of a runtime as a task of one asyncio loop.

It stands at the ``model`` address of the
:class:`~actors.dispatcher.directory.Directory`. ``tell`` hands a message to its loop (a
:class:`~actors.dispatcher.loop_inbox.LoopInbox`: the messages of a burst, one wake-up of the
loop); the loop runs in one thread of its own. For
each :class:`~messages.ModelRequest` it starts a task that

1. takes a free slot of the request's pool from the :class:`~actors.core.slots.SlotTable`
   (preferring the slot the session used last), waiting while all are busy;
2. takes one of ``concurrency`` permits (the bound on requests in flight);
3. runs the request: an async model's ``acomplete`` on the loop itself, a sync model's
   ``complete`` on a bounded pool of daemon threads (on the loop too if the model's
   ``blocking`` attribute is False);
4. tells the :class:`~messages.ModelAnswer` (with its slot and the wait) or
   :class:`~messages.ModelError` to the request's ``reply_to``, and frees the slot.

:class:`~messages.CancelModelRequest` cancels the task: a request still waiting leaves the
queue, a request in flight has its connection closed, and nothing is answered (nobody waits).
A slot whose request was cut off stays out of use for ``model.disconnect_grace_s``, the time the
server needs to notice and stop generating. :meth:`ModelService.stop` cancels every task,
closes the loop's connections and ends the thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import logging
import queue
import threading
import traceback
from collections.abc import Awaitable, Callable, Hashable, Mapping
from contextlib import AbstractContextManager
from typing import Any

import msgspec

from actors.core.slots import Grant, SlotTable
from actors.dispatcher.directory import EVENTS, Directory
from actors.dispatcher.loop_inbox import LoopInbox
from actors.models.base import AsyncChatModel, ChatModel, ModelFailure
from messages import (
    CancelModelRequest,
    ModelAnswer,
    ModelError,
    ModelReply,
    ModelRequest,
    TextDelta,
)

__all__ = ["DaemonExecutor", "ModelService", "model_error"]

log = logging.getLogger(__name__)

_Key = tuple[str, int]


def _unchanged(text: str) -> str:
    return text


def model_error(
    request: ModelRequest, exc: BaseException, scrub: Callable[[str], str] = _unchanged
) -> ModelError:
    """The answer to a request whose model raised something other than a ModelFailure;
    ``scrub`` (a :func:`~actors.core.text.redact` bound to the secrets) cleans the text."""
    detail = scrub(f"the model client failed: {type(exc).__name__}: {exc}")
    return ModelError(request.session, request.request_id, detail)


def _on_loop(complete: Callable[..., ModelAnswer]) -> Callable[..., Awaitable[ModelAnswer]]:
    async def acomplete(request: ModelRequest, *on_text: Callable[[str], None]) -> ModelAnswer:
        return complete(request, *on_text)

    return acomplete


class DaemonExecutor(concurrent.futures.Executor):
    """Up to ``size`` daemon threads, started as work needs them, for a sync model's calls.

    Daemon threads, unlike ``ThreadPoolExecutor``'s, never hold up the interpreter's exit: a
    sync model's call that blocks (a test script waiting on a barrier) cannot be interrupted,
    only left behind. ``shutdown`` drops queued work and joins the idle threads; a call
    already running ends when it returns, and its thread with it.
    """

    def __init__(self, size: int, name: str = "loopd-model-sync") -> None:
        self._size = size
        self._name = name
        self._work: queue.SimpleQueue[
            tuple[concurrent.futures.Future[Any], Callable[..., Any], tuple[Any, ...]] | None
        ] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._busy: set[threading.Thread] = set()
        self._idle = 0
        self._shut = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args)`` on a thread of the pool; returns its future."""
        if kwargs:
            raise TypeError("DaemonExecutor.submit takes positional arguments only")
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            if self._shut:
                raise RuntimeError("the executor is shut down")
            self._work.put((future, fn, args))
            if self._idle == 0 and len(self._threads) < self._size:
                thread = threading.Thread(
                    target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            else:
                self._idle -= 1 if self._idle else 0
        return future

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            item = self._work.get()
            if item is None:
                return
            future, fn, args = item
            with self._lock:
                if self._shut:  # taken after shutdown's count of the busy: dropped as queued
                    future.cancel()
                    return
                self._busy.add(me)
            result: Any = None
            error: BaseException | None = None
            running = future.set_running_or_notify_cancel()
            if running:
                try:
                    result = fn(*args)
                except BaseException as exc:
                    error = exc
            # Out of the busy set before the future is answered: whoever sees the answer and
            # then shuts the pool down joins this thread rather than leaving it behind.
            with self._lock:
                self._busy.discard(me)
                shut = self._shut
                if not shut:
                    self._idle += 1
            if running:
                if error is None:
                    future.set_result(result)
                else:
                    future.set_exception(error)
                    del error  # no cycle through the traceback's frame
            if shut:
                return

    def threads(self) -> list[threading.Thread]:
        """The pool's threads that are still alive."""
        with self._lock:
            return [t for t in self._threads if t.is_alive()]

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Drop queued work and let idle threads end; with ``wait``, join them.

        A thread inside a call is not waited for (the call may block for ever): it ends when
        the call returns.
        """
        with self._lock:
            self._shut = True
            threads = list(self._threads)
            busy = set(self._busy)
        while True:
            try:
                item = self._work.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in threads:
            self._work.put(None)
        if wait:
            for thread in threads:
                if thread not in busy:
                    thread.join()


class ModelService:
    """Runs every model request of a runtime as a task on one asyncio loop in one thread.

    ``pools`` maps ``main`` and ``background`` to their slot ids; with None (or a model whose
    ``uses_slots`` is false) requests take no slot and run as they come, up to
    ``concurrency``. ``grace_s`` is how long a cut-off request's slot stays out of use.
    Every error text (a ``ModelError``'s detail, which becomes the turn's and the events' text,
    and the log line) goes through ``scrub`` first, so an API key or URL credentials echoed by a
    server or an HTTP library never leave loopd. ``lend_thread`` (the sessions' dispatcher's
    ``lend``) is entered around an answer told while no other request is in flight: the session
    handles it on the loop's thread instead of a dispatcher thread being woken for it.
    """

    def __init__(
        self,
        model: ChatModel | AsyncChatModel,
        directory: Directory,
        *,
        concurrency: int,
        pools: Mapping[str, tuple[int, ...]] | None = None,
        grace_s: float = 3.0,
        scrub: Callable[[str], str] = _unchanged,
        name: str = "loopd-model",
        lend_thread: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
    ) -> None:
        self.model = model
        self.lend_thread = lend_thread
        self.scrub = scrub
        self.directory = directory
        self.concurrency = concurrency
        self.grace_s = grace_s
        uses_slots = getattr(model, "uses_slots", True)
        self.slots = SlotTable(pools) if pools is not None and uses_slots else None
        acomplete = getattr(model, "acomplete", None)
        self._acomplete: Callable[..., Awaitable[ModelAnswer]] | None = (
            acomplete if inspect.iscoroutinefunction(acomplete) else None
        )
        # A model that streams takes a callback for each piece of text (model.stream).
        self._streams = bool(getattr(model, "streams", False))
        if self._acomplete is None and getattr(model, "blocking", True) is False:
            # A sync model that promises never to block (a scripted answer) is called on the
            # loop itself, as the HTTP client's coroutine is: no thread hop each way.
            sync: Any = model
            self._acomplete = _on_loop(sync.complete)
        self._executor = None if self._acomplete else DaemonExecutor(concurrency)
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inbox: LoopInbox[Any] | None = None  # what tell hands the loop, a burst a wake-up
        self._thread: threading.Thread | None = None
        self._stopping = False
        # Set on the loop by stop().
        self._stop_requested: asyncio.Event | None = None
        self._tasks: dict[_Key, asyncio.Task[None]] = {}
        self._waiters: dict[_Key, asyncio.Future[int]] = {}
        self._permits: asyncio.Semaphore | None = None
        self._wake_handle: asyncio.TimerHandle | None = None

    # Life.

    def start(self) -> ModelService:
        """Start the loop's thread; returns once the loop runs."""
        ready = threading.Event()
        # A daemon: stop() ends and joins it, but a runtime someone forgot to stop must not keep
        # the process alive.
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name=self._name, daemon=True
        )
        self._thread.start()
        ready.wait()
        return self

    def _run(self, ready: threading.Event) -> None:
        asyncio.run(self._main(ready))

    async def _main(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._inbox = LoopInbox(self._loop, self._receive, self._name)
        self._stop_requested = asyncio.Event()
        self._permits = asyncio.Semaphore(self.concurrency)
        ready.set()
        await self._stop_requested.wait()
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._wake_handle is not None:
            self._wake_handle.cancel()
        aclose = getattr(self.model, "aclose", None)
        if aclose is not None and inspect.iscoroutinefunction(aclose):
            try:
                await aclose()
            except Exception:
                log.warning("closing the model's connections failed", exc_info=True)

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel every request (closing its connection), end the loop and join its thread.

        A sync model's call that blocks is left to end on its daemon thread.
        """
        with self._lock:
            self._stopping = True
            loop, thread = self._loop, self._thread
        if loop is not None and self._stop_requested is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended already
                loop.call_soon_threadsafe(self._stop_requested.set)
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                log.warning("the model service's thread did not end within %s s", timeout)
        if self._executor is not None:
            # Idle pool threads are joined, so a stopped runtime leaves none behind.
            self._executor.shutdown(wait=True, cancel_futures=True)

    def threads(self) -> list[threading.Thread]:
        """The service's threads still alive: the loop's, and a sync model's pool."""
        alive = [self._thread] if self._thread is not None and self._thread.is_alive() else []
        return alive + (self._executor.threads() if self._executor is not None else [])

    # Messages.

    def tell(self, message: Any) -> None:
        """Hand ``message`` to the loop; raises ``RuntimeError`` once the service stops (the
        directory counts that as a dead letter)."""
        with self._lock:
            if self._stopping or self._inbox is None:
                raise RuntimeError("the model service is stopped")
            if not self._inbox.put(message):
                raise RuntimeError("the model service's loop is closed")

    def _receive(self, message: Any) -> None:
        if isinstance(message, ModelRequest):
            key = (message.session, message.request_id)
            if key in self._tasks or self._stop_requested is None:
                log.warning("model request %s is in flight already; ignored", key)
                return
            if self._stop_requested.is_set():
                return
            task = asyncio.get_running_loop().create_task(self._serve(message))
            self._tasks[key] = task
            task.add_done_callback(functools.partial(self._forget, key))
        elif isinstance(message, CancelModelRequest):
            running = self._tasks.get((message.session, message.request_id))
            if running is not None:
                running.cancel()
        else:
            log.warning("model service: unexpected message %r", message)

    def _forget(self, key: _Key, task: asyncio.Task[None]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]

    # One request.

    async def _serve(self, request: ModelRequest) -> None:
        try:
            await self._serve_request(request)
        except Exception as exc:  # a bug here must not leave the session waiting
            log.exception("model service failed on request %s", request.request_id)
            self.directory.tell(request.reply_to, model_error(request, exc))

    async def _serve_request(self, request: ModelRequest) -> None:
        key = (request.session, request.request_id)
        loop = asyncio.get_running_loop()
        began = loop.time()
        slot = await self._take_slot(key, request)
        handed = False  # from the model's start on, _run_model frees the slot
        try:
            assert self._permits is not None
            async with self._permits:
                waited = loop.time() - began
                if slot is not None:
                    request = msgspec.structs.replace(request, slot=slot)
                handed = True
                reply = await self._run_model(request, slot)
            if isinstance(reply, ModelAnswer):
                reply = msgspec.structs.replace(reply, slot=slot, slot_wait_s=round(waited, 6))
            # With no other request in flight, the session handles its answer here, on the
            # loop's thread; a busy loop leaves it to the dispatcher, to get back to its I/O.
            lend = self.lend_thread if len(self._tasks) <= 1 else contextlib.nullcontext
            with lend():
                self.directory.tell(request.reply_to, reply)
        finally:
            if slot is not None and not handed:
                # Cancelled while waiting for a permit: the slot never saw the request.
                self._release(slot, key, cut=False)

    async def _take_slot(self, key: _Key, request: ModelRequest) -> int | None:
        if self.slots is None or request.options.backend == "openai":
            return None  # an OpenAI-style server has no slots: its requests run as they come
        preferred = request.slot if request.prefer_slot else None
        slot = self.slots.request(key, request.pool, preferred)
        if slot is not None:
            return slot
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters[key] = waiter
        try:
            return await waiter
        except asyncio.CancelledError:
            if not self.slots.withdraw(key) and waiter.done() and not waiter.cancelled():
                # Granted in the same moment it was cancelled: give the slot back.
                self._release(waiter.result(), key, cut=False)
            raise
        finally:
            self._waiters.pop(key, None)

    async def _run_model(self, request: ModelRequest, slot: int | None) -> ModelReply:
        """Run the model; the slot is freed when the request is over at the server."""
        key = (request.session, request.request_id)
        if self._acomplete is None:
            return await self._run_sync(request, slot, key)
        cut = True
        try:
            answer = await self._acomplete(request, *self._text_sink(request))
            cut = False
            return answer
        except ModelFailure as exc:
            cut = exc.cut  # a last attempt cut off: the server may still generate on the slot
            return self._failed(request, exc)
        except Exception as exc:
            log.error("model client failed: %s", self.scrub(traceback.format_exc()))
            return model_error(request, exc, self.scrub)
        finally:
            if slot is not None:
                self._release(slot, key, cut=cut)

    async def _run_sync(self, request: ModelRequest, slot: int | None, key: _Key) -> ModelReply:
        assert self._executor is not None
        loop = asyncio.get_running_loop()
        model: Any = self.model
        future = self._executor.submit(model.complete, request, *self._text_sink(request))
        if slot is not None:
            # A thread cannot be interrupted: the slot is busy until the call really returns.
            def done(_f: concurrent.futures.Future[Any]) -> None:
                with contextlib.suppress(RuntimeError):  # the loop has ended
                    loop.call_soon_threadsafe(self._release, slot, key, False)

            future.add_done_callback(done)
        try:
            answer: ModelAnswer = await asyncio.wrap_future(future)
            return answer
        except ModelFailure as exc:
            return self._failed(request, exc)
        except Exception as exc:
            log.error("model client failed: %s", self.scrub(traceback.format_exc()))
            return model_error(request, exc, self.scrub)

    def _text_sink(self, request: ModelRequest) -> tuple[Callable[[str], None], ...]:
        """The ``on_text`` argument of a streamed request (none for another): each piece of
        text becomes a ``TextDelta`` event of the request's session."""
        if not (request.options.stream and self._streams):
            return ()
        directory, session = self.directory, request.session

        def on_text(text: str) -> None:
            directory.tell(EVENTS, TextDelta(session=session, text=text))

        return (on_text,)

    def _failed(self, request: ModelRequest, exc: ModelFailure) -> ModelError:
        """The ModelError of a failure, with its scrubbed text and its context flags."""
        return ModelError(
            request.session,
            request.request_id,
            self.scrub(str(exc)),
            context_exceeded=exc.context_exceeded,
            context_tokens=exc.context_tokens,
        )

    # Slots.

    def _release(self, slot: int, key: Hashable, cut: bool) -> None:
        if self.slots is None:
            return
        loop = asyncio.get_running_loop()
        if cut and self.grace_s > 0:
            self.slots.release(slot, key, free_at=loop.time() + self.grace_s)
            self._schedule_wake()
            return
        self._grant(self.slots.release(slot, key))

    def _schedule_wake(self) -> None:
        assert self.slots is not None
        when = self.slots.next_wake()
        if when is None:
            return
        if self._wake_handle is not None:
            if self._wake_handle.when() <= when:
                return
            self._wake_handle.cancel()
        self._wake_handle = asyncio.get_running_loop().call_at(when, self._wake)

    def _wake(self) -> None:
        assert self.slots is not None
        self._wake_handle = None
        self._grant(self.slots.wake(asyncio.get_running_loop().time()))
        self._schedule_wake()

    def _grant(self, grants: list[Grant]) -> None:
        for grant in grants:
            assert isinstance(grant.ticket, tuple)
            waiter = self._waiters.get(grant.ticket)
            if waiter is None or waiter.done():
                # Its task is gone: the slot goes straight back.
                assert self.slots is not None
                self._grant(self.slots.release(grant.slot, grant.ticket))
                continue
            waiter.set_result(grant.slot)
