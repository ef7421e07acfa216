"""The suite's registry guard (tests/actor_leak_guard.py): a test that leaves an actor running,
pass or fail, errors alone, and the tests after it find pykka's registry as it was."""

from __future__ import annotations

import pykka
import pytest

LEAKY = """
import pykka
import pytest

from actors.dispatcher import DispatchedActor, Dispatcher

DISPATCHER = Dispatcher(1, name="leaky")


class Idle(DispatchedActor):
    pass


def test_fails_with_an_actor_running() -> None:
    pykka.ThreadingActor.start()
    Idle.start(DISPATCHER)
    assert False, "failed before its stop"


def test_passes_with_an_actor_running() -> None:
    pykka.ThreadingActor.start()


def test_after_them_finds_the_registry_empty() -> None:
    assert pykka.ActorRegistry.get_all() == []


def test_that_stops_what_it_started_passes() -> None:
    ref = pykka.ThreadingActor.start()
    ref.stop(block=False)  # a stop under way at the end of the test is no leak


@pytest.fixture(scope="module")
def shared():
    ref = pykka.ThreadingActor.start()
    yield ref
    ref.stop()


def test_an_actor_of_a_module_fixture_is_that_fixtures(shared) -> None:
    pykka.ThreadingActor.start()  # started for the shared fixture's sake: not checked here
"""


@pytest.mark.timeout(120)
def test_a_leaked_actor_fails_its_own_test_only(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_leaky=LEAKY)
    before = set(pykka.ActorRegistry.get_all())
    result = pytester.runpytest_inprocess("-ra", "-p", "actor_leak_guard", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4, failed=1, errors=2)
    text = result.stdout.str()
    assert "test_passes_with_an_actor_running - Failed: 1 actor(s)" in text, text
    assert "test_fails_with_an_actor_running - Failed: 2 actor(s)" in text, text
    assert "(Idle, ThreadingActor): stopped now" in text, text
    # What the module fixture's test left is stopped here, so this test leaves nothing either.
    for ref in set(pykka.ActorRegistry.get_all()) - before:
        ref.stop()
    assert set(pykka.ActorRegistry.get_all()) == before
