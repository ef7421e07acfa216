"""Which idle sessions to passivate: the decision alone, without actors or clocks of its own.

A passivated session's actor is stopped; its next turn rebuilds it from the store, so nothing a
user or the model sees changes. Only a session that no turn holds is ever a candidate.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["IdleSessions"]


class IdleSessions:
    """Live top-level sessions that no turn holds, least recently used first.

    The Context calls :meth:`idle` when a session's turn ends with its actor still live, and
    :meth:`busy` when a turn holds it again or its actor goes. :meth:`expired` and
    :meth:`over_limit` name the sessions to passivate now and forget them. Times are seconds
    on any clock the caller likes, as long as it is always the same one.

    ``idle_s`` 0 turns the idle limit off; ``max_live`` 0 turns the live limit off.
    """

    def __init__(self, idle_s: float, max_live: int) -> None:
        if idle_s < 0 or max_live < 0:
            raise ValueError(f"idle_s and max_live must be >= 0, not {idle_s} and {max_live}")
        self.idle_s = idle_s
        self.max_live = max_live
        self._since: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._since)

    def __contains__(self, session: object) -> bool:
        return session in self._since

    def order(self) -> tuple[str, ...]:
        """The candidates, least recently used first."""
        return tuple(self._since)

    def idle(self, session: str, now: float) -> None:
        """``session``'s turn ended at ``now`` and its actor stays live: the most recent now."""
        self._since.pop(session, None)
        self._since[session] = now

    def busy(self, session: str) -> None:
        """A turn holds ``session``, or its actor is gone: not a candidate any more."""
        self._since.pop(session, None)

    def expired(self, now: float) -> list[str]:
        """The sessions idle for ``idle_s`` or longer at ``now``, oldest first; forgotten."""
        if self.idle_s <= 0:
            return []
        found = []
        for session, since in self._since.items():
            # Ordered by when they went idle (a clock that went back may break the order a
            # little: then a session goes one sweep late, never early).
            if now - since < self.idle_s:
                break
            found.append(session)
        for session in found:
            del self._since[session]
        return found

    def over_limit(self, live: int) -> list[str]:
        """With ``live`` actors live, the least recently used candidates to stop to get back
        to ``max_live`` (as many as there are, if fewer); forgotten."""
        if self.max_live <= 0 or live <= self.max_live:
            return []
        found = []
        while live > self.max_live and self._since:
            session, _ = self._since.popitem(last=False)
            found.append(session)
            live -= 1
        return found
