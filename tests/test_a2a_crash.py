"""A crash under a remote child: SIGKILL the calling runtime while its remote task runs.

The runtime runs in a subprocess (tests/a2a_crash_driver.py); the remote agent, built with the
SDK, runs in this process and records each cancel. After the kill, the next start cancels the
remote task (its id was stored before the message was sent) and drops the row, and the parent's
open call is answered failed when its session runs again.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from a2a_agents import A2aAgents

from actors import Config, Runtime
from actors.core.config import AgentConfig
from actors.stores.sqlite import DB_NAME, SessionStore
from actors.testing import ScriptedModel, reply
from messages import ModelRequest, TurnCompleted

pytestmark = pytest.mark.timeout(120)

DRIVER = Path(__file__).with_name("a2a_crash_driver.py")
WAIT = 30.0


@pytest.fixture
def agents() -> Iterator[A2aAgents]:
    server = A2aAgents()
    yield server
    server.stop()


def stored_row(home: Path, task_id: str) -> tuple[str, ...]:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if (home / DB_NAME).exists():
            try:
                with sqlite3.connect(home / DB_NAME) as db:
                    rows = db.execute("SELECT child, parent, task_id FROM remote_tasks").fetchall()
            except sqlite3.OperationalError:  # the table is being created
                rows = []
            if rows and rows[0][2] == task_id:
                return tuple(rows[0])
        time.sleep(0.02)
    raise AssertionError("the remote task's id was never stored")


def test_sigkill_under_a_remote_task_cancels_it_at_the_next_start(
    agents: A2aAgents, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    url = agents.url("slow")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, str(DRIVER), str(home), url, "60"],
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        task_id = agents.recorder.wait_started(WAIT)
        assert stored_row(home, task_id) == ("sub-mm-1", "mm", task_id)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert not agents.recorder.cancelled  # nobody cancelled it: it still runs remotely

    def again(request: ModelRequest) -> object:
        tools = [m for m in request.messages if m.role == "tool"]
        return reply(f"saw: {tools[-1].content}" if tools else "no tool result")

    config = Config(home=str(home), agents={"far": AgentConfig(a2a_url=url)})
    started = time.monotonic()
    with Runtime.start(config, model=ScriptedModel(again)) as rt:
        assert time.monotonic() - started < 15  # the start is never held long by a remote
        assert agents.recorder.wait_cancelled(task_id, timeout=5) == task_id
        with sqlite3.connect(home / DB_NAME) as db:
            assert db.execute("SELECT * FROM remote_tasks").fetchall() == []
        outcome = rt.run_turn("mm", "and now?", timeout=WAIT)
    assert isinstance(outcome, TurnCompleted)
    store = SessionStore(home / DB_NAME)
    try:
        parent = store.open("mm")
    finally:
        store.close()
    results = [m for m in parent.transcript if m.role == "tool"]
    # The parent's call was answered failed, as for any interrupted child.
    assert [m.content for m in results] == ["sub-mm-1 failed"]
