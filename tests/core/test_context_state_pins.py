"""The Context's state (actors/core/context_state.py), pinned at the core: one sweep passivates
every session idle for ``sessions.idle_s``, not only the last one it finds."""

from __future__ import annotations

from datetime import timedelta

import msgspec
from test_background_state import NOW, Shell, of

from actors.core.agents import Agents
from actors.core.context_effects import StopSession
from actors.core.context_state import ContextState
from actors.core.dispatch import Registry
from messages import Tick, TurnCompleted


def test_one_sweep_passivates_every_idle_session(tmp_path) -> None:
    shell = Shell(tmp_path)
    config = shell.state.config
    sessions = msgspec.structs.replace(config.sessions, idle_s=600)
    config = config.replace(sessions=sessions)
    shell.state = ContextState(config, Agents(config, Registry()), lambda: NOW)
    for session in ("a", "b", "c"):
        shell.user_turn(session, f"w-{session}")
        shell.ended(session, TurnCompleted(session, "done"))
    early = shell.state.tick(Tick(now=NOW + timedelta(seconds=599)))
    assert not of(StopSession, early)
    late = shell.state.tick(Tick(now=NOW + timedelta(seconds=601)))
    stopped = sorted(str(e.ref) for e in of(StopSession, late))
    assert len(stopped) == 3, late
