"""The approvals table (SPEC 11): stored waiting calls, one decision each, on either backend
(PostgreSQL with LOOPD_CLUSTER_TESTS=1), and the SQLite migration from schema 3."""

from __future__ import annotations

import os
import sqlite3
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from actors.stores.sqlite import SessionStore
from messages import ApprovalRequested, StoredApproval

BACKENDS = ["sqlite", *(["postgresql"] if os.environ.get("LOOPD_CLUSTER_TESTS") == "1" else [])]
AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def entry(session: str, call_id: int, minutes: int = 0) -> StoredApproval:
    at = AT + timedelta(minutes=minutes)
    request = ApprovalRequested(
        session=session, call_id=call_id, tool="deploy", arguments="{}", untrusted=True, at=at
    )
    return StoredApproval(request, at + timedelta(days=7))


@pytest.fixture(params=BACKENDS)
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "sqlite":
        return lambda: SessionStore(tmp_path / "loopd.db")
    from actors.stores.postgres import PgSessionStore

    url = request.getfixturevalue("pg_database")()
    return lambda: PgSessionStore(url)


def test_stored_approvals_come_back_oldest_first_and_are_dropped(opener: Any) -> None:
    with opener() as store:
        store.run_batch([("b", lambda cur: store.add_approval_in(cur, entry("b", 4, 5)))])
        store.run_batch([("a", lambda cur: store.add_approval_in(cur, entry("a", 2, 1)))])
    with opener() as store:  # another connection, as the next start's
        assert store.approvals() == [entry("a", 2, 1), entry("b", 4, 5)]
        store.drop_approvals("a", [2])
        assert store.approvals() == [entry("b", 4, 5)]


