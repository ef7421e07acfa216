"""The pure parts of starting a session and hearing back from it: its baseline, a child's first
text, a child's summary, the parent's tool text for its outcome, a background report's message."""

from __future__ import annotations

from datetime import datetime

from actors.core.dispatch import (
    Answered,
    ArgumentError,
    Registry,
    SpawnChild,
    child_id,
    clock_text,
    depth_of,
)
from actors.core.limits import Limits
from actors.core.text import cap_chars, neutralise
from messages import (
    BackgroundReport,
    Baseline,
    ChatMessage,
    DenyReason,
    SubagentCompleted,
    SubagentResult,
    denial_message,
)

__all__ = [
    "CHILD_BACKGROUND",
    "MEMORY_HEADING",
    "build_baseline",
    "child_summary",
    "child_text",
    "report_message",
    "spawn_check",
    "subagent_result_text",
]

MEMORY_HEADING = "\n\n# Memory\n\n"


def build_baseline(system: str, registry: Registry, memory_block: str) -> Baseline:
    """A new session's baseline: the system prompt (its profile's), the memory block, and
    every tool ``registry`` (its profile's view) lists.

    Nothing time-varying goes in, so the baseline stays byte-stable for the session's life.
    """
    if memory_block.strip():
        system += MEMORY_HEADING + memory_block.strip()
    return Baseline(system=system, tools=registry.specs())


def child_text(task: str, cap: int, now: datetime) -> str:
    """A child's user text: ``It is <now>.\\n\\n<task capped at cap characters>``."""
    return f"It is {clock_text(now)}.\n\n{cap_chars(task, cap)}"


def child_summary(content: str, cap: int) -> str:
    """What a parent sees of its child's answer: neutralised, then capped."""
    return cap_chars(neutralise(content), cap)


CHILD_BACKGROUND = "only a top-level session runs subagents in the background; call without it"
"""The detail of the denial of a background call from a child session."""


def report_message(report: BackgroundReport) -> ChatMessage:
    """The user message, named ``subagent``, that carries a background child's outcome."""
    return ChatMessage(role="user", content=report.text, name="subagent")


def subagent_result_text(result: SubagentResult) -> str:
    """The parent's tool text for a child's outcome: ``<child> completed\\n<summary>`` or failed."""
    if isinstance(result, SubagentCompleted):
        return f"{result.child} completed\n{result.summary}"
    return f"{result.child} failed"


def spawn_check(
    parent: str, call_id: int, route: SpawnChild, nth: int, limits: Limits
) -> str | Answered:
    """The child id of ``parent``'s ``subagent`` call ``call_id`` (the ``nth`` of its answer),
    or the denial that answers the call instead: an id that does not fit, ``loop.max_depth``,
    ``loop.max_children``, or a background call from a child."""
    try:
        child = child_id(parent, call_id)
    except ArgumentError as exc:
        return Answered(denial_message(DenyReason.INVALID_ARGUMENTS, exc.detail), True)
    if depth_of(child) > limits.max_depth:
        detail = f"{child} would be {depth_of(child)} levels deep; loop.max_depth is "
        return Answered(denial_message(DenyReason.LIMIT, detail + str(limits.max_depth)), True)
    if nth > limits.max_children:
        detail = f"one answer may start {limits.max_children} children (loop.max_children)"
        return Answered(denial_message(DenyReason.LIMIT, detail), True)
    if route.background and depth_of(parent) > 0:
        # A child's turn ends once; nothing would be left to hear its background child.
        return Answered(denial_message(DenyReason.LIMIT, CHILD_BACKGROUND), True)
    return child
