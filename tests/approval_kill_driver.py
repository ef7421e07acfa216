"""The process tests/test_approval_edges.py kills: a call approved, whose deploy is still running.

    python tests/approval_kill_driver.py HOME

Session ``s`` calls ``deploy`` (needs a yes); the driver approves it, and once the deploy has
begun (and is stuck), prints one line and waits to be killed. A helper script, not a test.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from approval_kit import stored_approvals

from actors import Config, Runtime, port_tool
from actors.testing import ScriptedModel, calls, reply
from messages import ApprovalRequested, ModelRequest

began = threading.Event()


@port_tool(approval=True)
def deploy(env: str) -> str:
    """Deploy to an environment.

    Args:
        env: Where to.
    """
    began.set()
    threading.Event().wait(120)  # a deploy stuck until the SIGKILL
    return f"deployed to {env}"


def script(request: ModelRequest) -> Any:
    if request.messages[-1].role == "user":
        return calls(("deploy", {"env": "prod"}))
    return reply("\n".join(m.content or "" for m in request.messages if m.role == "tool"))


def main() -> None:
    rt = Runtime.start(Config(home=sys.argv[1]), model=ScriptedModel(script), tools=[deploy])
    asked = threading.Event()
    rt.subscribe(lambda e: asked.set() if isinstance(e, ApprovalRequested) else None)
    rt.send_turn("s", "ship it")
    if not asked.wait(30):
        sys.exit("approval_kill_driver: no request")
    rt.approve("s", 1)
    if not began.wait(30):
        sys.exit("approval_kill_driver: the deploy never began")
    # The store marks the approval carried out in the transaction that records it, which may
    # commit just after the deploy began: wait (with a deadline) until a reader sees it.
    deadline = time.monotonic() + 30
    while not any(a.ran for a in stored_approvals(rt)):
        if time.monotonic() > deadline:
            sys.exit("approval_kill_driver: the approval was never marked carried out")
        threading.Event().wait(0.005)
    print("deploying", flush=True)
    threading.Event().wait(60)
    sys.exit("approval_kill_driver: not killed in time")


if __name__ == "__main__":
    main()
