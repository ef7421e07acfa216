"""What the store actor's tests share: a directory, and a probe at the address they reply to."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from actors.dispatcher.directory import Directory
from actors.testing import Probe


@pytest.fixture
def directory() -> Directory:
    return Directory()


@pytest.fixture
def probe(directory: Directory) -> Iterator[Probe]:
    """The kit's probe, registered at ``"probe"``, the reply address these tests use."""
    p = Probe.start(name="probe")
    directory.register("probe", p)
    yield p
    p.stop()
