"""The session store: real SQLite files, reopened like a process restart, and its actor."""

from __future__ import annotations

import copy
import os
import pickle
import socket
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pykka
import pytest
from pykka import ThreadingFuture
from pykka._envelope import Envelope

from actors.dispatcher.directory import STORE, Directory
from actors.services.store import StoreActor, _Inbox
from actors.stores.base import (
    SessionExists,
    SessionNotFound,
    SessionTaken,
    StoreError,
    StoreFileReplaced,
)
from actors.stores.sqlite import SCHEMA_VERSION, SQLITE, SessionStore
from actors.testing import Answer, Probe, call, reply
from messages import (
    Appended,
    AppendMessages,
    Baseline,
    ChatMessage,
    CompactHistory,
    CreateChild,
    FailReason,
    ModelRequest,
    OpenSession,
    SessionLoaded,
    StoreFailed,
    SubagentFinished,
    ToolCall,
    ToolSpec,
    TurnCompleted,
    TurnFailed,
)

BASELINE = Baseline(
    system="You are careful.",
    tools=(
        ToolSpec(
            name="subagent",
            description="Run a task in a child session.",
            parameters={
                "type": "object",
                "properties": {"task": {"type": "string"}},
                "required": ["task"],
                "additionalProperties": False,
            },
        ),
    ),
)
OTHER = Baseline(system="Something else entirely.")


def user(text: str) -> ChatMessage:
    return ChatMessage(role="user", content=text)


def conversation() -> list[ChatMessage]:
    """A turn with a tool call: user, assistant calling, tool answer, assistant answer."""
    return [
        user("what time is it?"),
        ChatMessage(role="assistant", tool_calls=(ToolCall(id=1, name="clock", arguments="{}"),)),
        ChatMessage(role="tool", content="2026-11-29T23:59:01Z", tool_call_id=1),
        ChatMessage(role="assistant", content="It is late."),
    ]


@contextmanager
def raw_db(path: Path) -> Iterator[sqlite3.Connection]:
    """A plain connection behind the store's back (to inspect or damage rows); committed, closed."""
    conn = sqlite3.connect(path)
    try:
        with conn:
            yield conn
    finally:
        conn.close()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "home" / "loopd.db"


# The tests that hold for any store (the session logic, written once in actors/stores/sql.py)
# run on SQLite and, in `tox -e cluster` (which has a PostgreSQL server), on PostgreSQL too; the
# rest are about the SQLite file itself.
BACKENDS = ["sqlite", *(["postgresql"] if os.environ.get("LOOPD_CLUSTER_TESTS") == "1" else [])]


