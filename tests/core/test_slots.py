"""The slot table, driven without threads: who gets which llama.cpp slot, and who waits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.core.config import ConfigError, SlotsConfig
from actors.core.slots import Grant, SlotTable


def table(**pools: tuple[int, ...]) -> SlotTable:
    return SlotTable(pools or {"main": (0,), "background": (1, 2, 3)})


def test_a_request_gets_its_preferred_slot_when_it_is_free() -> None:
    slots = table()
    assert slots.request("a", "background", preferred=2) == 2
    assert slots.busy() == {2: "a"}


def test_without_a_preference_the_least_recently_used_free_slot() -> None:
    slots = table()
    assert slots.request("a", "background") == 1
    assert slots.request("b", "background") == 2
    slots.release(1, "a")
    slots.release(2, "b")
    # 3 was never used, then 1 is the oldest: the caches of the latest users survive longest.
    assert slots.request("c", "background") == 3
    assert slots.request("d", "background") == 1


def test_a_wide_pool_still_gives_the_least_recently_used_slot() -> None:
    slots = table(background=tuple(range(1, 101)))
    assert slots.request("a", "background", preferred=50) == 50
    assert slots.request("b", "background") == 1
    slots.release(50, "a")
    slots.release(1, "b")
    # Never used first, lowest id first; then 50 (used before 1), then 1.
    got = [slots.request(n, "background") for n in range(100)]
    assert got == [*range(2, 50), *range(51, 101), 50, 1]


def test_a_busy_preferred_slot_gives_another_free_one() -> None:
    slots = table()
    assert slots.request("a", "background", preferred=1) == 1
    assert slots.request("b", "background", preferred=1) == 2


def test_when_all_are_busy_requests_wait_and_are_served_in_order() -> None:
    slots = table(main=(0,))
    assert slots.request("a", "main") == 0
    assert slots.request("b", "main") is None
    assert slots.request("c", "main", preferred=0) is None
    assert slots.waiting() == ["b", "c"]
    assert slots.release(0, "a") == [Grant("b", 0)]
    assert slots.release(0, "b") == [Grant("c", 0)]
    assert slots.release(0, "c") == []
    assert slots.busy() == {}


def test_a_freed_slot_goes_to_the_first_waiter_whose_pool_has_it() -> None:
    slots = table(main=(0,), background=(1,))
    slots.request("m1", "main")
    slots.request("b1", "background")
    assert slots.request("m2", "main") is None
    assert slots.request("b2", "background") is None
    assert slots.release(1, "b1") == [Grant("b2", 1)]
    assert slots.waiting() == ["m2"]


def test_overlapping_pools_never_share_a_slot() -> None:
    slots = table(main=(0,), background=(0, 1))
    assert slots.request("m", "main") == 0
    assert slots.request("b1", "background") == 1
    assert slots.request("b2", "background") is None
    assert slots.request("m2", "main") is None
    # Slot 0 frees: b2 came first and may use it.
    assert slots.release(0, "m") == [Grant("b2", 0)]
    assert slots.release(1, "b1") == []  # m2 cannot use slot 1
    assert slots.waiting() == ["m2"]


def test_a_cut_off_slot_cools_down_before_its_next_request() -> None:
    slots = table(main=(0,))
    slots.request("a", "main")
    assert slots.release(0, "a", free_at=10.0) == []
    assert slots.request("b", "main") is None  # the server may still generate for a
    assert slots.next_wake() == 10.0
    assert slots.wake(9.9) == []
    assert slots.wake(10.0) == [Grant("b", 0)]
    assert slots.next_wake() is None


def test_a_withdrawn_waiter_gets_nothing() -> None:
    slots = table(main=(0,))
    slots.request("a", "main")
    slots.request("b", "main")
    assert slots.withdraw("b") is True
    assert slots.withdraw("b") is False
    assert slots.release(0, "a") == []


def test_a_release_by_someone_else_is_ignored() -> None:
    slots = table(main=(0,))
    slots.request("a", "main")
    assert slots.release(0, "intruder") == []
    assert slots.busy() == {0: "a"}


def test_bad_pools_are_refused() -> None:
    with pytest.raises(ValueError, match="slot pool 'main' has no slots"):
        SlotTable({"main": ()})
    with pytest.raises(KeyError, match="no slot pool 'nope'"):
        table().request("a", "nope")


SMALL = {"main": (0, 1), "background": (1, 2, 3)}
LARGE = {"main": (0, 1), "background": tuple(range(1, 41))}  # past the one-by-one pick


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([SMALL, LARGE]),
    st.lists(
        st.tuples(
            st.sampled_from(["request", "request", "release", "cut", "withdraw", "wake"]),
            st.integers(0, 7),
            st.sampled_from(["main", "background"]),
            st.one_of(st.none(), st.integers(0, 42)),
        ),
        max_size=120,
    ),
)
def test_no_slot_ever_has_two_requests_and_no_waiter_misses_a_free_slot(pools, ops) -> None:
    slots = SlotTable(pools)
    holding: dict[int, int] = {}  # ticket -> slot
    waiting: dict[int, str] = {}
    now = 0.0
    next_ticket = 0
    uses = 0
    used_at: dict[int, int] = {}

    def granted(grants: list[Grant]) -> None:
        for grant in grants:
            assert grant.ticket in waiting
            assert grant.slot in pools[waiting.pop(grant.ticket)]  # type: ignore[arg-type]
            assert grant.slot not in holding.values(), "a slot given twice"
            holding[grant.ticket] = grant.slot  # type: ignore[index]
            note_use(grant.slot)

    def note_use(slot: int) -> None:
        nonlocal uses
        uses += 1
        used_at[slot] = uses

    for op, n, pool, preferred in ops:
        now += 1.0
        if op == "request":
            next_ticket += 1
            free_before = slots.free()
            slot = slots.request(next_ticket, pool, preferred)
            if slot is None:
                assert not free_before & set(pools[pool]), "waits although a slot is free"
                waiting[next_ticket] = pool
            else:
                assert slot in pools[pool] and slot in free_before
                if preferred in pools[pool] and preferred in free_before:
                    assert slot == preferred
                else:  # the least recently used free slot of the pool
                    candidates = free_before & set(pools[pool])
                    assert slot == min(candidates, key=lambda s: (used_at.get(s, 0), s))
                holding[next_ticket] = slot
                note_use(slot)
        elif op in ("release", "cut") and holding:
            ticket = sorted(holding)[n % len(holding)]
            slot = holding.pop(ticket)
            granted(slots.release(slot, ticket, free_at=now + 2 if op == "cut" else None))
        elif op == "withdraw" and waiting:
            ticket = sorted(waiting)[n % len(waiting)]
            assert slots.withdraw(ticket)
            del waiting[ticket]
        elif op == "wake":
            granted(slots.wake(now))
        assert slots.busy() == {slot: ticket for ticket, slot in holding.items()}
        assert slots.waiting() == sorted(waiting)
        # Nobody waits while a slot of its pool is free (a cooling slot is not free).
        for pool_name in waiting.values():
            assert not slots.free() & set(pools[pool_name])


def test_slot_pools_from_config() -> None:
    assert SlotsConfig().pool("main") == (0,)
    assert SlotsConfig().pool("background") == (1,)
    assert SlotsConfig(main=(0, 1), total=4).pool("background") == (2, 3)
    assert SlotsConfig(main=0, total=1).pool("background") == (0,)  # nothing else: share
    assert SlotsConfig(background=(3, 3, 1)).pool("background") == (3, 1)
    resolved = SlotsConfig(main=0, total=5).resolved()
    assert (resolved.main, resolved.background, resolved.total) == (0, (1, 2, 3, 4), 5)
    assert SlotsConfig().resolved().background == 1  # one slot stays an int
    with pytest.raises(ConfigError, match=r"slots.background names slot 4, but the server has 4"):
        SlotsConfig(background=(1, 4)).resolved(total=4)
    with pytest.raises(ConfigError, match="auto"):
        SlotsConfig(total="auto").resolved()
