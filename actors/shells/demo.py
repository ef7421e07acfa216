"""The demo: a scripted parent spawns a child that spawns a grandchild, offline."""

from __future__ import annotations

from actors.core.dispatch import depth_of
from actors.testing.script import Answer, call, reply
from messages import ModelRequest

__all__ = ["DEMO_SESSION", "DEMO_TEXT", "demo_script"]

DEMO_SESSION = "demo"
DEMO_TEXT = "Plan a short walk for this afternoon."

_TASKS = {
    0: "Find out what time it is and whether there is still daylight for a walk.",
    1: "Read the clock and report the time exactly.",
}


def demo_script(request: ModelRequest) -> Answer:
    """The demo's model: each level delegates one step down, the deepest reads the clock."""
    level = depth_of(request.session)
    last = request.messages[-1]
    if last.role == "user":
        if level in _TASKS:
            return call("subagent", task=_TASKS[level])
        return call("clock")
    if level == 2:
        return reply(f"The clock says {last.content}.")
    if level == 1:
        return reply(f"There is time for a walk. The time check came back as: {last.content}")
    return reply(
        "Here is the plan: a 40-minute loop through the park, leaving now. "
        f"My helper reported:\n{last.content}"
    )
