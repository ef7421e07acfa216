"""The dispatcher the tests of this folder run their actors on (pykka and
``actors.dispatcher`` only, nothing else of loopd)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from actors.dispatcher import Dispatcher

WAIT = 30.0  # for waiting only: what a test waits for takes milliseconds on an idle machine


@pytest.fixture
def dispatcher() -> Iterator[Dispatcher]:
    """Two threads; every actor started on it must have stopped within WAIT of the test."""
    d = Dispatcher(2, name="test-dispatcher")
    yield d
    assert d.shutdown(WAIT)


@pytest.fixture
def new_dispatcher() -> Iterator[Callable[..., Dispatcher]]:
    """Makes dispatchers of the test's own size, each shut down after the test, pass or fail,
    so that no actor of a failed test stays in pykka's registry for the tests after it (a
    second shutdown does no harm)."""
    made: list[Dispatcher] = []

    def make(threads: int, *, name: str, throughput: int = 0) -> Dispatcher:
        d = Dispatcher(threads, name=name, throughput=throughput)
        made.append(d)
        return d

    yield make
    stopped = [d.shutdown(WAIT) for d in made]
    assert all(stopped), [d.name for d, ok in zip(made, stopped, strict=True) if not ok]
