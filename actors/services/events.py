"""The event bus: every turn event, children's included, goes to every subscriber."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pykka

from actors.dispatcher.inbox import SimpleInbox
from messages import TurnEvent

__all__ = ["EventBus", "EventSink", "Subscribers"]

log = logging.getLogger(__name__)

Subscriber = Callable[[TurnEvent], Any]


class Subscribers:
    """A thread-safe list of subscriber functions; the Runtime adds, the bus reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[Subscriber] = []
        self.inline: tuple[Subscriber, ...] = ()
        """Subscribers called on the emitting thread (replaced whole, so read without a lock)."""

    def add(self, fn: Subscriber, inline: bool = False) -> Callable[[], None]:
        """Add ``fn`` (called on the emitting thread with ``inline``); returns a function that
        removes it again."""
        with self._lock:
            if inline:
                self.inline = (*self.inline, fn)
            else:
                self._items.append(fn)

        def remove() -> None:
            with self._lock:
                if inline:
                    self.inline = tuple(f for f in self.inline if f is not fn)
                elif fn in self._items:
                    self._items.remove(fn)

        return remove

    def any(self) -> bool:
        """Whether anyone subscribes now (no lock: a list's length is read atomically)."""
        return bool(self._items)

    def snapshot(self) -> list[Subscriber]:
        """The subscribers now, as a list that later changes do not touch."""
        with self._lock:
            return list(self._items)


class EventBus(pykka.ThreadingActor):
    """Calls every subscriber with each event, in its own thread.

    Sessions tell it events and go on: a slow subscriber delays other subscribers, never a turn.
    Events from one session arrive in the order that session emitted them. A subscriber that
    raises is logged and keeps its subscription.
    """

    @staticmethod
    def _create_actor_inbox() -> SimpleInbox:
        return SimpleInbox()

    def __init__(self, subscribers: Subscribers) -> None:
        super().__init__()
        self.subscribers = subscribers

    def on_receive(self, message: Any) -> None:
        for fn in self.subscribers.snapshot():
            try:
                fn(message)
            except Exception:
                log.exception("event subscriber %r failed on %s", fn, type(message).__name__)


class EventSink:
    """What stands at the ``events`` address: it hands each event to the :class:`EventBus`
    while anyone subscribes, and drops it at once otherwise.

    A turn emits about eight events per model request; with nobody to call, telling each to
    the bus's thread was a thread handoff and a wake-up apiece for nothing. An event emitted
    before the first subscriber subscribes is not seen by it, as before (the bus calls the
    subscribers there are when it handles the event).
    """

    def __init__(self, bus: pykka.ActorRef[Any], subscribers: Subscribers) -> None:
        self.bus = bus
        self.subscribers = subscribers

    def tell(self, message: Any) -> None:
        """Call the inline subscribers, then hand ``message`` to the bus if anyone else
        subscribes."""
        for fn in self.subscribers.inline:
            try:
                fn(message)
            except Exception:
                log.exception("event subscriber %r failed on %s", fn, type(message).__name__)
        if self.subscribers.any():
            self.bus.tell(message)
