"""``loop.token_budget``: one top-level turn and its children share a budget, counted exactly by
the Context; once it is spent no further request of that family goes out."""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest

from actors import ModelConfig
from actors.core.budget import Budgets, family_of
from actors.core.config import Config, ConfigError
from actors.testing import ScriptedModel, call, calls, reply, with_usage
from messages import FailReason, SubagentFinished, TurnCompleted, TurnFailed, Usage

WAIT = 10.0


def tokens(n: int) -> Usage:
    return Usage(prompt_tokens=n - 1, completion_tokens=1, requests=1)


@pytest.mark.parametrize(
    ("session", "family"),
    [("mm", "mm"), ("mm-2", "mm-2"), ("sub-mm-1", "mm"), ("sub-sub-mm-2-1-3", "mm-2")],
)
def test_family_of_a_session_is_its_top_level_session(session: str, family: str) -> None:
    assert family_of(session) == family


def test_budgets_refuse_once_the_family_reached_the_limit() -> None:
    budgets = Budgets(100)
    budgets.open("mm")
    budgets.spend("mm", tokens(60))
    budgets.spend("sub-mm-1", tokens(39))
    assert budgets.refusal("sub-sub-mm-1-1") is None  # 99 < 100
    budgets.spend("sub-sub-mm-1-1", tokens(1))
    assert budgets.refusal("mm") == (
        "the turn of mm and its children spent 100 tokens; loop.token_budget is 100"
    )
    assert budgets.refusal("other") is None  # another family is not touched
    budgets.close("mm")
    budgets.spend("sub-mm-1", tokens(500))  # a late report of an ended turn is not kept
    budgets.open("mm")
    assert budgets.spent("mm") == 0  # the next top-level turn starts afresh


def test_the_budget_key_is_checked() -> None:
    with pytest.raises(ConfigError, match="token_budget"):
        Config.from_toml("[loop]\ntoken_budget = 0\n")


def family_script(body: dict[str, Any]):
    """``go`` spends 60 and starts two children; each child spends 50 and asks for the clock."""
    users = [m["content"] for m in body["messages"] if m["role"] == "user"]
    if users[-1] == "go":
        return with_usage(calls(("subagent", {"task": "a"}), ("subagent", {"task": "b"})), 59, 1)
    if users[-1] == "again":
        return with_usage(reply("fresh"), 9, 1)
    return with_usage(call("clock"), 49, 1)


def test_a_spent_budget_fails_the_turn_and_its_running_children(
    chat_server, loopd_runtime, loopd_config
) -> None:
    server = chat_server(family_script)
    model = ModelConfig(base_url=server.base_url, name="m", timeout_s=10, retries=0)
    rt = loopd_runtime(config=loopd_config.replace(model=model), loop={"token_budget": 100})
    seen: list[Any] = []
    both = threading.Event()

    def note(event: Any) -> None:
        seen.append(event)
        if sum(isinstance(e, SubagentFinished) for e in seen) == 2:
            both.set()

    rt.subscribe(note)
    outcome = rt.run_turn("mm", "go", timeout=WAIT)
    assert isinstance(outcome, TurnFailed) and outcome.reason is FailReason.BUDGET
    assert "loop.token_budget is 100" in outcome.detail
    # The first refusal names the total when it was made: 110 if one child's next request
    # reached the Context before the other child's report, 160 if after. Both are over 100.
    assert re.search(r"spent (110|160) tokens", outcome.detail), outcome.detail
    # The parent's request went out at 0, and each child's first while the family stood at
    # 60, below the budget. On a busy machine one child's answer (110) can be counted before
    # the other child asks at all: that request is refused unsent. Every request after those
    # was refused without being sent.
    sent = len(server.requests)
    assert sent in (2, 3), sent
    spent = 60 + 50 * (sent - 1)
    # Each child's event is told by the parent once it has stored the answer, or as a call
    # that failed once the parent's turn is over: it may come after the outcome.
    assert both.wait(WAIT)
    children = [e for e in seen if isinstance(e, SubagentFinished)]
    assert {(e.child, e.reason) for e in children} == {
        ("sub-mm-1", FailReason.BUDGET),
        ("sub-mm-2", FailReason.BUDGET),
    }
    assert outcome.usage.prompt_tokens + outcome.usage.completion_tokens == spent
    # The budget is per top-level turn: the next one starts afresh.
    assert rt.run_turn("mm", "again", timeout=WAIT) == TurnCompleted(
        "mm", "fresh", usage=Usage(prompt_tokens=9, completion_tokens=1, requests=1)
    )
    assert len(server.requests) == sent + 1


def test_without_usage_a_budget_never_stops_a_turn(loopd_runtime) -> None:
    model = ScriptedModel([call("subagent", task="t"), reply("child"), reply("done")])
    rt = loopd_runtime(model=model, loop={"token_budget": 1})
    assert rt.run_turn("mm", "go", timeout=WAIT) == TurnCompleted("mm", "done")
