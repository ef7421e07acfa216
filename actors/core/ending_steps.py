"""The end of a turn: stored as ended before anyone is told it ended (SPEC 18).

A turn's first write marks its session running and the write that ends it clears the mark,
so a session still marked at the next start names a turn a crash cut off. ``TurnEnded`` is
told once the end is durable: with the turn's last messages when it ends on a write of its own
(:func:`save_last`: a final answer, a refusal at the step limit), else after a write of its
own (:func:`end`); a turn of which nothing was stored (its first write failed) needs none. A
cancel ends at once: its end write is sent, not waited for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Protocol

import msgspec

from actors.core.session_state import SessionState
from actors.core.turn_effects import Effect, Emit, Persist, TurnPhase
from messages import ChatMessage, TurnCompleted, TurnEnded, TurnOutcome

__all__ = ["end", "end_at_once", "save_last", "turn_ended"]


class Turn(Protocol):
    """What these steps use of :class:`actors.core.turn.Turn` (named here, not imported)."""

    ids: Iterator[int]
    phase: TurnPhase
    outcome: TurnOutcome | None
    _sent_first: bool
    _marked: bool
    _end_stored: bool
    _end_told: Emit | None

    state: SessionState

    def _save(
        self,
        messages: tuple[ChatMessage, ...],
        then: Callable[[], list[Effect]],
        reports: tuple[str, ...] = (),
        running: bool | None = None,
    ) -> list[Effect]: ...
    def finish_turn(self, outcome: TurnOutcome) -> list[Effect]: ...


def turn_ended(session: str, outcome: TurnOutcome) -> TurnEnded:
    """The ``TurnEnded`` event of ``outcome``."""
    if isinstance(outcome, TurnCompleted):
        output = None if outcome.output is None else msgspec.to_builtins(outcome.output)
        return TurnEnded(session=session, completed=True, output=output)
    return TurnEnded(session=session, completed=False, reason=outcome.reason, detail=outcome.detail)


def save_last(turn: Turn, messages: tuple[ChatMessage, ...], outcome: TurnOutcome) -> list[Effect]:
    """Store the turn's last ``messages`` and its end in one write; it ends with ``outcome``
    once that write is durable."""

    def stored() -> list[Effect]:
        turn._end_stored = True
        return turn.finish_turn(outcome)

    return turn._save(messages, stored, running=False)


def end(turn: Turn, outcome: TurnOutcome, then: Callable[[], list[Effect]]) -> list[Effect]:
    """The turn's outcome is ``outcome``: store its end (unless its last write did), then tell
    ``TurnEnded`` and go on with ``then`` (a compaction, or ``Finish``)."""
    turn.outcome = outcome
    told = Emit(turn_ended(turn.state.id, outcome))
    if turn._end_stored or not turn._marked:  # ended by its last write, or nothing stored
        turn.phase = TurnPhase.DONE
        return [told, *then()]
    turn._end_told = told

    def stored() -> list[Effect]:
        turn._end_told = None
        return [told, *then()]

    return turn._save((), stored, running=False)


def end_at_once(turn: Turn, outcome: TurnOutcome, effects: list[Effect]) -> list[Effect]:
    """End the turn now (a cancel) after ``effects``: its end goes with their last write
    (its repairs), or in a write of its own, sent to the store and not waited for."""
    turn.outcome = outcome
    turn.phase = TurnPhase.DONE
    last = effects[-1] if effects else None
    if isinstance(last, Persist):
        effects = [*effects[:-1], dataclasses.replace(last, running=False)]
    elif turn._sent_first and not turn._end_stored:
        effects = [*effects, Persist(next(turn.ids), (), running=False)]
    return [*effects, Emit(turn_ended(turn.state.id, outcome))]