class Opener:
    """Opens this test's store, a new connection each call (as a new process would), and runs
    statements behind its back."""

    def __init__(self, backend: str, where: Path | str) -> None:
        self.backend = backend
        self.where = where

    def __call__(self) -> Any:
        if self.backend == "sqlite":
            return SessionStore(self.where)
        from actors.stores.postgres import PgSessionStore

        return PgSessionStore(str(self.where))

    def raw(self, text: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run one statement (``{t}`` before each table name, ``?`` for a parameter) on a
        connection of its own, committed; its rows."""
        if self.backend == "sqlite":
            with raw_db(Path(self.where)) as conn:
                return conn.execute(SQLITE.sql(text), params).fetchall()
        import psycopg

        from actors.stores.postgres import PG

        with psycopg.connect(str(self.where), autocommit=True) as conn:
            cur = conn.execute(PG.sql(text), params)
            return cur.fetchall() if cur.description is not None else []


@pytest.fixture(params=BACKENDS)
def open_store(request: pytest.FixtureRequest, db: Path) -> Opener:
    """Opens the store of this test on one backend, a new connection each call."""
    if request.param == "sqlite":
        return Opener("sqlite", db)
    return Opener("postgresql", request.getfixturevalue("pg_database")())


@pytest.fixture
def store(open_store: Opener) -> Iterator[Any]:
    with open_store() as s:
        yield s


@pytest.fixture
def sqlite_store(db: Path) -> Iterator[SessionStore]:
    with SessionStore(db) as s:
        yield s


# --- SessionStore ------------------------------------------------------------------------------


def test_create_then_open_round_trips_the_baseline_byte_for_byte(open_store: Opener) -> None:
    with open_store() as store:
        created = store.create("mm-thread", BASELINE, 3)
    assert created.transcript == ()
    assert (created.turns, created.next_call_id, created.untrusted) == (0, 1, False)

    with open_store() as store:
        opened = store.open("mm-thread")
    assert opened == created
    assert opened.slot == 3
    assert msgspec.json.encode(opened.baseline) == msgspec.json.encode(BASELINE)
    ((stored,),) = open_store.raw(
        "SELECT b.body FROM {t}sessions s JOIN {t}baselines b ON b.hash = s.baseline"
    )
    assert stored == msgspec.json.encode(BASELINE)


def test_store_file_is_configured_for_durability(sqlite_store: SessionStore, db: Path) -> None:
    assert db.is_file()
    with raw_db(db) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert raw.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (6,)


def test_create_of_a_known_id_raises_session_exists_and_changes_nothing(
    store: Any,
) -> None:
    store.create("a", BASELINE, 0)
    with pytest.raises(SessionExists, match="'a'") as info:
        store.create("a", OTHER, 5)
    assert isinstance(info.value, StoreError)
    assert info.value.session == "a"
    assert store.open("a").baseline == BASELINE
    assert store.open("a").slot == 0


def test_create_refuses_an_invalid_id(store: Any) -> None:
    with pytest.raises(ValueError, match="invalid session id"):
        store.create("a" * 65, BASELINE, 0)
    with pytest.raises(ValueError, match="invalid session id"):
        store.open_or_create("../etc", BASELINE, 0)
    assert store.list_sessions() == []


def test_unknown_ids_raise_session_not_found(store: Any) -> None:
    with pytest.raises(SessionNotFound, match="'ghost'"):
        store.open("ghost")
    with pytest.raises(SessionNotFound, match="'ghost'"):
        store.append("ghost", [user("hi")], turns=1, next_call_id=1, untrusted=False)
    with pytest.raises(SessionNotFound, match="'ghost'"):
        store.compact("ghost", user("summary"))
    with pytest.raises(SessionNotFound, match="'ghost'"):
        store.history("ghost")
    assert store.list_sessions() == []


def test_open_or_create_keeps_the_stored_baseline_and_slot(store: Any) -> None:
    record, created = store.open_or_create("s", BASELINE, 1)
    assert created
    assert (record.baseline, record.slot) == (BASELINE, 1)
    store.append("s", [user("hello")], turns=1, next_call_id=1, untrusted=False)

    again, created = store.open_or_create("s", OTHER, 7)
    assert not created
    assert (again.baseline, again.slot) == (BASELINE, 1)
    assert again.transcript == (user("hello"),)


def test_appends_keep_their_order_across_a_restart(open_store: Opener) -> None:
    first, second = conversation(), [user("and now?"), ChatMessage(role="assistant", content="ok")]
    with open_store() as store:
        store.create("s", BASELINE, 0)
        store.append("s", first[:1], turns=0, next_call_id=1, untrusted=False)
        store.append("s", first[1:], turns=1, next_call_id=2, untrusted=False)
    with open_store() as store:  # a new process
        store.append("s", second, turns=2, next_call_id=2, untrusted=False)
        store.append("s", [], turns=2, next_call_id=2, untrusted=False)  # counters only
    with open_store() as store:
        record = store.open("s")
        history = store.history("s")
    assert record.transcript == (*first, *second)
    assert (record.turns, record.next_call_id) == (2, 2)
    assert [h.seq for h in history] == [1, 2, 3, 4, 5, 6]
    assert not any(h.compacted for h in history)
    assert all(h.at.endswith("Z") for h in history)


def test_next_call_id_never_goes_down_and_persists(open_store: Opener) -> None:
    with open_store() as store:
        store.create("s", BASELINE, 0)
        store.append("s", [user("one")], turns=1, next_call_id=5, untrusted=False)
        with pytest.raises(StoreError, match=r"'s'.*next_call_id 4.*5"):
            store.append("s", [user("lost")], turns=2, next_call_id=4, untrusted=True)
        # Nothing of the refused append was written, not even its untrusted flag.
        record = store.open("s")
        assert record.transcript == (user("one"),)
        assert (record.turns, record.next_call_id, record.untrusted) == (1, 5, False)
    with open_store() as store:
        assert store.open("s").next_call_id == 5
        with pytest.raises(StoreError):
            store.append("s", [], turns=1, next_call_id=1, untrusted=False)
        store.append("s", [], turns=1, next_call_id=5, untrusted=False)  # equal is fine
        store.append("s", [], turns=1, next_call_id=6, untrusted=False)
    with open_store() as store:
        assert store.open("s").next_call_id == 6


def test_untrusted_is_sticky(open_store: Opener) -> None:
    with open_store() as store:
        store.create("s", BASELINE, 0)
        store.append("s", [user("a")], turns=1, next_call_id=1, untrusted=True)
        store.append("s", [user("b")], turns=2, next_call_id=1, untrusted=False)
        assert store.open("s").untrusted
        store.compact("s", user("summary"))
    with open_store() as store:
        assert store.open("s").untrusted
        assert store.list_sessions()[0].untrusted


def test_compact_keeps_old_rows_and_leaves_only_the_summary_live(open_store: Opener) -> None:
    summary = ChatMessage(role="user", content="Summary: the user asked the time; it was late.")
    with open_store() as store:
        store.create("s", BASELINE, 0)
        store.append("s", conversation(), turns=1, next_call_id=2, untrusted=False)
        store.compact("s", summary)
        assert store.open("s").transcript == (summary,)
        store.append("s", [user("next")], turns=2, next_call_id=2, untrusted=False)
    with open_store() as store:
        record = store.open("s")
        history = store.history("s")
        info = store.list_sessions()[0]
    assert record.transcript == (summary, user("next"))
    assert record.baseline == BASELINE
    assert [h.message for h in history] == [*conversation(), summary, user("next")]
    assert [h.compacted for h in history] == [True] * 4 + [False, False]
    assert info.messages == 6

    with open_store() as store:  # a second compaction compacts the first summary too
        store.compact("s", user("shorter"))
        assert store.open("s").transcript == (user("shorter"),)
        assert [h.compacted for h in store.history("s")] == [True] * 6 + [False]


def test_children_lists_direct_children_only(store: Any) -> None:
    for sid in [
        "mm-thread",
        "sub-mm-thread-1",
        "sub-mm-thread-10",
        "sub-mm-thread-2",
        "sub-sub-mm-thread-1-1",  # grandchild
        "sub-mm-thread-1-2",  # child of mm-thread-1, not of mm-thread
        "sub-mm-thread-x",
        "sub-mm-thread-",
        "sub-mm-thread-3a",
        "sub-mm-threadX-4",
    ]:
        store.create(sid, BASELINE, 1)
    assert store.children("mm-thread") == [
        "sub-mm-thread-1",
        "sub-mm-thread-2",
        "sub-mm-thread-10",
    ]
    assert store.children("sub-mm-thread-1") == ["sub-sub-mm-thread-1-1"]
    assert store.children("mm-thread-1") == ["sub-mm-thread-1-2"]
    assert store.children("nobody") == []


def test_list_sessions_is_sorted_and_counts_messages(store: Any) -> None:
    store.create("b", BASELINE, 1)
    store.create("a", BASELINE, 0)
    store.append("b", conversation(), turns=1, next_call_id=2, untrusted=True)
    infos = store.list_sessions()
    assert [i.id for i in infos] == ["a", "b"]
    a, b = infos
    assert (a.slot, a.turns, a.untrusted, a.messages) == (0, 0, False, 0)
    assert (b.slot, b.turns, b.untrusted, b.messages) == (1, 1, True, 4)
    assert b.created_at <= b.updated_at


def test_a_corrupt_row_raises_store_error_naming_its_seq_and_loses_nothing(
    open_store: Opener,
) -> None:
    with open_store() as store:
        store.create("s", BASELINE, 0)
        store.create("t", BASELINE, 0)
        store.append("s", conversation(), turns=1, next_call_id=2, untrusted=False)
        store.append("t", [user("fine")], turns=1, next_call_id=1, untrusted=False)
    open_store.raw(
        "UPDATE {t}messages SET body = ? WHERE session = 's' AND seq = 3", (b"{not json",)
    )

    with open_store() as store:
        with pytest.raises(StoreError, match=r"'s'.*seq 3") as info:
            store.open("s")
        assert info.value.session == "s"
        with pytest.raises(StoreError, match=r"seq 3"):
            store.history("s")
        # Other sessions read as before, and the store neither dropped nor rewrote a row.
        assert store.open("t").transcript == (user("fine"),)
        assert [i.messages for i in store.list_sessions()] == [4, 1]
    rows = open_store.raw("SELECT seq, body FROM {t}messages WHERE session = 's' ORDER BY seq")
    assert [seq for seq, _ in rows] == [1, 2, 3, 4]
    assert bytes(rows[2][1]) == b"{not json"


def test_a_well_formed_but_wrong_row_is_also_an_error(open_store: Opener) -> None:
    with open_store() as store:
        store.create("s", BASELINE, 0)
        store.append("s", [user("a")], turns=1, next_call_id=1, untrusted=False)
    wrong = b'{"type": "ChatMessage", "role": "robot"}'
    open_store.raw("UPDATE {t}messages SET body = ?", (wrong,))
    open_store.raw("UPDATE {t}baselines SET body = ?", (b"[]",))
    with open_store() as store:
        with pytest.raises(StoreError, match="baseline"):
            store.open("s")
        with pytest.raises(StoreError, match="seq 1"):
            store.history("s")


def test_session_ids_are_only_sql_values_and_files_stay_under_the_path(
    tmp_path: Path, open_store: Opener
) -> None:
    hostile = ["x'); DROP TABLE sessions; --", "%", "_", "../../escape", "/tmp/x"]
    with open_store() as store:
        store.create("a_b", BASELINE, 0)
        store.create("sub-a_b-1", BASELINE, 0)
        store.create("sub-aXb-2", BASELINE, 0)  # would match if '_' were a LIKE wildcard
        store.create("a.b-c..d", BASELINE, 0)
        for sid in hostile:
            with pytest.raises(SessionNotFound):
                store.open(sid)
            with pytest.raises(SessionNotFound):
                store.append(sid, [], turns=0, next_call_id=1, untrusted=False)
            assert store.children(sid) == []
        assert store.children("a_b") == ["sub-a_b-1"]
        ids = [i.id for i in store.list_sessions()]
        assert ids == sorted(["a_b", "sub-a_b-1", "sub-aXb-2", "a.b-c..d"])
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert all(f == "home" or f.startswith("home/loopd.db") for f in files), files


def test_closed_store_raises_store_error(open_store: Opener) -> None:
    store = open_store()
    store.create("s", BASELINE, 0)
    store.close()
    store.close()  # twice is fine
    with pytest.raises(StoreError, match="closed"):
        store.open("s")


def test_a_file_that_is_not_a_store_is_refused(tmp_path: Path) -> None:
    junk = tmp_path / "loopd.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="cannot open the store"):
        SessionStore(junk)

    newer = tmp_path / "newer.db"
    with raw_db(newer) as raw:
        raw.execute("PRAGMA user_version = 99")
    with pytest.raises(StoreError, match="schema version 99"):
        SessionStore(newer)


def test_store_errors_copy_and_pickle_with_their_text() -> None:
    for error in (SessionExists("a"), SessionNotFound("b"), StoreError("c", "broke")):
        for clone in (copy.copy(error), pickle.loads(pickle.dumps(error))):
            assert type(clone) is type(error)
            assert str(clone) == str(error)
            assert clone.session == error.session


# --- StoreActor ---------------------------------------------------------------------------------


@pytest.fixture
def actor(db: Path, directory: Directory) -> Iterator[pykka.ActorRef[StoreActor]]:
    ref = StoreActor.start(db, directory)
    directory.register(STORE, ref)
    yield ref
    ref.stop()


@pytest.fixture
def any_actor(open_store: Opener, directory: Directory) -> Iterator[pykka.ActorRef[StoreActor]]:
    """A store actor over either backend."""
    ref = StoreActor.start(open_store, directory)
    directory.register(STORE, ref)
    yield ref
    ref.stop()


def test_store_actor_answers_each_request_at_its_reply_address(
    any_actor: pykka.ActorRef[StoreActor], directory: Directory, probe: Probe, open_store: Opener
) -> None:
    directory.tell(STORE, OpenSession("s", BASELINE, 1, reply_to="probe"))
    loaded = probe.next()
    assert isinstance(loaded, SessionLoaded)
    assert loaded.created
    assert loaded.record.baseline == BASELINE

    directory.tell(
        STORE,
        AppendMessages(
            "s", 7, tuple(conversation()), turns=1, next_call_id=2, untrusted=True, reply_to="probe"
        ),
    )
    assert probe.next() == Appended("s", 7)
    # Appended means durable: another connection (another process) sees it at once.
    with open_store() as reader:
        assert reader.open("s").transcript == tuple(conversation())

    directory.tell(STORE, CompactHistory("s", 8, user("summary"), reply_to="probe"))
    assert probe.next() == Appended("s", 8)

    directory.tell(STORE, OpenSession("s", OTHER, 5, reply_to="probe"))
    again = probe.next()
    assert isinstance(again, SessionLoaded)
    assert not again.created
    assert (again.record.baseline, again.record.slot) == (BASELINE, 1)
    assert again.record.transcript == (user("summary"),)
    assert (again.record.next_call_id, again.record.untrusted) == (2, True)


def test_an_open_that_creates_stores_the_first_message_in_the_same_transaction(
    any_actor: pykka.ActorRef[StoreActor], directory: Directory, probe: Probe, open_store: Opener
) -> None:
    # A new session's first turn: created with its user message and its first turn counted,
    # durable when answered; a stored session is opened as it is, the message not added.
    directory.tell(STORE, OpenSession("s", BASELINE, 1, reply_to="probe", first=user("hi")))
    loaded = probe.next()
    assert isinstance(loaded, SessionLoaded) and loaded.created
    assert (loaded.record.transcript, loaded.record.turns) == ((user("hi"),), 1)
    with open_store() as reader:
        assert reader.open("s") == loaded.record
    directory.tell(STORE, OpenSession("s", OTHER, 5, reply_to="probe", first=user("again")))
    again = probe.next()
    assert isinstance(again, SessionLoaded) and not again.created
    assert again.record == loaded.record


def test_store_actor_answers_failures_and_keeps_serving(
    any_actor: pykka.ActorRef[StoreActor], directory: Directory, probe: Probe
) -> None:
    directory.tell(
        STORE,
        AppendMessages("ghost", 3, (), turns=0, next_call_id=1, untrusted=False, reply_to="probe"),
    )
    failed = probe.next()
    assert isinstance(failed, StoreFailed)
    assert (failed.session, failed.request_id, failed.exists) == ("ghost", 3, False)
    assert "ghost" in failed.detail

    directory.tell(STORE, CompactHistory("ghost", 4, user("x"), reply_to="probe"))
    failed = probe.next()
    assert isinstance(failed, StoreFailed)
    assert failed.request_id == 4

    directory.tell(STORE, OpenSession("s", BASELINE, 0, reply_to="probe", create_only=True))
    assert isinstance(probe.next(), SessionLoaded)
    directory.tell(STORE, OpenSession("s", BASELINE, 0, reply_to="probe", create_only=True))
    exists = probe.next()
    assert isinstance(exists, StoreFailed)
    assert exists.exists

    directory.tell(
        STORE,
        AppendMessages("s", 5, (), turns=0, next_call_id=3, untrusted=False, reply_to="probe"),
    )
    assert probe.next() == Appended("s", 5)
    directory.tell(
        STORE,
        AppendMessages("s", 6, (), turns=0, next_call_id=2, untrusted=False, reply_to="probe"),
    )
    lower = probe.next()
    assert isinstance(lower, StoreFailed)
    assert (lower.request_id, lower.exists) == (6, False)

    # An invalid id cannot even reach the store: the message refuses to be built.
    with pytest.raises(ValueError, match="invalid session id"):
        OpenSession("bad id!", BASELINE, 0, reply_to="probe")

    directory.tell(STORE, "not a store request")  # ignored with a warning
    directory.tell(STORE, OpenSession("s", BASELINE, 0, reply_to="probe"))
    assert isinstance(probe.next(), SessionLoaded)
    assert any_actor.is_alive()


def test_store_actor_that_cannot_open_its_file_still_answers(
    tmp_path: Path, directory: Directory, probe: Probe
) -> None:
    junk = tmp_path / "loopd.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    ref = StoreActor.start(junk, directory)
    try:
        ref.tell(OpenSession("s", BASELINE, 0, reply_to="probe"))
        failed = probe.next()
        assert isinstance(failed, StoreFailed)
        assert "cannot open the store" in failed.detail
        ref.tell(
            AppendMessages("s", 9, (), turns=0, next_call_id=1, untrusted=False, reply_to="probe")
        )
        assert probe.next().request_id == 9
    finally:
        ref.stop()


def test_store_actor_closes_the_store_consistently_on_stop(
    open_store: Opener, directory: Directory, probe: Probe
) -> None:
    ref = StoreActor.start(open_store, directory)
    ref.tell(OpenSession("s", BASELINE, 0, reply_to="probe"))
    ref.tell(
        AppendMessages(
            "s", 1, (user("kept"),), turns=1, next_call_id=1, untrusted=False, reply_to="probe"
        )
    )
    ref.stop()  # pykka handles queued messages before the stop
    assert isinstance(probe.next(), SessionLoaded)
    assert probe.next() == Appended("s", 1)
    with open_store() as store:
        assert store.open("s").transcript == (user("kept"),)


# --- Schema 2: baselines stored once, version 1 stores migrated ---------------------------------

# The schema of version 1 stores, exactly as loopd wrote it, to make a file of the old kind.
V1_SCHEMA = """
CREATE TABLE sessions (
    id           TEXT PRIMARY KEY NOT NULL,
    baseline     BLOB NOT NULL,
    slot         INTEGER NOT NULL,
    turns        INTEGER NOT NULL DEFAULT 0,
    next_call_id INTEGER NOT NULL DEFAULT 1 CHECK (next_call_id >= 1),
    untrusted    INTEGER NOT NULL DEFAULT 0 CHECK (untrusted IN (0, 1)),
    created_at   TEXT NOT NULL,
    updated_at   TEXT NOT NULL
);
CREATE TABLE messages (
    session   TEXT NOT NULL REFERENCES sessions(id),
    seq       INTEGER NOT NULL CHECK (seq >= 1),
    body      BLOB NOT NULL,
    compacted INTEGER NOT NULL DEFAULT 0 CHECK (compacted IN (0, 1)),
    at        TEXT NOT NULL,
    PRIMARY KEY (session, seq)
);
PRAGMA user_version = 1;
"""


def make_v1_store(db: Path) -> None:
    """A version 1 loopd.db: two sessions sharing a baseline, one with another, some history."""
    db.parent.mkdir(parents=True, exist_ok=True)
    enc = msgspec.json.encode
    at = "2026-11-01T00:00:00.000Z"
    with raw_db(db) as raw:
        raw.executescript(V1_SCHEMA)
        rows = [
            ("mm", enc(BASELINE), 0, 1, 2, 0),
            ("sub-mm-1", enc(BASELINE), 1, 1, 1, 1),
            ("other", enc(OTHER), 0, 0, 1, 0),
        ]
        for sid, body, slot, turns, next_call_id, untrusted in rows:
            raw.execute(
                "INSERT INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (sid, body, slot, turns, next_call_id, untrusted, at, at),
            )
        for seq, message in enumerate(conversation(), 1):
            raw.execute(
                "INSERT INTO messages VALUES ('mm', ?, ?, ?, ?)",
                (seq, enc(message), int(seq < 3), at),
            )
        raw.execute("INSERT INTO messages VALUES ('sub-mm-1', 1, ?, 0, ?)", (enc(user("t")), at))


def test_a_version_1_store_is_migrated_and_keeps_working(db: Path) -> None:
    make_v1_store(db)
    with SessionStore(db) as store:
        mm = store.open("mm")
        assert mm.baseline == BASELINE and mm.slot == 0
        assert mm.transcript == tuple(conversation()[2:])  # compacted rows stay compacted
        assert (mm.turns, mm.next_call_id, mm.untrusted, mm.parent) == (1, 2, False, None)
        assert mm.agent == "default"
        assert [m.seq for m in store.history("mm")] == [1, 2, 3, 4]
        child = store.open("sub-mm-1")
        assert (child.untrusted, child.transcript, child.parent) == (True, (user("t"),), None)
        assert store.open("other").baseline == OTHER
        store.append("mm", [user("after")], turns=2, next_call_id=2, untrusted=False)
        store.create("new", BASELINE, 0)
    with raw_db(db) as raw:
        assert raw.execute("PRAGMA user_version").fetchone() == (6,)
        assert raw.execute("SELECT COUNT(*) FROM baselines").fetchone() == (2,)
        assert raw.execute("PRAGMA foreign_key_check").fetchall() == []
    # Opened again (now version 3), nothing moves.
    with SessionStore(db) as store:
        assert store.open("mm").transcript[-1] == user("after")
        assert [i.id for i in store.list_sessions()] == ["mm", "new", "other", "sub-mm-1"]


# The tables of version 2 stores, exactly as loopd wrote them (no ``agent``).
V2_SCHEMA = """
CREATE TABLE baselines (
    hash TEXT PRIMARY KEY NOT NULL,
    body BLOB NOT NULL
);
CREATE TABLE sessions (
    id           TEXT PRIMARY KEY NOT NULL,
    baseline     TEXT NOT NULL REFERENCES baselines(hash),
    parent       TEXT,
    slot         INTEGER NOT NULL,
    turns        INTEGER NOT NULL DEFAULT 0,
    next_call_id INTEGER NOT NULL DEFAULT 1 CHECK (next_call_id >= 1),
    untrusted    INTEGER NOT NULL DEFAULT 0 CHECK (untrusted IN (0, 1)),
    created_at   TEXT NOT NULL,
    updated_at   TEXT NOT NULL
);
CREATE TABLE messages (
    session   TEXT NOT NULL REFERENCES sessions(id),
    seq       INTEGER NOT NULL CHECK (seq >= 1),
    body      BLOB NOT NULL,
    compacted INTEGER NOT NULL DEFAULT 0 CHECK (compacted IN (0, 1)),
    at        TEXT NOT NULL,
    PRIMARY KEY (session, seq)
);
PRAGMA user_version = 2;
"""


def test_a_version_2_store_is_migrated_and_its_sessions_run_default(db: Path) -> None:
    db.parent.mkdir(parents=True, exist_ok=True)
    body = msgspec.json.encode(BASELINE)
    at = "2026-11-01T00:00:00.000Z"
    with raw_db(db) as raw:
        raw.executescript(V2_SCHEMA)
        raw.execute("INSERT INTO baselines VALUES ('h', ?)", (body,))
        raw.execute("INSERT INTO sessions VALUES ('mm', 'h', NULL, 0, 1, 3, 0, ?, ?)", (at, at))
        raw.execute(
            "INSERT INTO messages VALUES ('mm', 1, ?, 0, ?)", (msgspec.json.encode(user("hi")), at)
        )
    with SessionStore(db) as store:
        mm = store.open("mm")
        assert (mm.agent, mm.turns, mm.next_call_id, mm.transcript) == (
            "default",
            1,
            3,
            (user("hi"),),
        )
        store.create("planned", BASELINE, 0, agent="planner")
    with raw_db(db) as raw:
        assert raw.execute("PRAGMA user_version").fetchone() == (6,)
    with SessionStore(db) as store:
        assert store.open("planned").agent == "planner"
        assert [(i.id, i.agent) for i in store.list_sessions()] == [
            ("mm", "default"),
            ("planned", "planner"),
        ]


def test_background_rows_are_replaced_and_leave_with_the_messages_that_deliver_them(
    store: Any,
) -> None:
    from messages import BackgroundRow

    store.create("p", BASELINE, 0)
    running = BackgroundRow("sub-p-1", "p", 1)
    other = BackgroundRow("sub-p-2", "p", 2)
    store.run_batch([("sub-p-1", lambda cur: store.save_background_in(cur, running))])
    store.run_batch([("sub-p-2", lambda cur: store.save_background_in(cur, other))])
    assert set(store.background()) == {running, other}
    done = BackgroundRow("sub-p-1", "p", 1, "sub-p-1 completed\nok", untrusted=True)
    store.run_batch([("sub-p-1", lambda cur: store.save_background_in(cur, done))])
    assert set(store.background()) == {other, done}  # replaced
    message = ChatMessage(role="user", content=done.report, name="subagent")

    def deliver(cur: Any) -> None:
        store.append_in(
            cur, "p", [message], turns=1, next_call_id=1, untrusted=True, reports=("sub-p-1",)
        )

    assert store.run_batch([("p", deliver)]) == [None]
    assert store.background() == (other,)
    assert store.open("p").transcript == (message,)
    store.run_batch([("sub-p-2", lambda cur: store.drop_background_in(cur, "sub-p-2"))])
    assert store.background() == ()


def test_a_version_3_store_gains_the_background_table(db: Path) -> None:
    with SessionStore(db) as store:
        store.create("mm", BASELINE, 0)
    with raw_db(db) as raw:  # made into version 3's: no background nor approvals table
        raw.execute("DROP TABLE background")
        raw.execute("DROP TABLE approvals")
        raw.execute("ALTER TABLE sessions DROP COLUMN running")
        raw.execute("DROP TABLE a2a_tasks")
        raw.execute("DROP TABLE remote_tasks")
        raw.execute("PRAGMA user_version = 3")
    with SessionStore(db) as store:
        assert store.background() == ()
        assert store.open("mm").turns == 0
    with raw_db(db) as raw:
        assert raw.execute("PRAGMA user_version").fetchone() == (6,)


def test_the_agent_is_stored_with_each_kind_of_session(store: Any) -> None:
    store.create("a", BASELINE, 0, agent="planner")
    record, created = store.open_or_create("b", BASELINE, 0, agent="writer")
    assert created and record.agent == "writer"
    again, created = store.open_or_create("b", BASELINE, 0, agent="other")
    assert not created and again.agent == "writer"  # a stored session keeps its own
    child, _ = store.create_child(
        "sub-a-1", "a", BASELINE, 1, untrusted=False, first=user("t"), agent="researcher"
    )
    assert child.agent == store.open("sub-a-1").agent == "researcher"
    assert store.open("a").agent == "planner"


def test_a_migrated_child_record_is_not_taken_for_a_child(db: Path) -> None:
    # A version 1 record never said who created it, so no spawn may open it as its child.
    make_v1_store(db)
    with SessionStore(db) as store, pytest.raises(SessionTaken):
        store.create_child("sub-mm-1", "mm", BASELINE, 1, untrusted=False, first=user("go"))


def test_a_baseline_is_stored_once_however_many_sessions_use_it(
    store: Any, open_store: Opener
) -> None:
    for i in range(5):
        store.create(f"s{i}", BASELINE, 0)
    store.create_child("sub-s0-1", "s0", BASELINE, 1, untrusted=False, first=user("t"))
    store.create("x", OTHER, 0)
    assert open_store.raw("SELECT COUNT(*) FROM {t}baselines") == [(2,)]
    assert all(store.open(f"s{i}").baseline == BASELINE for i in range(5))
    assert store.open("x").baseline == OTHER


# --- Children: created with their first message, opened only by their parent ------------------


def test_a_child_is_created_with_its_first_message_its_parent_and_its_flag(
    open_store: Opener,
) -> None:
    with open_store() as store:
        record, created = store.create_child(
            "sub-p-1", "p", BASELINE, 1, untrusted=True, first=user("It is now.\n\ntask")
        )
    assert created
    assert record.transcript == (user("It is now.\n\ntask"),)
    assert (record.turns, record.next_call_id, record.untrusted) == (1, 1, True)
    assert (record.parent, record.slot) == ("p", 1)
    with open_store() as store:  # a restart reads the same back, flag included
        assert store.open("sub-p-1") == record
        assert store.list_sessions()[0].parent == "p"


def test_a_childs_first_write_stores_its_first_message_and_what_followed_at_once(
    store: Any,
) -> None:
    # A child's record is created by its first write: its first message, then what its turn
    # stored first (here its answer), with the counters the turn has by then.
    answer = ChatMessage(role="assistant", content="done")
    record, created = store.create_child(
        "sub-p-1",
        "p",
        BASELINE,
        1,
        untrusted=True,
        first=user("task"),
        more=(answer,),
        next_call_id=3,
    )
    assert created
    assert record.transcript == (user("task"), answer)
    assert (record.turns, record.next_call_id, record.untrusted) == (1, 3, True)
    assert store.open("sub-p-1") == record
    assert [m.message for m in store.history("sub-p-1")] == [user("task"), answer]
    # Its next write appends after them.
    store.append("sub-p-1", [user("more")], turns=1, next_call_id=3, untrusted=True)
    assert [m.seq for m in store.history("sub-p-1")] == [1, 2, 3]


def test_a_child_record_its_parent_created_is_opened_as_stored(store: Any) -> None:
    first, _ = store.create_child("sub-p-1", "p", BASELINE, 1, untrusted=False, first=user("a"))
    again, created = store.create_child("sub-p-1", "p", OTHER, 0, untrusted=False, first=user("b"))
    assert not created
    assert again == first  # its own baseline and history; the new first message is not added
    # A parent that is untrusted now makes the record untrusted; the flag never goes down.
    flagged, _ = store.create_child("sub-p-1", "p", OTHER, 0, untrusted=True, first=user("c"))
    assert flagged == msgspec.structs.replace(first, untrusted=True)
    still, _ = store.create_child("sub-p-1", "p", OTHER, 0, untrusted=False, first=user("d"))
    assert still.untrusted


@pytest.mark.parametrize("forger", ["top-level", "another parent"])
def test_a_child_id_taken_by_another_record_is_refused_and_left_alone(
    store: Any, forger: str
) -> None:
    if forger == "top-level":
        store.create("sub-p-1", OTHER, 0)
        store.append("sub-p-1", [user("forged history")], turns=1, next_call_id=1, untrusted=False)
    else:
        store.create_child("sub-p-1", "q", OTHER, 0, untrusted=False, first=user("forged"))
    before = store.history("sub-p-1")
    with pytest.raises(SessionTaken, match=r"'sub-p-1'.*taken.*'p'"):
        store.create_child("sub-p-1", "p", BASELINE, 1, untrusted=False, first=user("real"))
    assert store.history("sub-p-1") == before


# --- Group commit ----------------------------------------------------------------------------


def append(session: str, rid: int, text: str, next_call_id: int = 1) -> AppendMessages:
    return AppendMessages(
        session,
        rid,
        (user(text),),
        turns=1,
        next_call_id=next_call_id,
        untrusted=False,
        reply_to="probe",
    )


def test_requests_waiting_in_the_inbox_commit_in_one_transaction_and_fail_alone(
    actor: pykka.ActorRef[StoreActor], directory: Directory, probe: Probe, db: Path
) -> None:
    for sid in ("a", "b", "c"):
        directory.tell(STORE, OpenSession(sid, BASELINE, 0, reply_to="probe", create_only=True))
    assert all(isinstance(m, SessionLoaded) for m in probe.expect_all(SessionLoaded, 3))
    store: SessionStore = actor.proxy().store.get(timeout=5)
    statements: list[str] = []
    assert store._conn is not None
    store._conn.set_trace_callback(statements.append)

    # Hold the store busy with a first request while the rest queue up behind it.
    with store._lock:
        directory.tell(STORE, append("a", 1, "first"))
        for rid, (sid, next_call_id) in enumerate(
            [("a", 1), ("b", 1), ("ghost", 1), ("c", 5), ("c", 2), ("b", 1)], start=2
        ):
            directory.tell(STORE, append(sid, rid, f"m{rid}", next_call_id))
        directory.tell(
            STORE,
            CreateChild("sub-a-1", "a", BASELINE, 1, True, user("task"), "probe", request_id=8),
        )
        directory.tell(STORE, CompactHistory("b", 9, user("summary"), reply_to="probe"))
    answers = {m.request_id: m for m in probe.expect_all(lambda m: True, 9)}

    assert isinstance(answers[8], SessionLoaded) and answers[8].created
    assert answers[1] == Appended("a", 1)
    assert answers[9] == Appended("b", 9)
    # The two that were wrong fail alone; everything else in their transaction is stored.
    assert isinstance(answers[4], StoreFailed) and "ghost" in answers[4].detail
    assert isinstance(answers[6], StoreFailed) and "below the stored 5" in answers[6].detail
    ok = [rid for rid, m in answers.items() if isinstance(m, Appended)]
    assert sorted(ok) == [1, 2, 3, 5, 7, 9]
    commits = [s for s in statements if s == "COMMIT"]
    # Nine requests, at most two transactions: the first may have been taken alone, before the
    # others arrived; every one behind it went into one.
    assert len(commits) in (1, 2), statements
    with SessionStore(db) as reader:
        assert [m.content for m in reader.open("a").transcript] == ["first", "m2"]
        assert reader.open("b").transcript == (user("summary"),)
        assert reader.open("c").next_call_id == 5
        assert reader.open("sub-a-1").untrusted


def test_the_inbox_hands_over_the_requests_at_its_head_and_keeps_the_rest_in_order() -> None:
    inbox = _Inbox()
    first, second, later = append("a", 1, "1"), append("a", 2, "2"), append("a", 3, "3")
    ask = Envelope(append("a", 9, "asked"), reply_to=ThreadingFuture())
    for envelope in (Envelope(first), Envelope(second), ask, Envelope(later)):
        inbox.put(envelope)
    # The plain requests at the head go together; the ask ends the run and stays first.
    assert inbox.take_requests(10) == [first, second]
    assert inbox.take_requests(10) == []
    assert not inbox.empty()
    assert inbox.get() is ask
    assert inbox.take_requests(1) == [later]
    assert inbox.empty()


def test_with_group_commit_off_each_request_is_its_own_transaction(
    db: Path, directory: Directory, probe: Probe, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(StoreActor, "max_batch", 1)
    ref = StoreActor.start(db, directory)
    try:
        directory.register(STORE, ref)
        directory.tell(STORE, OpenSession("a", BASELINE, 0, reply_to="probe"))
        probe.expect(SessionLoaded)
        store: SessionStore = ref.proxy().store.get(timeout=5)
        statements: list[str] = []
        assert store._conn is not None
        store._conn.set_trace_callback(statements.append)
        with store._lock:
            for rid in range(1, 6):
                directory.tell(STORE, append("a", rid, f"m{rid}"))
        assert [m.request_id for m in probe.expect_all(Appended, 5)] == [1, 2, 3, 4, 5]
        assert statements.count("COMMIT") == 5
    finally:
        ref.stop()


def test_a_batch_whose_transaction_fails_answers_each_request_alone(store: Any) -> None:
    store.create("a", BASELINE, 0)

    def ok(cur: Any) -> str:
        store.append_in(cur, "a", [user("kept")], turns=1, next_call_id=1, untrusted=False)
        return "ok"

    def aborts(cur: Any) -> str:
        # A statement that ends the whole transaction: its savepoint is gone with it.
        cur.execute("ROLLBACK")
        raise RuntimeError("aborted")

    results = store.run_batch([("a", ok), ("a", aborts), ("a", ok)])
    assert results[0] == "ok" and results[2] == "ok"
    assert isinstance(results[1], RuntimeError)
    # Run again one by one, the good jobs stored their message once each.
    assert [m.content for m in store.open("a").transcript] == ["kept", "kept"]


def test_a_batch_that_cannot_begin_answers_every_job_naming_its_session(
    open_store: Opener,
) -> None:
    store = open_store()
    store.close()
    results = store.run_batch([("a", lambda cur: 1), ("b", lambda cur: 2)])
    assert [(type(r), r.session) for r in results] == [(StoreError, "a"), (StoreError, "b")]
    assert all("cannot write: the store is closed" in str(r) for r in results)


# --- The store file removed or replaced ---------------------------------------------------------


@pytest.mark.parametrize("how", ["removed", "replaced"])
def test_a_store_file_removed_or_replaced_is_noticed_and_never_written(
    actor: pykka.ActorRef[StoreActor], directory: Directory, probe: Probe, db: Path, how: str
) -> None:
    directory.tell(STORE, OpenSession("s", BASELINE, 0, reply_to="probe"))
    probe.expect(SessionLoaded)
    if how == "removed":
        db.unlink()
    else:
        other = db.with_name("other.db")
        with SessionStore(other) as fresh:
            fresh.create("s", OTHER, 0)
        other.replace(db)
    directory.tell(STORE, append("s", 1, "lost?"))
    directory.tell(STORE, CompactHistory("s", 2, user("x"), reply_to="probe"))
    for rid in (1, 2):
        failed = probe.expect(lambda m, rid=rid: m.request_id == rid)
        assert isinstance(failed, StoreFailed)
        assert f"the store file {db} was removed or replaced" in failed.detail
    if how == "replaced":
        with SessionStore(db) as reader:  # the file now at the path was not written to
            assert reader.open("s").transcript == ()


def test_a_session_store_refuses_writes_after_its_file_is_removed(db: Path) -> None:
    with SessionStore(db) as store:
        store.create("s", BASELINE, 0)
        db.unlink()
        with pytest.raises(StoreFileReplaced, match="removed or replaced"):
            store.append("s", [user("x")], turns=1, next_call_id=1, untrusted=False)


@pytest.mark.skipif("postgresql" not in BACKENDS, reason="PostgreSQL runs in tox -e cluster")
def test_a_version_1_postgresql_store_gains_the_agent_column(
    request: pytest.FixtureRequest,
) -> None:
    import psycopg

    from actors.stores.postgres import PG_SCHEMA_VERSION, PgSessionStore

    url = request.getfixturevalue("pg_database")()
    with PgSessionStore(url) as store:  # today's schema, then made into version 1's
        store.create("old", BASELINE, 0)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE loopd_sessions DROP COLUMN agent")
        conn.execute("UPDATE loopd_meta SET value = '1' WHERE key = 'schema'")
    with PgSessionStore(url) as store:
        assert store.open("old").agent == "default"
        store.create("new", BASELINE, 0, agent="planner")
        assert [(i.id, i.agent) for i in store.list_sessions()] == [
            ("new", "planner"),
            ("old", "default"),
        ]
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT value FROM loopd_meta WHERE key = 'schema'").fetchone()
    assert row == (str(PG_SCHEMA_VERSION),) == ("5",)


# --- Memory and scheduler state in a PostgreSQL that restarts or goes away --------------------

WAIT = 30.0


def _spawning(request: ModelRequest) -> Answer:
    """Sessions named ``parent*`` call a child; every other session answers at once."""
    last = request.messages[-1]
    if request.session.startswith("parent") and last.role == "user":
        return call("subagent", task="look")
    if last.role == "tool":
        return reply(last.content or "")
    return reply("ok")


def test_memory_in_a_store_out_of_reach_fails_a_new_session_with_store_error(
    loopd_runtime: Callable[..., Any],
) -> None:
    pytest.importorskip("psycopg")
    from actors.stores.postgres import PgMemory

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    memory = PgMemory(f"postgresql://loopd@127.0.0.1:{port}/none", connect_timeout_s=1)
    rt = loopd_runtime(_spawning, memory=memory)
    failed = rt.run_turn("new", "hello", timeout=WAIT)
    # The memory's store is out of reach: a store_error, as for the session store itself (it
    # was a spawn_error, the answer for a memory file that cannot be read).
    assert isinstance(failed, TurnFailed) and failed.reason is FailReason.STORE_ERROR
    assert "StoreError: cannot open the store: cannot reach PostgreSQL" in failed.detail
    memory.close()


@pytest.mark.skipif("postgresql" not in BACKENDS, reason="PostgreSQL runs in tox -e cluster")
def test_memory_and_scheduler_state_reconnect_after_a_postgresql_restart(
    loopd_runtime: Callable[..., Any],
) -> None:
    from actors.stores.postgres import PgMemory, PgSchedulerState
    from actors.testing.postgres import PostgresServer

    at = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    with PostgresServer() as pg:  # its own server: this test restarts it
        url = pg.create_database("loopd_restart")
        memory = PgMemory(url, connect_timeout_s=2)
        memory.remember("likes tea")
        schedule = PgSchedulerState(url, connect_timeout_s=2)
        rt = loopd_runtime(_spawning, memory=memory)
        seen: list[SubagentFinished] = []
        rt.subscribe(lambda e: seen.append(e) if isinstance(e, SubagentFinished) else None)
        try:
            assert rt.run_turn("a", "hello", timeout=WAIT) == TurnCompleted("a", "ok")
            schedule.save({"job": at}, {})
            pg.stop()
            pg.start()
            # The memory's connection ended with the server; the first new session after the
            # restart connects again (it failed with "cannot read memory: AdminShutdown").
            assert rt.run_turn("b", "hello", timeout=WAIT) == TurnCompleted("b", "ok")
            done = rt.run_turn("parent", "go", timeout=WAIT)
            assert done == TurnCompleted("parent", "sub-parent-1 completed\nok")
            assert schedule.load() == ({"job": at}, {})
            schedule.save({"job": at}, {"other": at})
            pg.stop()
            # Down: a new session, and a child, fail with store_error (their memory is out of
            # reach), and so does the scheduler's state.
            down = rt.run_turn("c", "hello", timeout=WAIT)
            assert isinstance(down, TurnFailed) and down.reason is FailReason.STORE_ERROR
            assert rt.run_turn("parent", "go", timeout=WAIT) == TurnCompleted(
                "parent", "sub-parent-2 failed"
            )
            assert seen[-1].child == "sub-parent-2"
            assert seen[-1].reason is FailReason.STORE_ERROR
            with pytest.raises(StoreError, match="cannot reach PostgreSQL"):
                schedule.load()
            pg.start()
            assert rt.run_turn("c", "hello", timeout=WAIT) == TurnCompleted("c", "ok")
            assert schedule.load() == ({"job": at}, {"other": at})
        finally:
            rt.stop()
            memory.close()
    for request in rt.model.requests:
        assert "likes tea" in (request.messages[0].content or "")


# --- remote children's rows (A2A calling out) ---------------------------------------------------


def test_remote_task_rows_are_stored_replaced_and_dropped(store: Any) -> None:
    from messages.remote import RemoteTaskRow

    row = RemoteTaskRow("sub-mm-1", "mm", "http://h/a", "ctx")
    known = RemoteTaskRow("sub-mm-1", "mm", "http://h/a", "ctx", "task-9")
    other = RemoteTaskRow("sub-nn-2", "nn", "http://h/b", "ctx-2", "task-1")
    store.run_batch([("sub-mm-1", lambda cur: store.save_remote_in(cur, row))])
    assert store.remote_tasks() == (row,)
    store.run_batch(
        [
            ("sub-mm-1", lambda cur: store.save_remote_in(cur, known)),
            ("sub-nn-2", lambda cur: store.save_remote_in(cur, other)),
        ]
    )
    assert store.remote_tasks() == (known, other)
    store.run_batch([("sub-mm-1", lambda cur: store.drop_remote_in(cur, "sub-mm-1"))])
    assert store.remote_tasks() == (other,)
