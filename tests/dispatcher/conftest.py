"""The dispatcher the tests of this folder run their actors on (pykka and
``actors.dispatcher`` only, nothing else of loopd)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from actors.dispatcher import Dispatcher


@pytest.fixture
def dispatcher() -> Iterator[Dispatcher]:
    """Two threads; every actor started on it must have stopped within 10 s of the test."""
    d = Dispatcher(2, name="test-dispatcher")
    yield d
    assert d.shutdown(10.0)
