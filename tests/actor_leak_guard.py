"""A pytest plugin of loopd's suite: every test leaves pykka's registry as it found it.

pykka's registry is global to the process, so an actor a test leaves running (a test that
failed before its ``stop``, say) would be seen by every later test on that worker: one
failure would spill into others. After each test, the actors it started that still run are
given a moment to finish a stop already under way, then stopped; the test that left them gets
an error naming them, and no other test does.

A test that uses a fixture of a wider scope of the suite's own (a runtime shared by a module's
tests) is not checked: the actors it starts belong to that fixture, which stops them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pykka
import pytest

STOPPING_GRACE = 5.0  # for a stop already under way to end: waiting only, never a race
STOP_WAIT = 30.0  # for the actors left over to stop when told


def _shares_a_wider_fixture(request: pytest.FixtureRequest) -> bool:
    """True if the test uses a module-, class-, package- or session-scoped fixture of the
    suite's own (pytest's own, such as ``tmp_path_factory``, start no actors)."""
    info = getattr(request.node, "_fixtureinfo", None)
    if info is None:
        return False
    for defs in info.name2fixturedefs.values():
        for fixturedef in defs:
            if fixturedef.scope != "function" and fixturedef.baseid:
                return True
    return False


def _still_running(before: set[pykka.ActorRef[Any]]) -> list[pykka.ActorRef[Any]]:
    return [ref for ref in pykka.ActorRegistry.get_all() if ref not in before]


def _stop_all(refs: list[pykka.ActorRef[Any]]) -> None:
    futures = []
    for ref in refs:
        try:
            futures.append(ref.stop(block=False))
        except pykka.ActorDeadError:
            continue
    deadline = time.monotonic() + STOP_WAIT
    for future in futures:
        try:
            future.get(timeout=max(0.0, deadline - time.monotonic()))
        except (pykka.ActorDeadError, pykka.Timeout):
            continue


@pytest.fixture(autouse=True)
def _no_actor_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Stops the actors a test left running, and fails that test (at teardown) naming them."""
    if _shares_a_wider_fixture(request):
        yield
        return
    before = set(pykka.ActorRegistry.get_all())
    yield
    left = _still_running(before)
    if not left:
        return
    deadline = time.monotonic() + STOPPING_GRACE
    for ref in left:  # a stop told just before the test ended may still be under way
        ref.actor_stopped.wait(max(0.0, deadline - time.monotonic()))
    left = _still_running(before)
    if not left:
        return
    names = sorted({ref.actor_class.__name__ for ref in left})
    _stop_all(left)
    remaining = _still_running(before)
    pytest.fail(
        f"{len(left)} actor(s) this test started still ran after it ({', '.join(names)}): "
        f"stopped now so that no other test sees them"
        + (f"; {len(remaining)} did not stop within {STOP_WAIT:g} s" if remaining else ""),
        pytrace=False,
    )
