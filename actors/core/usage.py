"""Adding up token usage: a turn's own requests, its children's turns, a stored session's
messages (:func:`actors.shells.views.turn_usage` reads a stored session's turns)."""

from __future__ import annotations

from collections.abc import Iterable

from messages import ChatMessage, Usage

__all__ = ["INT64_MAX", "add_usage", "format_usage", "stored_usage", "total_usage", "usage_unknown"]

SUMMARY = "Summary of the earlier conversation:\n"
"""How a compaction summary begins (``actors.core.turn.SUMMARY_PREFIX``): not a turn of its own."""


INT64_MAX = 2**63 - 1
"""The largest count a message may carry: msgpack and the stores hold 64-bit signed integers."""


def _sum(a: int, b: int) -> int:
    # Saturates rather than overflows: a total past 2**63 - 1 could not be encoded at all.
    return min(a + b, INT64_MAX)


def add_usage(a: Usage, b: Usage) -> Usage:
    """``a`` and ``b`` summed field by field (never past :data:`INT64_MAX`)."""
    return Usage(
        prompt_tokens=_sum(a.prompt_tokens, b.prompt_tokens),
        completion_tokens=_sum(a.completion_tokens, b.completion_tokens),
        cached_tokens=_sum(a.cached_tokens, b.cached_tokens),
        requests=_sum(a.requests, b.requests),
        unmeasured_requests=_sum(a.unmeasured_requests, b.unmeasured_requests),
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


def usage_unknown(usage: Usage) -> bool:
    """True if no server reported the tokens of any of ``usage``'s requests: its zero counts
    mean "not known", never "none"."""
    return usage.requests > 0 and usage.unmeasured_requests >= usage.requests


def format_usage(usage: Usage) -> str:
    """One line for a person: ``1,234 prompt (1,000 cached) + 56 completion tokens, 3 requests``,
    then ``(2 unmeasured)`` when the server reported no usage for some of them; ``unknown
    tokens, 3 requests (none measured)`` when it reported none at all."""
    if usage_unknown(usage):
        plural = "" if usage.requests == 1 else "s"
        return f"unknown tokens, {usage.requests:,} request{plural} (none measured)"
    line = (
        f"{usage.prompt_tokens:,} prompt ({usage.cached_tokens:,} cached) + "
        f"{usage.completion_tokens:,} completion tokens, {usage.requests:,} "
        f"request{'' if usage.requests == 1 else 's'}"
    )
    if usage.unmeasured_requests:
        line += f" ({usage.unmeasured_requests:,} unmeasured)"
    return line