def test_of_two_decisions_at_once_exactly_one_is_recorded(opener: Any) -> None:
    with opener() as store:
        store.run_batch([("s", lambda cur: store.add_approval_in(cur, entry("s", 1)))])
    results: list[bool] = []
    start = threading.Barrier(2)

    def decide(approved: bool) -> None:
        with opener() as store:
            start.wait(5)
            results.append(store.settle_approval("s", 1, approved, "" if approved else "no"))

    threads = [threading.Thread(target=decide, args=(a,)) for a in (True, False)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(results) == [False, True]
    with opener() as store:
        (stored,) = store.approvals()
        assert stored.approved is not None
        assert store.settle_approval("s", 1, True) is False  # decided: refused
        assert store.settle_approval("s", 9, True) is False  # never waited


V3_TABLES = """
CREATE TABLE baselines (hash TEXT PRIMARY KEY NOT NULL, body BLOB NOT NULL);
CREATE TABLE sessions (
    id TEXT PRIMARY KEY NOT NULL, baseline TEXT NOT NULL REFERENCES baselines(hash),
    parent TEXT, slot INTEGER NOT NULL, turns INTEGER NOT NULL DEFAULT 0,
    next_call_id INTEGER NOT NULL DEFAULT 1, untrusted INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL, updated_at TEXT NOT NULL, agent TEXT NOT NULL DEFAULT 'default');
CREATE TABLE messages (
    session TEXT NOT NULL REFERENCES sessions(id), seq INTEGER NOT NULL, body BLOB NOT NULL,
    compacted INTEGER NOT NULL DEFAULT 0, at TEXT NOT NULL, PRIMARY KEY (session, seq));
PRAGMA user_version = 3;
"""


def test_what_a_family_spent_is_kept_with_its_waiting_rows_only(opener: Any) -> None:
    with opener() as store:
        for call_id in (1, 2):
            store.run_batch(
                [("s", lambda cur, c=call_id: store.add_approval_in(cur, entry("s", c)))]
            )
        assert store.settle_approval("s", 2, True)
        store.run_batch([("s", lambda cur: store.record_spent_in(cur, "s", [1, 2, 3], 120))])
    with opener() as store:
        waiting, decided = store.approvals()
        assert (waiting.spent, waiting.approved) == (120, None)
        assert (decided.spent, decided.approved) == (0, True)  # a decided row keeps its own


def test_only_a_decided_row_is_marked_carried_out(opener: Any) -> None:
    with opener() as store:
        for call_id in (1, 2):
            store.run_batch(
                [("s", lambda cur, c=call_id: store.add_approval_in(cur, entry("s", c)))]
            )
        assert store.settle_approval("s", 2, True)
        store.run_batch([("s", lambda cur: store.mark_ran_in(cur, "s", [1, 2, 3]))])
    with opener() as store:
        waiting, decided = store.approvals()
        assert (waiting.approved, waiting.ran) == (None, False)  # still asks a person
        assert (decided.approved, decided.ran) == (True, True)
        assert not store.settle_approval("s", 2, False)  # carried out: no second decision


def test_a_decision_goes_from_its_row_to_its_result_in_one_write(opener: Any) -> None:
    from messages import Baseline, CallDecision, ChatMessage, ToolCall

    calls = ChatMessage(
        role="assistant", tool_calls=(ToolCall(1, "deploy", "{}"), ToolCall(2, "deploy", "{}"))
    )
    with opener() as store:
        store.create("s", Baseline(system="You help."), 0)
        store.append(
            "s",
            (ChatMessage(role="user", content="go"), calls),
            turns=1,
            next_call_id=3,
            untrusted=False,
        )
        for call_id in (1, 2):
            store.run_batch(
                [("s", lambda cur, c=call_id: store.add_approval_in(cur, entry("s", c)))]
            )
        assert store.settle_approval("s", 1, False, "not now")
        assert store.settle_approval("s", 2, True)
    with opener() as store:
        # Read back before any result: the decisions of the open calls come with the record.
        decided = store.open("s").decided
        assert [(d.request.call_id, d.approved, d.reason) for d in decided] == [
            (1, False, "not now"),
            (2, True, ""),
        ]
        declined = ChatMessage(
            role="tool",
            content="Denied: a person declined this call: not now.",
            tool_call_id=1,
            decision=CallDecision(False, None, "not now"),
        )
        store.append("s", (declined,), turns=1, next_call_id=3, untrusted=False)
        assert [e.request.call_id for e in store.approvals()] == [2]  # 1 went with its result
        assert [d.request.call_id for d in store.open("s").decided] == [2]
        plain = ChatMessage(role="tool", content="deployed", tool_call_id=2)
        store.append(
            "s", (plain,), turns=1, next_call_id=3, untrusted=False
        )  # no decision: the row stays
        assert [e.request.call_id for e in store.approvals()] == [2]
        assert store.open("s").decided == ()  # every call has its result


def test_a_decision_from_outside_is_refused_while_another_process_runs_the_session(
    opener: Any,
) -> None:
    from actors.stores.base import StoreError
    from messages import Baseline

    with opener() as runner, opener() as shell:  # two processes' stores, each its connection
        runner.create("s", Baseline(system="You help."), 0)  # it runs s now
        runner.run_batch([("s", lambda cur: runner.add_approval_in(cur, entry("s", 1)))])
        if isinstance(runner, SessionStore):
            assert shell.settle_approval("s", 1, True)  # SQLite: the home's lock guards it
            return
        with pytest.raises(StoreError, match="another loopd process holds it"):
            shell.settle_approval("s", 1, True)
        assert runner.approvals()[0].approved is None  # nothing was recorded
        runner.release("s")  # its actor went (passivated, or the runtime stopped)
        assert shell.settle_approval("s", 1, True)


def test_a_version_3_store_gains_the_approvals_table(tmp_path: Path) -> None:
    path = tmp_path / "loopd.db"
    raw = sqlite3.connect(path)
    raw.executescript(V3_TABLES)
    raw.close()
    with SessionStore(path) as store:
        assert store.approvals() == []
        store.run_batch([("s", lambda cur: store.add_approval_in(cur, entry("s", 1)))])
        assert store.approvals() == [entry("s", 1)]
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA user_version").fetchone() == (6,)
    finally:
        raw.close()
