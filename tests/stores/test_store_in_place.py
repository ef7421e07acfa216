"""A store request run in place: on a lent teller's thread while the store is idle, never ahead
of one sent before it, never before the store is open, and answered whatever goes wrong."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pykka
import pytest
from pykka._envelope import Envelope

from actors.dispatcher.directory import STORE, Directory
from actors.services.store import StoreActor, _Inbox
from actors.stores.base import StoreBackend
from actors.stores.sqlite import SessionStore
from actors.testing import Probe
from messages import Appended, AppendMessages, Baseline, ChatMessage, OpenSession, StoreFailed
from messages.approvals import ListApprovals
from messages.runtime import ReleaseSession

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


class Watched(queue.SimpleQueue[Envelope[Any]]):
    """The store's queue, watched: ``waiting`` is set each time the store's thread comes to
    wait for its next envelope (so holding nothing), and while ``gate`` is clear it waits
    there before taking anything, so what is told meanwhile stays queued."""

    def __init__(self) -> None:
        self.waiting = threading.Event()
        self.gate = threading.Event()
        self.gate.set()

    def get(self, block: bool = True, timeout: float | None = None) -> Envelope[Any]:
        if block:
            self.waiting.set()
            assert self.gate.wait(10)
        return super().get(block, timeout)


def start_store(
    path: Path | Any, directory: Directory, lent: Lent
) -> tuple[pykka.ActorRef[StoreActor], Watched]:
    """A store actor on ``path`` (or an opener) whose queue is watched, registered at STORE,
    that runs in place what a thread ``lent`` tells it; once it waits for its first envelope."""
    watched = Watched()

    class Store(StoreActor):
        @staticmethod
        def _create_actor_inbox() -> _Inbox:
            inbox = _Inbox()
            inbox._queue = watched
            return inbox

    ref = cast("pykka.ActorRef[StoreActor]", Store.start(path, directory, run_here=lambda: lent.on))
    directory.register(STORE, ref)
    assert watched.waiting.wait(10)
    return ref, watched


def until_idle(watched: Watched, ask: Any) -> Any:
    """``ask()``, then wait until the store's thread is back waiting for work: idle."""
    watched.waiting.clear()
    answer = ask()
    assert watched.waiting.wait(10)
    return answer


@pytest.fixture
def store_actor(
    db_path: Path, directory: Directory, lent: Lent
) -> Iterator[tuple[pykka.ActorRef[StoreActor], Watched]]:
    ref, watched = start_store(db_path, directory, lent)
    yield ref, watched
    watched.gate.set()
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
    store_actor: tuple[pykka.ActorRef[StoreActor], Watched],
    directory: Directory,
    probe: Probe,
    lent: Lent,
    db_path: Path,
) -> None:
    actor, watched = store_actor
    directory.tell(STORE, OpenSession("s", BASELINE, 0, reply_to="probe"))
    probe.next()
    commits = until_idle(watched, lambda: commit_threads(actor))
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

    ref, _ = start_store(open_broken, directory, lent)
    try:
        lent.on = True
        directory.tell(STORE, OpenSession("s", BASELINE, 0, reply_to="probe"))  # in place
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


def test_a_message_queued_while_a_request_runs_in_place_still_reaches_the_stores_thread(
    db_path: Path, directory: Directory, probe: Probe, lent: Lent
) -> None:
    # The store's thread sleeps before it takes anything; a teller runs a request in place,
    # and meanwhile another thread tells the store a message that is not a request (a
    # session's release). The teller must leave it in the queue: taken there, it would wait
    # for a store thread that sleeps in the queue already.
    released: list[str] = []

    class Recording(SessionStore):
        def release(self, id: str) -> None:
            released.append(id)
            super().release(id)

        # Answered on the store's thread: what it had released.
        def approvals(self, *, ours: bool = False) -> Any:
            return list(released)

    def open_recording() -> StoreBackend:
        return Recording(db_path)

    ref, watched = start_store(open_recording, directory, lent)
    try:
        directory.tell(STORE, OpenSession("s", BASELINE, 0, reply_to="probe"))
        probe.next()
        watched.gate.clear()
        # Taken and handled; then the store's thread waits at the gate.
        until_idle(watched, lambda: directory.tell(STORE, ReleaseSession("warm")))
        inbox = ref.actor_inbox
        assert isinstance(inbox, _Inbox) and inbox.run_in_place is not None
        run = inbox.run_in_place

        def run_with_a_release_told_meanwhile(message: Any) -> None:
            other = threading.Thread(target=directory.tell, args=(STORE, ReleaseSession("s")))
            other.start()
            other.join(10)
            run(message)

        inbox.run_in_place = run_with_a_release_told_meanwhile
        lent.on = True
        directory.tell(STORE, append("s", 1, "in place"))
        lent.on = False
        assert probe.next() == Appended("s", 1)
        watched.gate.set()
        # An ask told after the release is handled after it, on the store's thread: what had
        # been released by then, it answers.
        assert ref.ask(ListApprovals(), timeout=10) == ["warm", "s"]
    finally:
        watched.gate.set()
        ref.stop()
