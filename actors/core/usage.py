"""Adding up token usage: a turn's own requests, its children's turns, a stored session."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from actors.stores.sqlite import SessionNotFound, StoredMessage
from messages import ChatMessage, Usage

__all__ = ["add_usage", "format_usage", "stored_usage", "total_usage", "turn_usage"]

SUMMARY = "Summary of the earlier conversation:\n"
"""How a compaction summary begins (``actors.core.turn.SUMMARY_PREFIX``): not a turn of its own."""


def add_usage(a: Usage, b: Usage) -> Usage:
    """``a`` and ``b`` summed field by field."""
    return Usage(
        prompt_tokens=a.prompt_tokens + b.prompt_tokens,
        completion_tokens=a.completion_tokens + b.completion_tokens,
        cached_tokens=a.cached_tokens + b.cached_tokens,
        requests=a.requests + b.requests,
    )


def total_usage(items: Iterable[Usage]) -> Usage:
    """Every usage of ``items`` summed; ``Usage()`` (zeros) for none."""
    total = Usage()
    for item in items:
        total = add_usage(total, item)
    return total


def stored_usage(messages: Iterable[ChatMessage]) -> Usage:
    """The usage stored with the assistant messages of ``messages``."""
    return total_usage(m.usage for m in messages if m.usage is not None)


def format_usage(usage: Usage) -> str:
    """One line for a person: ``1,234 prompt (1,000 cached) + 56 completion tokens, 3 requests``."""
    return (
        f"{usage.prompt_tokens:,} prompt ({usage.cached_tokens:,} cached) + "
        f"{usage.completion_tokens:,} completion tokens, {usage.requests:,} "
        f"request{'' if usage.requests == 1 else 's'}"
    )


class _Reader(Protocol):
    def history(self, id: str) -> list[StoredMessage]: ...


def turn_usage(store: _Reader, session: str, *, _depth: int = 0) -> list[tuple[Usage, Usage]]:
    """``(own, with children)`` usage of each stored turn of ``session``, in order.

    ``own`` sums the usage stored with the session's answers in that turn; ``with children``
    adds every child that turn spawned (``sub-<session>-<call id>``), their children included.
    A turn begins at each user message that is not a compaction summary. Compacted messages
    count (they were spent); a summary request's own tokens are not stored, so not counted.
    """
    turns: list[tuple[Usage, Usage]] = []
    own = total = Usage()
    started = False
    for stored in store.history(session):
        message = stored.message
        if message.role == "user" and not (message.content or "").startswith(SUMMARY):
            if started:
                turns.append((own, total))
            own = total = Usage()
            started = True
            continue
        if message.usage is not None:
            own = add_usage(own, message.usage)
            total = add_usage(total, message.usage)
        for call in message.tool_calls:
            child = f"sub-{session}-{call.id}"
            if call.name not in ("subagent", "call_tool") or len(child) > 64 or _depth > 64:
                continue
            try:
                below = turn_usage(store, child, _depth=_depth + 1)
            except SessionNotFound:
                continue
            total = add_usage(total, total_usage(t for _, t in below))
    if started:
        turns.append((own, total))
    return turns
