"""The session store: real SQLite files, reopened like a process restart, and its actor."""

from __future__ import annotations

import copy
import pickle
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pykka
import pytest

from actors.directory import STORE, Directory
from actors.store import (
    SCHEMA_VERSION,
    SessionExists,
    SessionNotFound,
    SessionStore,
    StoreActor,
    StoreError,
)
from actors.testing import Probe
from messages import (
    Appended,
    AppendMessages,
    Baseline,
    ChatMessage,
    CompactHistory,
    OpenSession,
    SessionLoaded,
    StoreFailed,
    ToolCall,
    ToolSpec,
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


@pytest.fixture
def store(db: Path) -> Iterator[SessionStore]:
    with SessionStore(db) as s:
        yield s


# --- SessionStore ------------------------------------------------------------------------------


def test_create_then_open_round_trips_the_baseline_byte_for_byte(db: Path) -> None:
    with SessionStore(db) as store:
        created = store.create("mm-thread", BASELINE, 3)
    assert created.transcript == ()
    assert (created.turns, created.next_call_id, created.untrusted) == (0, 1, False)

    with SessionStore(db) as store:
        opened = store.open("mm-thread")
    assert opened == created
    assert opened.slot == 3
    assert msgspec.json.encode(opened.baseline) == msgspec.json.encode(BASELINE)
    with raw_db(db) as raw:
        (stored,) = raw.execute(
            "SELECT b.body FROM sessions s JOIN baselines b ON b.hash = s.baseline"
        ).fetchone()
    assert stored == msgspec.json.encode(BASELINE)


def test_store_file_is_configured_for_durability(store: SessionStore, db: Path) -> None:
    assert db.is_file()
    with raw_db(db) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert raw.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (2,)


def test_create_of_a_known_id_raises_session_exists_and_changes_nothing(
    store: SessionStore,
) -> None:
    store.create("a", BASELINE, 0)
    with pytest.raises(SessionExists, match="'a'") as info:
        store.create("a", OTHER, 5)
    assert isinstance(info.value, StoreError)
    assert info.value.session == "a"
    assert store.open("a").baseline == BASELINE
    assert store.open("a").slot == 0


def test_create_refuses_an_invalid_id(store: SessionStore) -> None:
    with pytest.raises(ValueError, match="invalid session id"):
        store.create("a" * 65, BASELINE, 0)
    with pytest.raises(ValueError, match="invalid session id"):
        store.open_or_create("../etc", BASELINE, 0)
    assert store.list_sessions() == []


def test_unknown_ids_raise_session_not_found(store: SessionStore) -> None:
    with pytest.raises(SessionNotFound, match="'ghost'"):
        store.open("ghost")
    with pytest.raises(SessionNotFound, match="'ghost'"):
        store.append("ghost", [user("hi")], turns=1, next_call_id=1, untrusted=False)
    with pytest.raises(SessionNotFound, match="'ghost'"):
        store.compact("ghost", user("summary"))
    with pytest.raises(SessionNotFound, match="'ghost'"):
        store.history("ghost")
    assert store.list_sessions() == []


def test_open_or_create_keeps_the_stored_baseline_and_slot(store: SessionStore) -> None:
    record, created = store.open_or_create("s", BASELINE, 1)
    assert created
    assert (record.baseline, record.slot) == (BASELINE, 1)
    store.append("s", [user("hello")], turns=1, next_call_id=1, untrusted=False)

    again, created = store.open_or_create("s", OTHER, 7)
    assert not created
    assert (again.baseline, again.slot) == (BASELINE, 1)
    assert again.transcript == (user("hello"),)


def test_appends_keep_their_order_across_a_restart(db: Path) -> None:
    first, second = conversation(), [user("and now?"), ChatMessage(role="assistant", content="ok")]
    with SessionStore(db) as store:
        store.create("s", BASELINE, 0)
        store.append("s", first[:1], turns=0, next_call_id=1, untrusted=False)
        store.append("s", first[1:], turns=1, next_call_id=2, untrusted=False)
    with SessionStore(db) as store:  # a new process
        store.append("s", second, turns=2, next_call_id=2, untrusted=False)
        store.append("s", [], turns=2, next_call_id=2, untrusted=False)  # counters only
    with SessionStore(db) as store:
        record = store.open("s")
        history = store.history("s")
    assert record.transcript == (*first, *second)
    assert (record.turns, record.next_call_id) == (2, 2)
    assert [h.seq for h in history] == [1, 2, 3, 4, 5, 6]
    assert not any(h.compacted for h in history)
    assert all(h.at.endswith("Z") for h in history)


def test_next_call_id_never_goes_down_and_persists(db: Path) -> None:
    with SessionStore(db) as store:
        store.create("s", BASELINE, 0)
        store.append("s", [user("one")], turns=1, next_call_id=5, untrusted=False)
        with pytest.raises(StoreError, match=r"'s'.*next_call_id 4.*5"):
            store.append("s", [user("lost")], turns=2, next_call_id=4, untrusted=True)
        # Nothing of the refused append was written, not even its untrusted flag.
        record = store.open("s")
        assert record.transcript == (user("one"),)
        assert (record.turns, record.next_call_id, record.untrusted) == (1, 5, False)
    with SessionStore(db) as store:
        assert store.open("s").next_call_id == 5
        with pytest.raises(StoreError):
            store.append("s", [], turns=1, next_call_id=1, untrusted=False)
        store.append("s", [], turns=1, next_call_id=5, untrusted=False)  # equal is fine
        store.append("s", [], turns=1, next_call_id=6, untrusted=False)
    with SessionStore(db) as store:
        assert store.open("s").next_call_id == 6


def test_untrusted_is_sticky(db: Path) -> None:
    with SessionStore(db) as store:
        store.create("s", BASELINE, 0)
        store.append("s", [user("a")], turns=1, next_call_id=1, untrusted=True)
        store.append("s", [user("b")], turns=2, next_call_id=1, untrusted=False)
        assert store.open("s").untrusted
        store.compact("s", user("summary"))
    with SessionStore(db) as store:
        assert store.open("s").untrusted
        assert store.list_sessions()[0].untrusted


def test_compact_keeps_old_rows_and_leaves_only_the_summary_live(db: Path) -> None:
    summary = ChatMessage(role="user", content="Summary: the user asked the time; it was late.")
    with SessionStore(db) as store:
        store.create("s", BASELINE, 0)
        store.append("s", conversation(), turns=1, next_call_id=2, untrusted=False)
        store.compact("s", summary)
        assert store.open("s").transcript == (summary,)
        store.append("s", [user("next")], turns=2, next_call_id=2, untrusted=False)
    with SessionStore(db) as store:
        record = store.open("s")
        history = store.history("s")
        info = store.list_sessions()[0]
    assert record.transcript == (summary, user("next"))
    assert record.baseline == BASELINE
    assert [h.message for h in history] == [*conversation(), summary, user("next")]
    assert [h.compacted for h in history] == [True] * 4 + [False, False]
    assert info.messages == 6

    with SessionStore(db) as store:  # a second compaction compacts the first summary too
        store.compact("s", user("shorter"))
        assert store.open("s").transcript == (user("shorter"),)
        assert [h.compacted for h in store.history("s")] == [True] * 6 + [False]


def test_children_lists_direct_children_only(store: SessionStore) -> None:
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


def test_list_sessions_is_sorted_and_counts_messages(store: SessionStore) -> None:
    store.create("b", BASELINE, 1)
    store.create("a", BASELINE, 0)
    store.append("b", conversation(), turns=1, next_call_id=2, untrusted=True)
    infos = store.list_sessions()
    assert [i.id for i in infos] == ["a", "b"]
    a, b = infos
    assert (a.slot, a.turns, a.untrusted, a.messages) == (0, 0, False, 0)
    assert (b.slot, b.turns, b.untrusted, b.messages) == (1, 1, True, 4)
    assert b.created_at <= b.updated_at


def test_a_corrupt_row_raises_store_error_naming_its_seq_and_loses_nothing(db: Path) -> None:
    with SessionStore(db) as store:
        store.create("s", BASELINE, 0)
        store.create("t", BASELINE, 0)
        store.append("s", conversation(), turns=1, next_call_id=2, untrusted=False)
        store.append("t", [user("fine")], turns=1, next_call_id=1, untrusted=False)
    with raw_db(db) as raw:
        raw.execute("UPDATE messages SET body = ? WHERE session = 's' AND seq = 3", (b"{not json",))

    with SessionStore(db) as store:
        with pytest.raises(StoreError, match=r"'s'.*seq 3") as info:
            store.open("s")
        assert info.value.session == "s"
        with pytest.raises(StoreError, match=r"seq 3"):
            store.history("s")
        # Other sessions read as before, and the store neither dropped nor rewrote a row.
        assert store.open("t").transcript == (user("fine"),)
        assert [i.messages for i in store.list_sessions()] == [4, 1]
    with raw_db(db) as raw:
        rows = raw.execute("SELECT seq, body FROM messages WHERE session = 's'").fetchall()
    assert [seq for seq, _ in rows] == [1, 2, 3, 4]
    assert rows[2][1] == b"{not json"


def test_a_well_formed_but_wrong_row_is_also_an_error(db: Path) -> None:
    with SessionStore(db) as store:
        store.create("s", BASELINE, 0)
        store.append("s", [user("a")], turns=1, next_call_id=1, untrusted=False)
    with raw_db(db) as raw:
        raw.execute("UPDATE messages SET body = ?", (b'{"type": "ChatMessage", "role": "robot"}',))
        raw.execute("UPDATE sessions SET baseline = ?", (b"[]",))
    with SessionStore(db) as store:
        with pytest.raises(StoreError, match="baseline"):
            store.open("s")
        with pytest.raises(StoreError, match="seq 1"):
            store.history("s")


def test_session_ids_are_only_sql_values_and_files_stay_under_the_path(
    tmp_path: Path, db: Path
) -> None:
    hostile = ["x'); DROP TABLE sessions; --", "%", "_", "../../escape", "/tmp/x"]
    with SessionStore(db) as store:
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


def test_closed_store_raises_store_error(db: Path) -> None:
    store = SessionStore(db)
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
def directory() -> Directory:
    return Directory()


@pytest.fixture
def probe(directory: Directory) -> Iterator[Probe]:
    # The kit's probe, at the fixed address these tests reply to.
    p = Probe.start(name="probe")
    directory.register("probe", p)
    yield p
    p.stop()


@pytest.fixture
def actor(db: Path, directory: Directory) -> Iterator[pykka.ActorRef[StoreActor]]:
    ref = StoreActor.start(db, directory)
    directory.register(STORE, ref)
    yield ref
    ref.stop()


def test_store_actor_answers_each_request_at_its_reply_address(
    actor: pykka.ActorRef[StoreActor], directory: Directory, probe: Probe, db: Path
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
    with SessionStore(db) as reader:
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


def test_store_actor_answers_failures_and_keeps_serving(
    actor: pykka.ActorRef[StoreActor], directory: Directory, probe: Probe
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
    assert actor.is_alive()


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


def test_store_actor_closes_the_store_consistently_on_stop(db: Path, directory: Directory) -> None:
    probe = Probe()
    directory.register("probe", probe)
    ref = StoreActor.start(db, directory)
    ref.tell(OpenSession("s", BASELINE, 0, reply_to="probe"))
    ref.tell(
        AppendMessages(
            "s", 1, (user("kept"),), turns=1, next_call_id=1, untrusted=False, reply_to="probe"
        )
    )
    ref.stop()  # pykka handles queued messages before the stop
    assert isinstance(probe.next(), SessionLoaded)
    assert probe.next() == Appended("s", 1)
    with SessionStore(db) as store:
        assert store.open("s").transcript == (user("kept"),)
