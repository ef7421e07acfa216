"""The slot table's least-recently-used pick past 16 free slots (actors/core/slots.py), where
it goes through a heap rather than a look at each slot: checked against a plain reference,
step by step, with overlapping pools and cooled-down slots, so that a heap entry lost or left
stale shows as a session whose cached prompt is evicted first (or a slot never given again)."""

from __future__ import annotations

import random

from actors.core.slots import Grant, SlotTable

POOLS = {"main": tuple(range(0, 24)), "background": tuple(range(12, 40))}


class Reference:
    """The rule, by brute force: the preferred slot if free, else the free slot of the pool
    used least recently (never used first, lowest id first); waiters first come, first served."""

    def __init__(self, pools: dict[str, tuple[int, ...]]) -> None:
        self.pools = pools
        self.free = {s for ids in pools.values() for s in ids}
        self.cooling: dict[int, float] = {}
        self.busy: dict[int, object] = {}
        self.last: dict[int, int] = {}
        self.uses = 0
        self.waiting: list[tuple[object, str, int | None]] = []

    def pick(self, pool: str, preferred: int | None) -> int | None:
        free = [s for s in self.pools[pool] if s in self.free]
        if preferred in free:
            return preferred
        return min(free, key=lambda s: (self.last.get(s, 0), s)) if free else None

    def take(self, slot: int, ticket: object) -> None:
        self.free.discard(slot)
        self.busy[slot] = ticket
        self.uses += 1
        self.last[slot] = self.uses

    def request(self, ticket: object, pool: str, preferred: int | None) -> int | None:
        slot = self.pick(pool, preferred)
        if slot is None:
            self.waiting.append((ticket, pool, preferred))
        else:
            self.take(slot, ticket)
        return slot

    def serve(self) -> list[Grant]:
        grants, still = [], []
        for ticket, pool, preferred in self.waiting:
            slot = self.pick(pool, preferred)
            if slot is None:
                still.append((ticket, pool, preferred))
            else:
                self.take(slot, ticket)
                grants.append(Grant(ticket, slot))
        self.waiting = still
        return grants

    def release(self, slot: int, free_at: float | None) -> list[Grant]:
        del self.busy[slot]
        if free_at is not None:
            self.cooling[slot] = free_at
            return []
        self.free.add(slot)
        return self.serve()

    def wake(self, now: float) -> list[Grant]:
        ready = [s for s, at in self.cooling.items() if at <= now]
        for slot in ready:
            del self.cooling[slot]
            self.free.add(slot)
        return self.serve() if ready else []


def test_the_heap_pick_matches_the_rule_step_by_step() -> None:
    rng = random.Random(36)
    table, ref = SlotTable(POOLS), Reference(POOLS)
    tickets = iter(range(10**6))
    now = 0.0
    for step in range(3000):
        op = rng.random()
        if op < 0.45 or not ref.busy:
            ticket = next(tickets)
            pool = rng.choice(["main", "background"])
            preferred = rng.choice([None, None, rng.randrange(0, 40)])
            assert table.request(ticket, pool, preferred) == ref.request(ticket, pool, preferred), (
                step
            )
        elif op < 0.9:
            slot = rng.choice(sorted(ref.busy))
            ticket = ref.busy[slot]
            free_at = now + 1 if rng.random() < 0.2 else None
            assert table.release(slot, ticket, free_at) == ref.release(slot, free_at), step
        else:
            now += 1
            assert table.wake(now) == ref.wake(now), step
        assert table.free() == ref.free, step
        assert table.busy() == ref.busy, step
        assert table.waiting() == [w[0] for w in ref.waiting], step


def test_a_wide_pool_gives_back_every_slot_in_least_recently_used_order() -> None:
    slots = SlotTable({"main": tuple(range(30))})
    assert [slots.request(n, "main") for n in range(30)] == list(range(30))
    order = [7, 3, 29, 0, 15, 22, 1, 2, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, 16, 17]
    order += [18, 19, 20, 21, 23, 24, 25, 26, 27, 28]
    for slot in order:
        assert slots.release(slot, slot) == []
    # Every slot is free (30 > 16): each request takes the one used least recently, which is
    # the order they were first taken in, 0 first.
    assert [slots.request(100 + n, "main") for n in range(30)] == list(range(30))
    assert slots.request("late", "main") is None
    assert slots.waiting() == ["late"]


def test_a_wide_pool_skips_slots_of_the_other_pool_and_keeps_them() -> None:
    # background's heap entries for slots only in main are put back, not lost.
    slots = SlotTable({"main": tuple(range(0, 20)), "background": tuple(range(10, 40))})
    taken = [slots.request(n, "background") for n in range(30)]
    assert taken == list(range(10, 40))
    for slot in range(10, 40):
        slots.release(slot, slot - 10)
    # main's 20 free slots (> 16): 0..9 were never used, so they come first, then 10..19.
    assert [slots.request(100 + n, "main") for n in range(20)] == list(range(20))
    # background still finds its other slots through the heap, least recently used first.
    assert [slots.request(200 + n, "background") for n in range(20)] == list(range(20, 40))
