"""Addresses: how actors name each other in messages without holding references.

A message may not carry an ``ActorRef`` (it must be able to cross a process), so requests carry a
``reply_to`` address instead, and the receiver looks it up here. Anything with a ``tell`` method
can stand at an address: an actor ref, a probe, or a waiter in a thread outside the actors.
"""

from __future__ import annotations

import itertools
import logging
import threading
from typing import Any, Protocol

__all__ = [
    "A2A",
    "CONTEXT",
    "EVENTS",
    "MCP",
    "MODEL",
    "PORT",
    "STORE",
    "Directory",
    "Mailbox",
    "session_address",
]

log = logging.getLogger(__name__)

CONTEXT = "context"
STORE = "store"
MODEL = "model"
PORT = "port"
MCP = "mcp"  # the MCP service: the calls of every [mcp.NAME] server's tools
A2A = "a2a"  # the A2A service: every remote agent's task ([agents.NAME] a2a_url)
EVENTS = "events"


def session_address(session: str) -> str:
    """The address of a session's actor (a session id may be any valid id, even ``context``)."""
    return f"session:{session}"


class Mailbox(Protocol):
    """Anything a message can be told to."""

    def tell(self, message: Any) -> None:
        """Deliver ``message`` without waiting for it to be handled."""


class Directory:
    """A thread-safe map from address to mailbox, one per runtime.

    A message told to an address nobody holds is a dead letter: it is dropped, logged at debug
    level and counted in ``dead_letters``. That is how a late answer for a session that has
    stopped is discarded.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, Mailbox] = {}
        self._counter = itertools.count(1)
        self.dead_letters = 0

    def register(self, address: str, mailbox: Mailbox) -> None:
        """Put ``mailbox`` at ``address``, replacing whatever stood there."""
        with self._lock:
            self._entries[address] = mailbox

    def unregister(self, address: str, mailbox: Mailbox | None = None) -> None:
        """Free ``address``; if ``mailbox`` is given, only while it is still the one there."""
        with self._lock:
            if mailbox is None or self._entries.get(address) is mailbox:
                self._entries.pop(address, None)

    def unique(self, prefix: str) -> str:
        """A fresh address ``<prefix>:<n>`` that this directory never handed out before."""
        return f"{prefix}:{next(self._counter)}"

    def get(self, address: str) -> Mailbox | None:
        """The mailbox at ``address``, or None."""
        # No lock: one dict lookup is atomic under the GIL, and every message told takes
        # this path (the writers still lock, so they never interleave).
        return self._entries.get(address)

    def addresses(self) -> list[str]:
        """Every address in use, sorted."""
        with self._lock:
            return sorted(self._entries)

    def tell(self, address: str | None, message: Any) -> bool:
        """Tell ``message`` to ``address``; False (and a dead letter) if nobody is there."""
        mailbox = self.get(address) if address is not None else None
        if mailbox is None:
            with self._lock:
                self.dead_letters += 1
            log.debug("dead letter to %s: %s", address, type(message).__name__)
            return False
        try:
            mailbox.tell(message)
        except Exception:  # an actor that stopped between get() and tell()
            with self._lock:
                self.dead_letters += 1
            log.debug("dead letter to stopped %s: %s", address, type(message).__name__)
            return False
        return True
