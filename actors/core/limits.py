"""The numbers a turn obeys: ``[loop]``, ``[compact]`` and the model's context, as one value."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Limits"]


@dataclass(frozen=True)
class Limits:
    """The numbers a turn obeys, from ``[loop]`` and ``[compact]``."""

    max_steps: int
    tool_result_cap: int
    summary_chars: int
    threshold_chars: int
    max_depth: int = 4
    max_children: int = 8
    untrusted_may_remember: bool = False
    context_tokens: int | None = None
    """A slot's context size in tokens; None: unknown (compaction counts characters)."""
    threshold_ratio: float = 0.75
    max_tokens: int = 2048
    keep_truncated: bool = False
    """``model.on_length = "keep"``: a cut-off final answer completes, marked truncated."""
    output_retries: int = 2
    """``loop.output_retries``: a typed session's tries after its first."""
