"""The process tests/test_approvals.py kills: one turn whose call waits for a person.

    python tests/approval_driver.py HOME [MAX_SECONDS] [family]

It starts a Runtime on HOME with the ``deploy`` tool (which needs a yes) and ``status``, runs
one turn on session ``s`` whose answer calls both, and prints one JSON line once the
``ApprovalRequested`` is published and ``status`` has finished:
``{"call_id": 1, "tool": "deploy", "at": "..."}``. Then it waits to be killed (SIGKILL); it
exits by itself after MAX_SECONDS (default 60) so that it never outlives a lost test run.
With ``family``, ``s`` delegates to a child (``sub-s-1``) whose call of ``deploy`` waits; the
line comes once that child's request is published.

A helper script, not a test module.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

from actors import Config, Runtime, port_tool
from actors.testing import ScriptedModel, calls, reply
from messages import ApprovalRequested, ModelRequest, ToolCallFinished


@port_tool(approval=True)
def deploy(env: str) -> str:
    """Deploy to an environment.

    Args:
        env: Where to.
    """
    return f"deployed to {env}"


@port_tool
def status(env: str) -> str:
    """The status of an environment.

    Args:
        env: Which.
    """
    return f"{env} is green"


def script(request: ModelRequest) -> Any:
    """Call both tools on the user's message; then answer with the tools' texts."""
    if request.messages[-1].role == "user":
        return calls(("deploy", {"env": "prod"}), ("status", {"env": "prod"}))
    return reply("\n".join(m.content or "" for m in request.messages if m.role == "tool"))


def family_script(request: ModelRequest) -> Any:
    """``s`` delegates; its child calls ``deploy``; each then answers with its tools' texts."""
    if request.messages[-1].role != "user":
        return script(request)
    if request.session == "s":
        return calls(("subagent", {"task": "deploy prod"}))
    return calls(("deploy", {"env": "prod"}))


def main() -> None:
    home = sys.argv[1]
    max_seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
    family = sys.argv[3:] == ["family"]
    model = ScriptedModel(family_script if family else script)
    rt = Runtime.start(Config(home=home), model=model, tools=[deploy, status])
    seen: dict[str, Any] = {}
    ready = threading.Event()

    def on_event(event: Any) -> None:
        if isinstance(event, ApprovalRequested):
            seen["request"] = event
        if isinstance(event, ToolCallFinished) and event.name == "status":
            seen["status"] = event
        if "request" in seen and (family or "status" in seen):
            ready.set()

    rt.subscribe(on_event)
    rt.send_turn("s", "ship it")
    if not ready.wait(max_seconds):
        sys.exit("approval_driver: no ApprovalRequested in time")
    request = seen["request"]
    line = {
        "session": request.session,
        "call_id": request.call_id,
        "tool": request.tool,
        "at": request.at.isoformat(),
    }
    print(json.dumps(line), flush=True)
    threading.Event().wait(max_seconds)  # until SIGKILL
    sys.exit("approval_driver: not killed in time")


if __name__ == "__main__":
    main()
