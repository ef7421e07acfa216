"""Runtime.stop leaves nothing behind: no thread, no actor in pykka's registry."""

from __future__ import annotations

import threading

import pykka
import pytest

from actors import Config, Runtime
from actors.core.config import HeartbeatConfig, RuntimeConfig
from actors.sessions.session import SessionActor
from actors.testing import ScriptedModel, call, reply
from messages import ModelRequest, TurnCompleted

WAIT = 10.0


def script(request: ModelRequest):
    """Top-level sessions spawn one child each; children answer at once."""
    if request.session.startswith("sub-"):
        return reply("child done")
    if request.messages[-1].role == "user":
        return call("subagent", task="help")
    return reply("parent done")


def test_stop_ends_every_thread_and_registry_entry_of_the_runtime(tmp_path) -> None:
    threads_before = set(threading.enumerate())
    refs_before = set(pykka.ActorRegistry.get_all())
    config = Config(
        home=str(tmp_path / "home"),
        runtime=RuntimeConfig(threads=3),
        # A heartbeat far off: the scheduler and its ticker run, no turn is scheduled.
        heartbeat=HeartbeatConfig(session="beat", every_s=3600),
    )
    rt = Runtime.start(config, model=ScriptedModel(script))
    sessions = [f"s{i}" for i in range(40)]
    for session in sessions:
        rt.send_turn(session, "go")
    assert rt.run_turn("last", "go", timeout=WAIT) == TurnCompleted("last", "parent done")
    ours = set(pykka.ActorRegistry.get_all()) - refs_before
    assert any(issubclass(ref.actor_class, SessionActor) for ref in ours)
    assert {t.name for t in rt.dispatcher.threads} >= {"loopd-0", "loopd-1", "loopd-2"}

    rt.stop(timeout=WAIT)  # some of the 40 turns may still be running: they are cancelled

    left = [t.name for t in set(threading.enumerate()) - threads_before if t.is_alive()]
    assert left == []
    assert set(pykka.ActorRegistry.get_all()) - refs_before == set()
    assert all(not ref.is_alive() for ref in ours)


def test_stop_twice_and_use_after_stop(tmp_path) -> None:
    rt = Runtime.start(Config(home=str(tmp_path / "home")), model=ScriptedModel([reply("x")]))
    rt.stop()
    rt.stop()  # no harm
    with pytest.raises(RuntimeError, match="stopped"):
        rt.live()
    with pytest.raises(RuntimeError, match="stopped"):
        rt.send_turn("s", "hi")
