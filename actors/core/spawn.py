"""The pure parts of starting a session: its baseline, a child's first text, a child's summary."""

from __future__ import annotations

from datetime import datetime

from actors.core.dispatch import Registry, clock_text
from actors.core.text import cap_chars, neutralise
from messages import Baseline

__all__ = ["MEMORY_HEADING", "build_baseline", "child_summary", "child_text"]

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
