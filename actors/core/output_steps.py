"""The turn's side of typed results: a ``final_answer`` call checked, a text answer nudged, and
how the turn ends once a typed answer's calls have their results.

:class:`~actors.core.output.FinalAnswer` keeps a typed turn's tries; these steps are where the
:class:`~actors.core.turn.Turn` asks it, one function per moment of the turn.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from actors.core.dispatch import CALL_TOOL, Answered, Registry, Route
from actors.core.limits import Limits
from actors.core.output import ANSWER_BY_CALLING, Done, Fail, FinalAnswer, outcome_of
from actors.core.session_state import SessionState
from actors.core.turn_effects import Effect
from messages import ChatMessage, ToolCall, TurnOutcome

__all__ = ["after_final_answer", "answered_in_text", "at_limit", "final_answer_route"]


class Turn(Protocol):
    """What these steps use of :class:`actors.core.turn.Turn` (named here, not imported, so
    the turn machine and its typed-result steps do not import each other)."""

    state: SessionState
    registry: Registry
    limits: Limits
    step: int
    output: FinalAnswer | None
    _truncated: bool

    def finish_turn(self, outcome: TurnOutcome) -> list[Effect]: ...
    def _ask(self) -> list[Effect]: ...
    def _save(
        self,
        messages: tuple[ChatMessage, ...],
        then: Callable[[], list[Effect]],
        reports: tuple[str, ...] = (),
    ) -> list[Effect]: ...


def final_answer_route(turn: Turn, output: FinalAnswer, call: ToolCall, route: Route) -> Route:
    """A ``final_answer`` call is answered here: accepted, or denied naming the field."""
    allowed = turn.registry.allows(CALL_TOOL)
    arguments = output.inner_arguments(call.name, call.as_written, call_tool=allowed)
    if arguments is None:
        return route
    if turn._truncated:
        output.cut_off(f"the call was cut off at max_tokens ({turn.limits.max_tokens} tokens)")
        return route
    text, denied = output.call(arguments)
    return Answered(text, denied)


def at_limit(turn: Turn, call: ToolCall, refusal: str) -> str:
    """A call's text when the answer came at ``loop.max_steps``: a ``final_answer`` call is
    still checked (a valid one completes the turn), any other refused."""
    if turn.output is None or turn._truncated:
        return refusal
    allowed = turn.registry.allows(CALL_TOOL)
    arguments = turn.output.inner_arguments(call.name, call.as_written, call_tool=allowed)
    return refusal if arguments is None else turn.output.call(arguments)[0]


def answered_in_text(turn: Turn, output: FinalAnswer, final: ChatMessage) -> list[Effect]:
    """A typed session's model answered in text: a failed try, answered with
    :data:`ANSWER_BY_CALLING` while a try (and a step) is left."""
    limits = turn.limits
    ended = output.after_text(turn.state.id, turn.step, limits.max_steps)
    if ended is not None:
        return turn._save((final,), lambda: turn.finish_turn(ended))
    nudge = ChatMessage(role="user", content=ANSWER_BY_CALLING)
    return turn._save((final, nudge), turn._ask)


def after_final_answer(turn: Turn, verdict: Done | Fail | None) -> Callable[[], list[Effect]]:
    """What follows the results of an answer of a typed session: the next request, or the
    turn's end."""
    if verdict is None:
        return turn._ask
    s, cap = turn.state, turn.limits.tool_result_cap
    outcome = outcome_of(verdict, s.id, child=s.parent is not None, cap=cap)
    return lambda: turn.finish_turn(outcome)
