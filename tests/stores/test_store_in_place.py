"""A store request run in place: on a lent teller's thread while the store is idle, never ahead
of one sent before it, never before the store is open, and answered whatever goes wrong."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest
from pykka._envelope import Envelope

from actors.dispatcher.directory import STORE, Directory
from actors.services.store import StoreActor, _Inbox
from actors.stores.base import StoreBackend
from actors.stores.sqlite import SessionStore
from actors.testing import Probe
from messages import Appended, AppendMessages, Baseline, ChatMessage, OpenSession, StoreFailed

BASELINE = Baseline(system="You are careful.", tools=())


def append(session: str, rid: int, text: str) -> AppendMessages:
    return AppendMessages(
        session,
        rid,
        (ChatMessage(role="user", content=text),),
        turns=1,
        next_call_id=1,
        untrusted=False,
        reply_to="probe",
    )


class Lent(threading.local):
    """Per thread: whether a test has lent it (the dispatcher's ``lent_here`` stand-in)."""

    on = False


@pytest.fixture
def lent() -> Lent:
    return Lent()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "loopd.db"


@pytest.fixture
def actor(db_path: Path, directory: Directory, lent: Lent) -> Iterator[pykka.ActorRef[StoreActor]]:
    ref = StoreActor.start(db_path, directory, run_here=lambda: lent.on)
    directory.register(STORE, ref)
    yield ref
    ref.stop()


def commit_threads(actor: pykka.ActorRef[StoreActor]) -> list[str]:
    """The names of the threads that run each COMMIT of ``actor``'s connection, from now on."""
    store: SessionStore = actor.proxy().store.get(timeout=5)
    assert store._conn is not None
    names: list[str] = []
    store._conn.set_trace_callback(
        lambda sql: names.append(threading.current_thread().name) if sql == "COMMIT" else None
    )
    return names


def test_a_request_told_on_a_lent_thread_to_an_idle_store_is_durable_when_tell_returns(
    actor: pykka.ActorRef[StoreActor], directory: Directory, probe: Probe, lent: Lent, db_path: Path
) -> None:
    directory.tell(STORE, OpenSession("s", BASELINE, 0, reply_to="probe"))
    probe.next()
    commits = commit_threads(actor)
    lent.on = True
    try:
        directory.tell(STORE, append("s", 1, "written here"))
        # Committed before tell returned: another connection (another process) sees it now.
        with SessionStore(db_path) as reader:
            assert [m.content for m in reader.open("s").transcript] == ["written here"]
        assert commits == [threading.current_thread().name]
    finally:
        lent.on = False
    assert probe.next() == Appended("s", 1)

    # A thread that is not lent only queues: the store's own thread writes it.
    directory.tell(STORE, append("s", 2, "written there"))
    assert probe.next() == Appended("s", 2)
    assert len(commits) == 2 and commits[1] != threading.current_thread().name


def test_a_lent_teller_never_waits_for_a_store_that_is_still_opening(
    tmp_path: Path, directory: Directory, probe: Probe, lent: Lent
) -> None:
    opening = threading.Event()

    def slow_open() -> StoreBackend:
        assert opening.wait(10)
        return SessionStore(tmp_path / "loopd.db")

    ref = StoreActor.start(slow_open, directory, run_here=lambda: lent.on)
    try:
        directory.register(STORE, ref)
        lent.on = True
        directory.tell(STORE, OpenSession("s", BASELINE, 0, reply_to="probe"))  # returns at once
        lent.on = False
        probe.expect_none(within=0.1)
        opening.set()
        assert probe.next().record.id == "s"
    finally:
        opening.set()
        ref.stop()


def test_a_batch_that_raises_below_the_store_is_answered_and_the_store_serves_on(
    tmp_path: Path, directory: Directory, probe: Probe, lent: Lent
) -> None:
    class Broken(SessionStore):
        fail = True

        def run_batch(self, jobs: Any) -> list[Any]:
            if Broken.fail:
                Broken.fail = False
                raise RuntimeError("a bug under the store")
            return super().run_batch(jobs)

    def open_broken() -> StoreBackend:
        return Broken(tmp_path / "loopd.db")

    ref = StoreActor.start(open_broken, directory, run_here=lambda: lent.on)
    try:
        directory.register(STORE, ref)
        lent.on = True
        directory.tell(STORE, OpenSession("s", BASELINE, 0, reply_to="probe"))
        lent.on = False
        failed = probe.next()
        assert isinstance(failed, StoreFailed) and "a bug under the store" in failed.detail
        directory.tell(STORE, OpenSession("s", BASELINE, 0, reply_to="probe"))
        assert probe.next().record.id == "s"
    finally:
        ref.stop()


# --- the inbox's rule, with a thread standing in for the store's --------------------------------


class Gate(queue.SimpleQueue[Envelope[Any]]):
    """A queue whose ``get`` stops after taking an envelope until ``go`` is set: the moment the
    store's thread has taken a request but not yet begun to run it."""

    def __init__(self) -> None:
        self.taken = threading.Event()
        self.go = threading.Event()

    def get(self, block: bool = True, timeout: float | None = None) -> Envelope[Any]:
        envelope = super().get(block, timeout)
        self.taken.set()
        assert self.go.wait(10)
        return envelope


def test_a_request_taken_but_not_yet_run_keeps_a_later_one_from_running_in_place() -> None:
    inbox = _Inbox()
    gate = Gate()
    inbox._queue = gate
    lent = Lent()
    in_place: list[Any] = []
    inbox.run_here = lambda: lent.on
    inbox.run_in_place = in_place.append
    handled: list[Any] = []
    done = threading.Event()

    def store_thread() -> None:
        while True:
            message = inbox.get().message
            if message is None:
                done.set()
                return
            handled.append(message)

    first, second, third = append("a", 1, "1"), append("a", 2, "2"), append("a", 3, "3")
    inbox.put(Envelope(first))  # before the store's thread runs: queued
    thread = threading.Thread(target=store_thread, daemon=True)
    thread.start()
    try:
        assert gate.taken.wait(10)  # the store's thread has taken it, and stops there
        lent.on = True
        inbox.put(Envelope(second))  # the lock is free, but the first is not run yet
        assert in_place == []
        gate.go.set()
        inbox.put(Envelope(None))
        assert done.wait(10)
        assert handled == [first, second]
        # Now idle (the thread has ended, holding the lock it took for the last message, as
        # a stopped store does): nothing runs in place after the end either.
        inbox.put(Envelope(third))
        assert in_place == []
    finally:
        gate.go.set()
        thread.join(10)


def test_an_idle_store_runs_a_lent_tellers_request_in_place_and_only_then() -> None:
    inbox = _Inbox()
    lent = Lent()
    in_place: list[Any] = []
    inbox.run_here = lambda: lent.on
    inbox.run_in_place = in_place.append
    waiting = threading.Event()
    taken: queue.SimpleQueue[Any] = queue.SimpleQueue()

    class Watch(queue.SimpleQueue[Envelope[Any]]):
        def get(self, block: bool = True, timeout: float | None = None) -> Envelope[Any]:
            waiting.set()
            return super().get(block, timeout)

    inbox._queue = Watch()

    def store_thread() -> None:
        while (message := inbox.get().message) is not None:
            taken.put(message)

    thread = threading.Thread(target=store_thread, daemon=True)
    thread.start()
    try:
        assert waiting.wait(10)  # the store's thread waits for work, holding nothing
        first, asked = append("a", 1, "1"), append("a", 2, "asked")
        lent.on = True
        inbox.put(Envelope(first))
        assert in_place == [first]
        # An ask, or a thread that is not lent, always goes to the store's own thread.
        future: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
        inbox.put(Envelope(asked, reply_to=future))
        assert taken.get(timeout=10) is asked
        lent.on = False
        later = append("a", 3, "3")
        inbox.put(Envelope(later))
        assert taken.get(timeout=10) is later
        assert in_place == [first]
    finally:
        inbox.put(Envelope(None))
        thread.join(10)
