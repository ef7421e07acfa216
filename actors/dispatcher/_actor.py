"""The dispatched actor type and its mailbox, built on the hooks pykka's ``Actor`` documents."""

from __future__ import annotations

import logging
import sys
import threading
from collections import deque
from types import TracebackType
from typing import TYPE_CHECKING, Any

import pykka
from pykka import ActorDeadError, ActorRegistry, ThreadingFuture
from pykka._envelope import Envelope
from pykka.messages import _ActorStop

from actors.dispatcher._pool import Dispatcher, DispatcherClosed

if TYPE_CHECKING:
    from pykka._actor import ActorInbox

__all__ = ["DispatchedActor"]

log = logging.getLogger("pykka")  # where pykka logs its own actors' failures

_NEW, _OPEN, _CLOSED = 0, 1, 2


def _refuse(envelope: Envelope[Any], actor: pykka.Actor) -> None:
    """Answer a message the actor will never handle, as pykka answers one left at its end."""
    if envelope.reply_to is None:
        return
    if isinstance(envelope.message, _ActorStop):
        envelope.reply_to.set(None)  # "stopped, or being stopped": stop() answers True
        return
    dead = ActorDeadError(f"{actor.actor_ref} stopped before handling the message")
    envelope.reply_to.set_exception(exc_info=(ActorDeadError, dead, None))


_RECENT = 64
"""Registry entries :func:`_unregister` looks through first, from the newest back."""


def _unregister(ref: pykka.ActorRef[Any]) -> None:
    """``ActorRegistry.unregister(ref)``, without its two scans of the whole registry.

    pykka keeps the registry as a list in start order, and its ``unregister`` scans it twice
    (``in``, then ``remove``). With 100,000 live sessions that is about 3 ms for every child
    that stops, though a child was registered a moment ago, near the end. So the newest
    ``_RECENT`` entries are searched first, then the rest, once. Should pykka keep its registry
    some other way, its own method is used.

    It logs what pykka's method logs, after the lock as pykka does: ``Unregistered <ref>`` at
    DEBUG on the ``pykka`` logger, with `` (not found in registry)`` if it was not there.
    """
    refs = getattr(ActorRegistry, "_actor_refs", None)
    lock = getattr(ActorRegistry, "_actor_refs_lock", None)
    if type(refs) is not list or lock is None:
        ActorRegistry.unregister(ref)
        return
    with lock:
        start = max(0, len(refs) - _RECENT)
        try:
            index = refs.index(ref, start)
        except ValueError:
            try:
                index = refs.index(ref, 0, start)
            except ValueError:
                index = -1
        if index >= 0:
            del refs[index]
    # The same text as pykka's f-string, formatted only when DEBUG is on: this is on the path
    # of every actor that stops.
    if index >= 0:
        log.debug("Unregistered %s", ref)
    else:
        log.debug("Unregistered %s (not found in registry)", ref)


def _receive(actor: pykka.Actor, envelope: Envelope[Any]) -> None:
    """Handle one message the way pykka's own actor loop does."""
    try:
        response = actor._handle_receive(envelope.message)
        if envelope.reply_to is not None:
            envelope.reply_to.set(response)
    except Exception:
        if envelope.reply_to is not None:
            log.info(f"Exception returned from {actor} to caller:", exc_info=sys.exc_info())
            envelope.reply_to.set_exception()
        else:
            actor._handle_failure(*sys.exc_info())
            try:
                actor.on_failure(*sys.exc_info())
            except Exception:
                actor._handle_failure(*sys.exc_info())
    except BaseException:
        # As pykka does: stop this actor and every other one. Without waiting, though: the
        # others may need this very thread to stop.
        log.debug(f"{sys.exc_info()[1]!r} in {actor}. Stopping all actors.")
        actor._stop()
        ActorRegistry.stop_all(block=False)


