"""The A2A endpoint's task rows (schema 5's ``a2a_tasks``): stored, replaced, read back by id
and by context, dropped; a version 4 store gains the table when it is opened."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from actors.stores.a2a_rows import A2aTaskRow
from actors.stores.sqlite import SCHEMA_VERSION, SessionStore

pytestmark = pytest.mark.timeout(30)


def test_a_task_row_is_stored_replaced_listed_and_dropped(tmp_path: Path) -> None:
    with SessionStore(tmp_path / "loopd.db") as store:
        assert store.a2a_task("t1") is None and store.a2a_tasks() == []
        first = A2aTaskRow("t1", "ops", "TASK_STATE_WORKING", b'{"id":"t1"}')
        store.save_a2a_task(first)
        store.save_a2a_task(A2aTaskRow("t2", "other", "TASK_STATE_COMPLETED", b"{}"))
        assert store.a2a_task("t1") == first
        done = A2aTaskRow("t1", "ops", "TASK_STATE_COMPLETED", b'{"id":"t1","done":1}')
        store.save_a2a_task(done)  # the same task again: its row is replaced
        assert store.a2a_task("t1") == done
        assert sorted(r.id for r in store.a2a_tasks()) == ["t1", "t2"]
        assert store.a2a_tasks("ops") == [done]
        store.drop_a2a_task("t1")
        assert store.a2a_task("t1") is None and [r.id for r in store.a2a_tasks()] == ["t2"]
    with SessionStore(tmp_path / "loopd.db") as again:  # durable: a new connection reads it
        assert [r.id for r in again.a2a_tasks()] == ["t2"]


def test_a_version_4_store_gains_the_a2a_tasks_table(tmp_path: Path) -> None:
    path = tmp_path / "loopd.db"
    SessionStore(path).close()
    raw = sqlite3.connect(path)
    try:  # made into version 4's: no a2a_tasks nor remote_tasks table, no running mark
        raw.execute("DROP TABLE a2a_tasks")
        raw.execute("DROP TABLE remote_tasks")
        raw.execute("ALTER TABLE sessions DROP COLUMN running")
        raw.execute("PRAGMA user_version = 4")
        raw.commit()
    finally:
        raw.close()
    with SessionStore(path) as store:
        assert store.a2a_tasks() == []
        store.save_a2a_task(A2aTaskRow("t", "c", "TASK_STATE_WORKING", b"{}"))
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (6,)
    finally:
        raw.close()
