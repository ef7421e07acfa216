"""The kill loop's at-most-once check itself, on a side-effect log written by hand: a port
call is counted by its session and call id, an MCP call by the key its arguments passed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from killloop_check import StoreView, check_iteration

from actors.stores.sqlite import SessionStore

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