class _Mailbox:
    """A dispatched actor's inbox: its queue of envelopes, and whether a thread has it.

    It is queued on the dispatcher when a message arrives and no thread has it yet, so one
    actor is never run by two threads at once. Once its actor has stopped it is closed: a
    message that arrives then is answered ``ActorDeadError`` (a stop, ``True``) at once.
    """

    __slots__ = ("_actor", "_dispatcher", "_lock", "_queue", "_scheduled", "_started", "_state")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: deque[Envelope[Any]] = deque()
        self._state = _NEW
        self._scheduled = False
        self._started = False
        self._actor: DispatchedActor | None = None
        self._dispatcher: Dispatcher | None = None

    def bind(self, actor: DispatchedActor, dispatcher: Dispatcher) -> None:
        self._actor = actor
        self._dispatcher = dispatcher

    # pykka's ActorInbox.

    def put(self, envelope: Envelope[Any], /) -> None:
        with self._lock:
            closed = self._state == _CLOSED
            if not closed:
                self._queue.append(envelope)
                run = self._state == _OPEN and not self._scheduled
                if run:
                    self._scheduled = True
        if closed:
            assert self._actor is not None
            _refuse(envelope, self._actor)
        elif run:
            assert self._dispatcher is not None
            self._dispatcher.execute(self)

    def get(self) -> Envelope[Any]:
        with self._lock:
            return self._queue.popleft()

    def empty(self) -> bool:
        return not self._queue

    # The dispatcher's side.

    def open(self) -> None:
        """The actor starts: run ``on_start``, then whatever it was sent already."""
        assert self._dispatcher is not None and self._actor is not None
        try:
            self._dispatcher.attach(self)
        except DispatcherClosed:
            self._actor.actor_stopped.set()
            _unregister(self._actor.actor_ref)
            self.close()
            raise
        with self._lock:
            self._state = _OPEN
            self._scheduled = True
        self._dispatcher.execute(self)

    def run(self) -> None:
        actor, dispatcher = self._actor, self._dispatcher
        assert actor is not None and dispatcher is not None
        if not self._started:
            self._started = True
            actor._actor_loop_setup()  # on_start; a failure there stops the actor
        stopped = actor.actor_stopped
        for _ in range(dispatcher.throughput):
            if stopped.is_set():
                break
            with self._lock:
                if not self._queue:
                    break
                envelope = self._queue.popleft()
            _receive(actor, envelope)
        if stopped.is_set():
            self.close()
            return
        with self._lock:
            again = bool(self._queue)
            self._scheduled = again
        if again:  # to the back of the queue: the other actors get their turn first
            dispatcher.execute(self, later=True)

    def close(self) -> None:
        """The actor has stopped: answer what is left, and refuse what comes."""
        with self._lock:
            if self._state == _CLOSED:
                return
            self._state = _CLOSED
            self._scheduled = False
            left = list(self._queue)
            self._queue.clear()
        if self._dispatcher is not None:
            self._dispatcher.detach(self)
        assert self._actor is not None
        for envelope in left:
            _refuse(envelope, self._actor)

    def stop_actor(self) -> pykka.Future[bool] | None:
        assert self._actor is not None
        try:
            return self._actor.actor_ref.stop(block=False)
        except ActorDeadError:
            return None

    def tell_stop(self) -> bool:
        assert self._actor is not None
        if not self._actor.actor_ref.is_alive():
            return False
        self.put(Envelope(_ActorStop()))
        return True

    def abandon(self) -> None:
        assert self._actor is not None
        self._actor.actor_stopped.set()
        _unregister(self._actor.actor_ref)
        self.close()


class DispatchedActor(pykka.Actor):
    """A pykka actor that runs on a :class:`Dispatcher`'s shared threads, not a thread of its own.

    Subclass it like ``ThreadingActor`` and pass the dispatcher up::

        class Greeter(DispatchedActor):
            def __init__(self, dispatcher: Dispatcher, greeting: str) -> None:
                super().__init__(dispatcher)
                self.greeting = greeting

            def on_receive(self, message):
                return f"{self.greeting}, {message}"

        ref = Greeter.start(dispatcher, "hello")
        ref.ask("you")  # 'hello, you'

    ``start`` raises :class:`DispatcherClosed` (a RuntimeError) on a dispatcher that is shut
    down. Futures are ``ThreadingFuture``s: a caller outside the actors may block on them; a
    handler must not (it would hold a thread the other actors share).
    """

    def __init__(self, dispatcher: Dispatcher, *_args: Any, **_kwargs: Any) -> None:
        if dispatcher.closed:
            raise DispatcherClosed(f"dispatcher {dispatcher.name} is shut down")
        self.__dispatcher = dispatcher
        super().__init__()
        inbox = self.actor_inbox
        assert isinstance(inbox, _Mailbox)
        inbox.bind(self, dispatcher)

    @property
    def dispatcher(self) -> Dispatcher:
        """The dispatcher this actor runs on."""
        return self.__dispatcher

    @staticmethod
    def _create_actor_inbox() -> ActorInbox:
        return _Mailbox()

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        return ThreadingFuture()

    def _start_actor_loop(self) -> None:
        inbox = self.actor_inbox
        assert isinstance(inbox, _Mailbox)
        inbox.open()

    # pykka's own two, but leaving the registry by _unregister.

    def _stop(self) -> None:
        _unregister(self.actor_ref)
        self.actor_stopped.set()
        log.debug("Stopped %s", self)
        try:
            self.on_stop()
        except Exception:
            self._handle_failure(*sys.exc_info())

    def _handle_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        log.error(
            "Unhandled exception in %s:",
            self,
            exc_info=(exception_type, exception_value, traceback),  # type: ignore[arg-type]
        )
        _unregister(self.actor_ref)
        self.actor_stopped.set()
