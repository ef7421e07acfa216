"""An approved MCP call its server was running when loopd was SIGKILLed: the server ends with
its input, and the next start answers the call as cut off, never sending it again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from approval_kit import rt_history
from mcp_helpers import WAIT, LogWatch, process_alive
from mcp_kill_driver import config, script

from actors import Runtime
from actors.testing import ScriptedModel
from messages import DenyReason, denial_message

pytestmark = pytest.mark.timeout(120)

DRIVER = Path(__file__).with_name("mcp_kill_driver.py")


def test_an_approved_mcp_call_running_at_a_kill_is_answered_interrupted_not_sent_again(
    tmp_path: Path,
) -> None:
    home = str(tmp_path / "home")
    proc = subprocess.Popen(
        [sys.executable, str(DRIVER), home],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )
    try:
        line: list[str] = []
        assert proc.stdout is not None
        stdout = proc.stdout
        reader = threading.Thread(target=lambda: line.append(stdout.readline()))
        reader.start()
        reader.join(60)
        assert line and line[0].strip().isdigit(), f"the driver printed {line}"
        server = int(line[0])
    finally:
        proc.kill()  # SIGKILL: the runtime ends nothing, the server is told nothing
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    # The server runs in a process group of its own, so the kill did not reach it; its stdin
    # closed with the dead process, and the SDK ends the server (the call cancelled) at EOF.
    deadline = time.monotonic() + WAIT
    while process_alive(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_alive(server), "the MCP server outlived the process that started it"
    with LogWatch() as log:
        rt = Runtime.start(config(home), model=ScriptedModel(script))
        try:
            rt.wait_family("s", timeout=WAIT)
            tools = [m.content for m in rt_history(rt, "s") if m.role == "tool"]
            assert rt.pending_approvals() == ()
        finally:
            rt.stop()
    assert tools == [denial_message(DenyReason.INTERRUPTED)]
    assert not [x for x in log.lines if "slow started" in x], "the call was sent again"
