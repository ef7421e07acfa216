"""``loop.token_budget`` accounts (actors/core/budget.py), pinned at the core: a background
child spends on the turn that spawned it, a restart restores what a family spent, and every
account is freed once nobody holds it (a long-running runtime keeps no account per turn)."""

from __future__ import annotations

import pytest

from actors.core.budget import Budgets, family_of, parent_of
from messages import Usage


def tokens(n: int) -> Usage:
    return Usage(prompt_tokens=n - 1, completion_tokens=1, requests=1)


def accounts(budgets: Budgets) -> int:
    """Accounts the table keeps (the resource a forgotten close would leak)."""
    assert budgets._spent.keys() == budgets._holders.keys()
    return len(budgets._spent)


@pytest.mark.parametrize(
    ("session", "parent"),
    [("mm", None), ("sub-mm-1", "mm"), ("sub-sub-mm-2-1-3", "sub-mm-2-1"), ("sub-a-b-7", "a-b")],
)
def test_parent_of_a_session_by_the_id_rule(session: str, parent: str | None) -> None:
    assert parent_of(session) == parent


def test_family_of_a_deep_child_with_dashes_in_the_top_level_id() -> None:
    assert family_of("sub-sub-sub-a-b-1-2-3") == "a-b"


def test_an_account_is_freed_when_its_turn_closes() -> None:
    budgets = Budgets(100)
    for _ in range(5):
        budgets.open("mm")
        budgets.spend("sub-mm-1", tokens(10))
        assert budgets.spent("mm") == 10
        budgets.close("mm")
        assert budgets.spent("mm") == 0
    assert accounts(budgets) == 0
    budgets.close("mm")  # closing twice is harmless
    assert accounts(budgets) == 0


def test_reopening_a_turn_frees_the_old_account() -> None:
    budgets = Budgets(100)
    budgets.open("mm")
    budgets.spend("mm", tokens(30))
    budgets.open("mm")  # a new top-level turn without the old one closed
    assert budgets.spent("mm") == 0
    assert accounts(budgets) == 1


def test_a_background_child_spends_on_its_spawners_account_until_it_closes() -> None:
    budgets = Budgets(100)
    budgets.open("mm")
    budgets.attach("sub-mm-1", "mm")
    budgets.spend("sub-mm-1", tokens(40))
    budgets.spend("sub-sub-mm-1-1", tokens(20))  # the child's own child
    assert budgets.spent("mm") == 60
    budgets.close("mm")  # the spawning turn ends: the child keeps the account
    assert budgets.spent("sub-mm-1") == 60
    budgets.open("mm")  # the parent's next turn starts afresh
    assert budgets.spent("mm") == 0
    budgets.spend("sub-mm-1", tokens(40))
    assert budgets.spent("sub-mm-1") == 100
    assert budgets.refusal("sub-sub-mm-1-1") is not None
    assert budgets.refusal("mm") is None
    budgets.close("sub-mm-1")
    budgets.close("mm")
    assert accounts(budgets) == 0


def test_attaching_to_a_parent_without_an_account_does_nothing() -> None:
    budgets = Budgets(100)
    budgets.attach("sub-mm-1", "mm")
    budgets.spend("sub-mm-1", tokens(500))
    assert budgets.spent("sub-mm-1") == 0
    assert budgets.refusal("sub-mm-1") is None
    assert accounts(budgets) == 0


def test_attaching_twice_keeps_one_hold() -> None:
    budgets = Budgets(100)
    budgets.open("mm")
    budgets.attach("sub-mm-1", "mm")
    budgets.attach("sub-mm-1", "mm")
    budgets.close("sub-mm-1")
    budgets.close("mm")
    assert accounts(budgets) == 0


def test_a_restart_restores_what_the_family_spent_never_less() -> None:
    budgets = Budgets(100)
    budgets.restore("mm", 70)  # no account: nothing kept
    assert budgets.spent("mm") == 0
    assert accounts(budgets) == 0
    budgets.open("mm")
    budgets.spend("mm", tokens(20))
    budgets.restore("mm", 70)
    assert budgets.spent("mm") == 70
    budgets.restore("mm", 10)  # less than counted: the count stands
    assert budgets.spent("mm") == 70
    budgets.spend("mm", tokens(30))
    assert budgets.refusal("mm") == (
        "the turn of mm and its children spent 100 tokens; loop.token_budget is 100"
    )


def test_the_budget_refuses_at_the_limit_not_before() -> None:
    budgets = Budgets(10)
    budgets.open("mm")
    budgets.spend("mm", tokens(9))
    assert budgets.refusal("mm") is None
    budgets.spend("mm", tokens(1))
    assert budgets.refusal("mm") is not None
