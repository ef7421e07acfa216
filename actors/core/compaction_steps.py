"""The turn's side of compaction: summarising a long history and replacing it (SPEC 7).

A :class:`~actors.core.turn.Turn` compacts after its outcome when the transcript passes
``compact.threshold_chars`` (or fills too much of a known context), and in the middle of a turn
before a request that would not fit (this turn's messages are kept after the summary). The
summary is asked of the model on the session's own slot, capped at ``compact.summary_chars``,
neutralised, and stored by the store's ``Compact`` (the old messages are marked, never
deleted). A failed compaction never changes the turn's outcome.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from actors.core.limits import Limits
from actors.core.session_state import SessionState, estimate_tokens, fitting_tail
from actors.core.text import cap_chars, neutralise
from actors.core.turn_effects import Compact, Effect, Emit, RequestModel, TurnPhase
from messages import ChatMessage, Compacted, CompactionFailed, FailReason, TurnFailed, TurnOutcome

__all__ = [
    "COMPACT_INSTRUCTION",
    "SUMMARY_PREFIX",
    "after_outcome",
    "compact_in_turn",
    "compacted",
    "failed",
    "summarise",
    "summarised",
]

COMPACT_INSTRUCTION = (
    "Summarise this conversation so far for your own later use: the facts, decisions, open "
    "questions and results that matter. Answer with the summary only."
)
SUMMARY_PREFIX = "Summary of the earlier conversation:\n"


class Turn(Protocol):
    """What these steps use of :class:`actors.core.turn.Turn` (named here, not imported, so
    the turn machine and its compaction steps do not import each other)."""

    state: SessionState
    limits: Limits
    ids: Iterator[int]
    phase: TurnPhase
    _turn_start: int
    _summary: ChatMessage | None
    _keep: tuple[ChatMessage, ...]
    _after_compact: Callable[[], list[Effect]] | None
    _if_not_compacted: Callable[[str], list[Effect]] | None

    def _context(self) -> int | None: ...
    def _over_context(self) -> bool: ...
    def _request(self, messages: tuple[ChatMessage, ...]) -> RequestModel: ...
    def _next_id(self) -> int: ...
    def _save(
        self,
        messages: tuple[ChatMessage, ...],
        then: Callable[[], list[Effect]],
        reports: tuple[str, ...] = (),
    ) -> list[Effect]: ...


def after_outcome(
    turn: Turn, outcome: TurnOutcome, finish: Callable[[], list[Effect]]
) -> list[Effect]:
    """The turn's outcome is told: a transcript past ``compact.threshold_chars`` (or too much
    of a known context) is summarised before ``finish``; never after a store failure, since
    the transcript in memory then holds messages the store refused."""
    refused = isinstance(outcome, TurnFailed) and outcome.reason is FailReason.STORE_ERROR
    over = turn.state.transcript_chars() > turn.limits.threshold_chars or turn._over_context()
    if refused or not over:
        return finish()
    turn._keep = ()
    turn._after_compact = finish
    turn._if_not_compacted = lambda _detail: finish()
    return summarise(turn, turn.state.transcript)


def compact_in_turn(
    turn: Turn,
    then: Callable[[], list[Effect]],
    otherwise: Callable[[str], list[Effect]],
) -> list[Effect]:
    """Summarise the history before this turn, keep this turn's messages after the summary,
    then go on with ``then``; if the summary fails, ``otherwise(detail)``."""
    history = turn.state.transcript[: turn._turn_start]
    turn._keep = tuple(turn.state.transcript[turn._turn_start :])
    turn._after_compact, turn._if_not_compacted = then, otherwise
    return summarise(turn, history)


def summarise(turn: Turn, history: list[ChatMessage]) -> list[Effect]:
    """Ask the model to summarise ``history``: as much of its end as fits the context."""
    turn.phase = TurnPhase.SUMMARISING
    instruction = ChatMessage(role="user", content=COMPACT_INSTRUCTION)
    context = turn._context()
    if context is not None:
        budget = int(turn.limits.threshold_ratio * context) - turn.state.baseline_tokens()
        budget -= estimate_tokens(len(COMPACT_INSTRUCTION), 1)
        history = fitting_tail(history, budget)
    system = ChatMessage(role="system", content=turn.state.baseline.system)
    messages = (system, *history, instruction)
    return [turn._request(messages)]


def summarised(turn: Turn, content: str) -> list[Effect]:
    """The model wrote the summary: store it (the store marks the old history compacted)."""
    text = SUMMARY_PREFIX + cap_chars(neutralise(content), turn.limits.summary_chars)
    turn._summary = ChatMessage(role="user", content=text)
    turn.phase = TurnPhase.COMPACTING
    return [Compact(turn._next_id(), turn._summary)]


def compacted(turn: Turn) -> list[Effect]:
    """The store compacted: the summary is the history now, and the turn goes on."""
    assert turn._summary is not None and turn._after_compact is not None
    before = turn.state.transcript_chars()
    turn.state.replace([turn._summary])
    turn.state.forget_counts()
    turn._turn_start = 1
    then, turn._after_compact = turn._after_compact, None
    keep, turn._keep = turn._keep, ()
    # The store's compaction keeps only the summary: this turn's messages go after it again.
    effects = turn._save(keep, then) if keep else then()
    after = turn.state.transcript_chars()
    event = Compacted(session=turn.state.id, before=before, after=after)
    return [Emit(event), *effects]


def failed(turn: Turn, detail: str) -> list[Effect]:
    """The summary or its storing failed: say so, and go on as if nothing was compacted."""
    assert turn._if_not_compacted is not None
    event = CompactionFailed(session=turn.state.id, detail=detail)
    otherwise, turn._if_not_compacted = turn._if_not_compacted, None
    turn._keep, turn._after_compact = (), None
    return [Emit(event), *otherwise(detail)]
