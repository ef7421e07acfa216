"""Messages told from any thread to one asyncio event loop, with one wake-up of the loop a burst.

``loop.call_soon_threadsafe`` wakes the loop for every call: it builds a handle, takes the
loop's lock and writes a byte to the loop's self-pipe (a system call). A loop that answers 256
sessions at once is told hundreds of messages in a burst, and a wake-up each costs more than
most of the messages. :class:`LoopInbox` queues them in a ``deque`` and schedules one drain;
everything told before the drain runs is handled by it, in the order told.

It imports only the standard library.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["LoopInbox"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class LoopInbox(Generic[T]):
    """Hands what :meth:`put` is given, on any thread, to ``handle`` on ``loop``'s thread.

    Items are handled in the order they were put, each once. An exception from ``handle`` is
    logged and the rest of the burst is still handled. Once ``loop`` is closed, :meth:`put`
    returns False and drops the item (nobody would handle it).
    """

    __slots__ = ("_draining", "_handle", "_items", "_loop", "_name")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, handle: Callable[[T], object], name: str
    ) -> None:
        self._loop = loop
        self._handle = handle
        self._name = name
        self._items: deque[T] = deque()
        self._draining = False

    def put(self, item: T) -> bool:
        """Queue ``item`` for the loop (any thread); False if the loop is closed."""
        if self._loop.is_closed():  # a drain scheduled before the close never runs: let go
            self._items.clear()
            return False
        self._items.append(item)
        if self._draining:  # the drain scheduled already takes this item too
            return True
        self._draining = True
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop closed since the check above
            self._draining = False
            self._items.clear()
            return False
        return True

    def _drain(self) -> None:
        # Cleared before counting: an item put from here on schedules a drain of its own, so
        # this one takes only what it counts and a stream of puts cannot keep the loop here.
        # deque's append and popleft are atomic, so the producers need no lock.
        self._draining = False
        items, handle = self._items, self._handle
        for _ in range(len(items)):
            item = items.popleft()
            try:
                handle(item)
            except Exception:  # one bad item must not hold back the rest of the burst
                log.exception("%s: handling %s failed", self._name, type(item).__name__)

    def __repr__(self) -> str:
        return f"<LoopInbox {self._name} waiting={len(self._items)}>"
