"""The kill loop's checks themselves, on logs and stores written by hand: a port call is
counted by its session and call id, an MCP call by the key its arguments passed; the usage
told with an answer must be the usage stored with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from killloop_check import StoreView, check_iteration

from actors.stores.sqlite import SessionStore
from messages.chat import Baseline, ChatMessage, Usage

pytestmark = pytest.mark.timeout(60)


def at_most_once(tmp_path: Path, effects: list[dict[str, Any]]) -> list[str]:
    db = tmp_path / "loopd.db"
    SessionStore(db).close()  # an empty store: the check reads only the log here
    found = check_iteration([], [], effects, StoreView(db), settled=True)
    return [v.detail for v in found if v.guarantee == "at most once"]


def port(session: str, call_id: int) -> dict[str, Any]:
    return {"run": "work-1", "tool": "effect", "session": session, "call_id": call_id}


def mcp(key: str) -> dict[str, Any]:
    return {"run": "work-1", "tool": "fx__effect", "key": key}


def test_each_call_once_is_no_violation(tmp_path: Path) -> None:
    effects = [port("kl-a", 1), port("kl-a", 2), port("kl-b", 1), mcp("kl-a:00ff:0")]
    assert at_most_once(tmp_path, [*effects, mcp("kl-a:00ff:1")]) == []


def test_an_mcp_key_seen_twice_is_a_violation(tmp_path: Path) -> None:
    effects = [mcp("kl-a:00ff:0"), port("kl-a", 1), mcp("kl-a:00ff:0")]
    assert at_most_once(tmp_path, effects) == ["MCP call with key kl-a:00ff:0 ran 2 times"]


def test_a_port_call_seen_twice_is_still_a_violation(tmp_path: Path) -> None:
    effects = [port("kl-a", 3), mcp("kl-a:00ff:0"), port("kl-a", 3)]
    assert at_most_once(tmp_path, effects) == ["call 3 ran 2 times"]


def test_usage_told_with_an_answer_must_be_the_usage_stored_with_it(tmp_path: Path) -> None:
    db = tmp_path / "loopd.db"
    with SessionStore(db) as store:
        store.create("kl-a", Baseline(system="s"), 0)
        answer = ChatMessage(role="assistant", content="hi", usage=Usage(40, 3, requests=1))
        store.append("kl-a", [answer], turns=1, next_call_id=1, untrusted=False)

    def told(prompt: int) -> dict[str, Any]:
        usage = {"prompt_tokens": prompt, "completion_tokens": 3, "requests": 1}
        event = {"session": "kl-a", "step": 1, "content": "hi", "tools": [], "usage": usage}
        return {"run": "work-1", "kind": "event", "tag": "ModelAnswered", "event": event}

    def budget_faults(work: list[dict[str, Any]]) -> list[str]:
        found = check_iteration(work, [], [], StoreView(db), settled=True)
        return [v.detail for v in found if v.guarantee == "budgets counted"]

    assert budget_faults([told(40)]) == []
    assert budget_faults([told(41)]) == [
        "ModelAnswered step 1 told usage (41, 3, 1), stored [(40, 3, 1)]"
    ]
