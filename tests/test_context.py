"""The Context alone, driven message by message: the test plays the store with a probe."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from actors import AgentConfig, Config, Directory
from actors.core.dispatch import Registry
from actors.core.limits import Limits
from actors.dispatcher import Dispatcher
from actors.dispatcher.directory import STORE
from actors.sessions.context import ContextActor
from actors.sessions.session import SessionEnv
from actors.stores.memory import FileMemory
from actors.testing import Probe
from messages import (
    CancelTurn,
    ContextStatus,
    FailReason,
    Inspect,
    OpenSession,
    StartTurn,
    StoreFailed,
    TurnFailed,
)

NOW = datetime(2026, 11, 30, 7, 0, tzinfo=UTC)


@pytest.fixture
def harness(tmp_path):
    yield from context_harness(tmp_path, Config(home=str(tmp_path)))


def context_harness(tmp_path, config):
    directory = Directory()
    store = Probe.start(name="fake-store")
    directory.register(STORE, store)
    dispatcher = Dispatcher(2, name="test-context")
    limits = Limits(4, 100, 100, 10_000)
    env = SessionEnv(directory, Registry(), limits, lambda: NOW, itertools.count(1), dispatcher)
    memory = FileMemory(tmp_path / "MEMORY.md")
    memory.path.write_text("a fact\n")  # not read yet: a new session's open must read it
    context = ContextActor.start(config, directory, Registry(), memory, env, lambda: NOW)
    yield directory, store, context
    context.stop()
    store.stop()
    assert dispatcher.shutdown(10)


def test_a_late_store_answer_does_not_touch_a_newer_turn(harness) -> None:
    directory, store, context = harness
    first, second = Probe.start(directory), Probe.start(directory)
    context.tell(StartTurn("s", "one", reply_to=first.address))
    opening = store.expect(OpenSession)
    assert opening.baseline is None  # a stored session needs no baseline, so no memory read

    context.tell(CancelTurn("s"))  # cancelled while the store is still opening it
    assert first.expect(TurnFailed).reason is FailReason.CANCELLED
    context.tell(StartTurn("s", "two", reply_to=second.address))
    reopening = store.expect(OpenSession)
    assert reopening.request_id != opening.request_id

    # The first open's answer arrives late: it belongs to a turn that is gone.
    context.tell(StoreFailed("s", "late news", request_id=opening.request_id))
    second.expect_none(within=0.2)
    assert context.ask(Inspect(), timeout=5) == ContextStatus(held=("s",), live=())

    context.tell(StoreFailed("s", "disk full", request_id=reopening.request_id))
    failed = second.expect(TurnFailed)
    assert (failed.reason, failed.detail) == (FailReason.STORE_ERROR, "disk full")
    assert context.ask(Inspect(), timeout=5).held == ()
    first.stop()
    second.stop()


def test_a_new_session_gets_its_baseline_only_after_the_store_says_it_is_new(harness) -> None:
    directory, store, context = harness
    waiter = Probe.start(directory)
    context.tell(StartTurn("fresh", "hi", reply_to=waiter.address))
    opening = store.expect(OpenSession)
    context.tell(StoreFailed("fresh", "is not stored", request_id=opening.request_id, missing=True))
    creating = store.expect(OpenSession)
    assert creating.baseline is not None and creating.slot == 0
    assert creating.request_id != opening.request_id
    waiter.expect_none(within=0.1)
    waiter.stop()


def test_a_turn_sends_a_baseline_known_without_a_read_with_its_first_store_request(
    harness, tmp_path
) -> None:
    directory, store, context = harness
    memory = tmp_path / "MEMORY.md"
    waiter = Probe.start(directory)
    # The file not read yet: opened first, memory read only once the store says "new".
    context.tell(StartTurn("a", "hi", reply_to=waiter.address))
    opening = store.expect(OpenSession)
    assert opening.baseline is None
    context.tell(StoreFailed("a", "is not stored", request_id=opening.request_id, missing=True))
    creating = store.expect(OpenSession)
    assert creating.baseline is not None and "a fact" in creating.baseline.system
    # Unchanged since that read: the next turn's one request may create its session with
    # its user message (the store opens it instead if it is stored).
    context.tell(StartTurn("b", "hello", reply_to=waiter.address))
    at_once = store.expect(OpenSession)
    assert at_once.baseline == creating.baseline
    assert at_once.first is not None and at_once.first.content == "hello"
    # Changed (or gone) since: a read would be needed, so the session is opened first.
    memory.write_text("another fact, longer\n")
    context.tell(StartTurn("c", "hi", reply_to=waiter.address))
    assert store.expect(OpenSession).baseline is None
    memory.unlink()  # no file: an empty block, known without a read
    context.tell(StartTurn("d", "hi", reply_to=waiter.address))
    empty = store.expect(OpenSession)
    assert empty.baseline is not None and "a fact" not in empty.baseline.system
    assert empty.first is not None
    waiter.stop()


def test_a_profile_with_a_system_file_opens_its_session_first(tmp_path) -> None:
    # Its prompt is a file: read only for a session the store says is new, like memory.
    (tmp_path / "writer.md").write_text("You write short poems.\n")
    config = Config(home=str(tmp_path), agents={"writer": AgentConfig(system_file="writer.md")})
    harness = context_harness(tmp_path, config)
    directory, store, context = next(harness)
    (tmp_path / "MEMORY.md").unlink()  # memory alone would be known without a read
    waiter = Probe.start(directory)
    context.tell(StartTurn("w", "hi", reply_to=waiter.address, agent="writer"))
    assert store.expect(OpenSession).baseline is None
    waiter.stop()
    with pytest.raises(StopIteration):
        next(harness)
