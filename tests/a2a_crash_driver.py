"""The process tests/test_a2a_crash.py kills: a parent whose child is a slow remote A2A task.

    python tests/a2a_crash_driver.py HOME A2A_URL [MAX_SECONDS]

It starts a Runtime on HOME whose profile ``far`` is the remote agent at A2A_URL, and runs one
turn of ``mm`` whose model calls ``subagent`` with ``far``; the remote works until cancelled.
It prints ``started`` once the runtime runs, and waits to be killed. This is a helper script,
not a test module; it exits by itself after MAX_SECONDS (default 60).
"""

from __future__ import annotations

import sys
import threading
import time

from actors import Config, Runtime
from actors.core.config import AgentConfig
from actors.testing import ScriptedModel, call, reply
from messages import ModelRequest


def script(request: ModelRequest) -> object:
    last = request.messages[-1]
    if last.role == "user":
        return call("subagent", task="take your time", agent="far")
    return reply(last.content or "")


def main() -> None:
    home, url = sys.argv[1], sys.argv[2]
    limit = float(sys.argv[3]) if len(sys.argv) > 3 else 60.0
    config = Config(home=home, agents={"far": AgentConfig(a2a_url=url)})
    runtime = Runtime.start(config, model=ScriptedModel(script))
    threading.Thread(
        target=lambda: runtime.run_turn("mm", "go", timeout=limit), daemon=True
    ).start()
    print("started", flush=True)
    time.sleep(limit)


if __name__ == "__main__":
    main()
