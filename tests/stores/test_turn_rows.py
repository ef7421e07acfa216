"""Which sessions a crash cut off mid-turn: the ``running`` mark of the SQL stores (schema 5),
set by a turn's first write and cleared by its last. Runs on SQLite here and on PostgreSQL in
``tox -e cluster`` (the ``store`` fixture)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_store import BASELINE, raw_db, user

from actors.stores.sqlite import SessionStore
from messages import ChatMessage

BACKENDS = ["sqlite", *(["postgresql"] if os.environ.get("LOOPD_CLUSTER_TESTS") == "1" else [])]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "sqlite":
        with SessionStore(tmp_path / "loopd.db") as s:
            yield s
        return
    from actors.stores.postgres import PgSessionStore

    with PgSessionStore(request.getfixturevalue("pg_database")()) as s:
        yield s


def answer(text: str) -> ChatMessage:
    return ChatMessage(role="assistant", content=text)


def test_a_turn_is_marked_by_its_first_write_and_unmarked_by_its_last(store: Any) -> None:
    store.create("a", BASELINE, 0)
    assert store.interrupted() == []
    store.append("a", [user("hi")], turns=1, next_call_id=1, untrusted=False, running=True)
    assert [r.id for r in store.interrupted()] == ["a"]
    store.append("a", [answer("hm")], turns=1, next_call_id=1, untrusted=False)  # unchanged
    assert [r.id for r in store.interrupted()] == ["a"]
    store.append("a", [answer("done")], turns=1, next_call_id=1, untrusted=False, running=False)
    assert store.interrupted() == []


def test_a_new_child_and_a_session_made_with_its_first_message_are_marked(store: Any) -> None:
    store.create("p", BASELINE, 0)
    store.run_batch(
        [("q", lambda cur: store.open_or_create_in(cur, "q", BASELINE, 0, first=user("hello")))]
    )
    store.create_child("sub-p-1", "p", BASELINE, 1, untrusted=False, first=user("task"))
    store.create_child("sub-p-2", "p", BASELINE, 1, untrusted=False, first=user("t"), running=False)
    marked = {r.id: r for r in store.interrupted()}
    assert set(marked) == {"q", "sub-p-1"}
    assert marked["sub-p-1"].transcript == (user("task"),)  # the record, to repair from


def test_a_version_4_store_gains_the_running_mark(tmp_path: Path) -> None:
    db = tmp_path / "loopd.db"
    with SessionStore(db) as store:
        store.create("mm", BASELINE, 0)
    with raw_db(db) as raw:  # made into version 4's: no running column, no A2A tables
        raw.execute("ALTER TABLE sessions DROP COLUMN running")
        raw.execute("DROP TABLE a2a_tasks")
        raw.execute("DROP TABLE remote_tasks")
        raw.execute("PRAGMA user_version = 4")
    with SessionStore(db) as store:
        assert store.interrupted() == []  # nothing ran under version 4's eyes
        store.append("mm", [user("x")], turns=1, next_call_id=1, untrusted=False, running=True)
        assert [r.id for r in store.interrupted()] == ["mm"]
    with raw_db(db) as raw:
        assert raw.execute("PRAGMA user_version").fetchone() == (6,)
