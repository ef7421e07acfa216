"""Who may use which llama.cpp slot: the model service's slot table, as a pure state class.

Two requests in flight on one llama.cpp slot mix their prompts (one session's text shows up in
another's answer), so a slot serves one request at a time. A request names its pool (``main``
or ``background``, each a list of slot ids; pools may overlap) and the slot it would like (the
one its session used last, where the server caches its prompt). :meth:`SlotTable.request`
grants a free slot of the pool at once, or queues the request; :meth:`SlotTable.release` frees
a slot and says whom it goes to next. A slot whose request was cut off (cancelled, timed out)
may still be generating on the server for a moment: it is released with a ``free_at`` time and
stays out of use until :meth:`SlotTable.wake` is called at or after it.

No threads and no clock inside: the caller passes ``now`` and runs the grants it gets back.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

__all__ = ["Grant", "SlotTable"]

# Up to this many free slots in a pool are compared one by one; more go through the heap.
_FEW = 16


@dataclass(frozen=True)
class Grant:
    """Request ``ticket`` may now use ``slot``."""

    ticket: Hashable
    slot: int


@dataclass
class _Waiter:
    ticket: Hashable
    pool: str
    preferred: int | None


class SlotTable:
    """The slots of a server: which are busy (and for whom), which cool down, who waits.

    Rules: a request gets its preferred slot if that slot is free; otherwise the free slot of
    its pool that was used least recently (so the caches of recently active sessions survive
    longest); otherwise it waits. Waiters are served first come, first served: a freed slot goes
    to the earliest waiter whose pool has it.
    """

    def __init__(self, pools: Mapping[str, Iterable[int]]) -> None:
        """``pools`` maps each pool name to its slot ids (a slot may be in several pools)."""
        self._pools = {name: tuple(ids) for name, ids in pools.items()}
        for name, ids in self._pools.items():
            if not ids:
                raise ValueError(f"slot pool {name!r} has no slots")
        # Slots neither busy nor cooling: all of them, each pool's own (kept as slots are taken
        # and freed, so that a pick never intersects two sets of hundreds), and a heap of
        # (last use, slot) for the least recently used pick (with entries left behind by slots
        # taken since, skipped): a pool may have hundreds of slots, and a pick must not look at
        # each of them.
        self._idle: set[int] = {slot for ids in self._pools.values() for slot in ids}
        self._idle_in: dict[str, set[int]] = {name: set(ids) for name, ids in self._pools.items()}
        self._pools_of: dict[int, tuple[set[int], ...]] = {slot: () for slot in self._idle}
        for free in self._idle_in.values():
            for slot in free:
                self._pools_of[slot] += (free,)
        self._lru: list[tuple[int, int]] = [(0, slot) for slot in sorted(self._idle)]
        self._busy: dict[int, Hashable] = {}
        self._cooling: dict[int, float] = {}
        self._waiting: list[_Waiter] = []
        self._uses = itertools.count(1)
        self._last_use: dict[int, int] = {}

    # Queries.

    def pools(self) -> dict[str, tuple[int, ...]]:
        """The pools, as given."""
        return dict(self._pools)

    def busy(self) -> dict[int, Hashable]:
        """Slot -> the ticket that holds it."""
        return dict(self._busy)

    def free(self) -> set[int]:
        """Slots of any pool that a request could get now (neither busy nor cooling)."""
        return set(self._idle)

    def waiting(self) -> list[Hashable]:
        """Tickets waiting for a slot, in arrival order."""
        return [w.ticket for w in self._waiting]

    def next_wake(self) -> float | None:
        """When the earliest cooling slot becomes free (call :meth:`wake` then), or None."""
        return min(self._cooling.values(), default=None)

    # Changes.

    def request(self, ticket: Hashable, pool: str, preferred: int | None = None) -> int | None:
        """``ticket`` wants a slot of ``pool``: the slot it gets now, or None (it waits).

        Raises ``KeyError`` for an unknown pool.
        """
        if pool not in self._pools:
            raise KeyError(f"no slot pool {pool!r}")
        waiter = _Waiter(ticket, pool, preferred)
        # Every free slot is one no earlier waiter can use (they would hold it already), so
        # taking it jumps nobody's place in the queue.
        slot = self._pick(waiter)
        if slot is not None:
            self._take(slot, ticket)
            return slot
        self._waiting.append(waiter)
        return None

    def withdraw(self, ticket: Hashable) -> bool:
        """``ticket`` no longer waits (its request was cancelled); False if it did not wait."""
        for i, waiter in enumerate(self._waiting):
            if waiter.ticket == ticket:
                del self._waiting[i]
                return True
        return False

    def release(self, slot: int, ticket: Hashable, free_at: float | None = None) -> list[Grant]:
        """``ticket`` is done with ``slot``; returns who gets slots now.

        With ``free_at`` (the caller's clock) the slot stays unusable until :meth:`wake` is
        called at or after that time. A release by a ticket that does not hold the slot is
        ignored.
        """
        if self._busy.get(slot) != ticket:
            return []
        del self._busy[slot]
        if free_at is not None:
            self._cooling[slot] = free_at
            return []
        self._make_idle(slot)
        return self._serve()

    def wake(self, now: float) -> list[Grant]:
        """Free the cooling slots whose time has come; returns who gets slots now."""
        ready = [slot for slot, at in self._cooling.items() if at <= now]
        for slot in ready:
            del self._cooling[slot]
            self._make_idle(slot)
        return self._serve() if ready else []

    # Inside.

    def _pick(self, waiter: _Waiter) -> int | None:
        free = self._idle_in[waiter.pool]
        if waiter.preferred in free:
            return waiter.preferred
        # The least recently used free slot of the pool (never used first, lowest id first).
        if len(free) <= _FEW:
            return min(free, key=self._age) if free else None
        # Many free: the heap, rather than a look at each. The caller takes what this
        # returns, so its entry is not pushed back.
        other_pools: list[tuple[int, int]] = []
        found = None
        while self._lru:
            use, slot = heapq.heappop(self._lru)
            if slot not in self._idle or self._last_use.get(slot, 0) != use:
                continue  # taken since this entry was made
            if slot in free:
                found = slot
                break
            other_pools.append((use, slot))
        for entry in other_pools:
            heapq.heappush(self._lru, entry)
        return found

    def _age(self, slot: int) -> tuple[int, int]:
        return self._last_use.get(slot, 0), slot

    def _make_idle(self, slot: int) -> None:
        self._idle.add(slot)
        for free in self._pools_of[slot]:
            free.add(slot)
        heapq.heappush(self._lru, (self._last_use.get(slot, 0), slot))

    def _take(self, slot: int, ticket: Hashable) -> None:
        self._idle.discard(slot)
        for free in self._pools_of[slot]:
            free.discard(slot)
        self._busy[slot] = ticket
        self._last_use[slot] = next(self._uses)

    def _serve(self) -> list[Grant]:
        grants: list[Grant] = []
        still: list[_Waiter] = []
        for waiter in self._waiting:  # first come, first served
            slot = self._pick(waiter) if self._idle else None
            if slot is None:
                still.append(waiter)
                continue
            self._take(slot, waiter.ticket)
            grants.append(Grant(waiter.ticket, slot))
        self._waiting = still
        return grants
