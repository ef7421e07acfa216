"""The process tests/test_mcp_crash.py kills: an approved MCP call its server is still running.

    python tests/mcp_kill_driver.py HOME

Session ``s`` calls ``files__slow`` (60 s), which waits for a person (``[approvals] tools``).
The driver approves it; once the server has begun the call and the store marks the approval
carried out, it prints the server's process id and waits to be killed. The test starts a
runtime on the same home with the same :func:`config` and :func:`script`. A helper script, not
a test.
"""

from __future__ import annotations

import sys
import threading
import time

from approval_kit import stored_approvals
from mcp_helpers import LogWatch, stdio

from actors import Config, Runtime
from actors.core.config_tables import ApprovalsConfig
from actors.testing import ScriptedModel, calls, reply
from actors.testing.script import Answer
from messages import ApprovalRequested, ModelRequest

WAIT = 30.0


def config(home: str) -> Config:
    """The test server over stdio, its ``slow`` tool waiting for a person."""
    return Config(
        home=home,
        approvals=ApprovalsConfig(tools=("files__slow",)),
        mcp={"files": stdio()},
    )


def script(request: ModelRequest) -> Answer:
    """Call ``files__slow`` once, then answer what the call was answered."""
    if request.messages[-1].role == "user":
        return calls(("files__slow", {"seconds": 60}))
    return reply("\n".join(m.content or "" for m in request.messages if m.role == "tool"))


def main() -> None:
    with LogWatch() as log:
        rt = Runtime.start(config(sys.argv[1]), model=ScriptedModel(script))
        asked = threading.Event()
        rt.subscribe(lambda e: asked.set() if isinstance(e, ApprovalRequested) else None)
        rt.send_turn("s", "go slow")
        if not asked.wait(WAIT):
            sys.exit("mcp_kill_driver: no request")
        rt.approve("s", 1)
        pid = log.wait_for(r"slow started in (\d+)", WAIT).group(1)
    # The approval is marked carried out in the transaction that records it, which may commit
    # just after the call went out: wait (with a deadline) until a reader sees it.
    deadline = time.monotonic() + WAIT
    while not any(a.ran for a in stored_approvals(rt)):
        if time.monotonic() > deadline:
            sys.exit("mcp_kill_driver: the approval was never marked carried out")
        threading.Event().wait(0.005)
    print(pid, flush=True)
    threading.Event().wait(60)
    sys.exit("mcp_kill_driver: not killed in time")


if __name__ == "__main__":
    main()
