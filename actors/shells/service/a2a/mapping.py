"""What loopd's turns are in A2A terms, as plain functions (no SDK, no I/O): a test drives them
without a server.

- A *context* is a session: :func:`context_session` picks the session of a message.
- A *skill* is an agent profile: :func:`skill_of` reads the message's ``metadata.skill``.
- A *task* is one turn: :func:`event_update` says what a turn event (children's included)
  tells the task's client, :func:`outcome_update` how the turn's outcome ends the task.
- ``INPUT_REQUIRED`` is a call waiting for a person: :func:`decision_of` reads the follow-up's
  data part as the decision :meth:`~actors.Runtime.approve` / ``deny`` would take.

States are the SDK's enum names (``TASK_STATE_WORKING``...); the SDK side turns them into its
types.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from actors.core.approvals import check_call_id, decision_text
from actors.core.bounded import OutOfBounds, check_value
from actors.core.text import cap_chars
from messages import (
    ApprovalRequested,
    ApprovalSettled,
    FailReason,
    SubagentFinished,
    SubagentStarted,
    TextDelta,
    TurnCompleted,
    TurnEvent,
    TurnFailed,
    TurnOutcome,
    TurnStarted,
    check_top_level_session,
)

__all__ = [
    "CANCELED",
    "COMPLETED",
    "CONTEXT_PREFIX",
    "FAILED",
    "INPUT_REQUIRED",
    "TERMINAL",
    "WORKING",
    "Decision",
    "Refused",
    "Update",
    "approval_text",
    "context_number",
    "context_session",
    "decision_of",
    "due_text",
    "event_update",
    "outcome_update",
    "skill_of",
]

WORKING: Final = "TASK_STATE_WORKING"
INPUT_REQUIRED: Final = "TASK_STATE_INPUT_REQUIRED"
COMPLETED: Final = "TASK_STATE_COMPLETED"
FAILED: Final = "TASK_STATE_FAILED"
CANCELED: Final = "TASK_STATE_CANCELED"
TERMINAL: Final = frozenset({COMPLETED, FAILED, CANCELED, "TASK_STATE_REJECTED"})
"""The states a task never leaves."""

CONTEXT_PREFIX: Final = "a2a-"
"""A message without a ``contextId`` gets the new session ``a2a-<n>``."""

_NUMBERED = re.compile(r"a2a-([1-9][0-9]{0,17})")

SHOWN_ARGUMENTS: Final = 2_000
"""Characters of a waiting call's arguments the ``INPUT_REQUIRED`` status shows."""


class Refused(ValueError):
    """A message the endpoint refuses before anything runs (the SDK's invalid-params error)."""


@dataclass(frozen=True)
class Update:
    """What one event tells the task's client: a status (``state`` and its message ``text``),
    or with ``artifact`` a piece of the answer's text (``append``: after what came before)."""

    state: str
    text: str = ""
    artifact: str | None = None
    append: bool = False
    data: Any = None
    """The typed output of a completed turn (a data part beside the text), if any."""


@dataclass(frozen=True)
class Decision:
    """A person's decision read from a data part: approve (``note``) or decline (``reason``)."""

    call_id: int
    approve: bool
    reason: str


def context_session(context_id: str | None, number: int) -> str:
    """The session a message's ``contextId`` names: a valid top-level id as it is; none (or
    empty) gives ``a2a-<number>``. :class:`Refused` naming the id otherwise (a ``sub-`` id
    included: children are opened only by their parents)."""
    if not context_id:
        return f"{CONTEXT_PREFIX}{number}"
    try:
        return check_top_level_session(context_id)
    except ValueError as exc:
        raise Refused(f"contextId {context_id[:80]!r} cannot name a session: {exc}") from None


def context_number(sessions: Iterable[str]) -> int:
    """The largest ``n`` of the ``a2a-<n>`` ids among ``sessions`` (0 if none): new contexts
    count on from it, so no new one reuses a stored session."""
    found = 0
    for session in sessions:
        match = _NUMBERED.fullmatch(session)
        if match is not None:
            found = max(found, int(match.group(1)))
    return found


def skill_of(metadata: Mapping[str, Any] | None, agents: Sequence[str]) -> str | None:
    """The agent profile the message's ``metadata.skill`` names (None: not given, the
    session's own or ``default``). :class:`Refused` naming it when it is not a profile."""
    if not metadata or "skill" not in metadata:
        return None
    skill = metadata["skill"]
    if not isinstance(skill, str) or skill not in agents:
        shown = repr(skill)[:80]
        raise Refused(
            f"metadata.skill {shown} is not a skill of this agent (its skills: {', '.join(agents)})"
        )
    return skill


def approval_text(request: ApprovalRequested) -> str:
    """The ``INPUT_REQUIRED`` status text: who waits, for which call, and how to answer."""
    arguments = cap_chars(request.arguments, SHOWN_ARGUMENTS)
    return (
        f"session {request.session} waits for a person: call_id {request.call_id}, tool "
        f"{request.tool}, arguments {arguments}. Answer with a data part "
        f'{{"call_id": {request.call_id}, "approve": true}} or '
        f'{{"call_id": {request.call_id}, "approve": false, "reason": "..."}}'
    )


def due_text(due: Sequence[ApprovalRequested]) -> str:
    """The calls that wait, as an error names them: ``call_id 3 (tool deploy of s)``."""
    if not due:
        return "no call of this task waits for a person now"
    return "the calls due: " + ", ".join(
        f"call_id {r.call_id} (tool {r.tool} of {r.session})" for r in due
    )


def _whole(value: Any) -> int:
    """A data part's ``call_id``: a whole number (``1.0`` is ``1``: data parts carry doubles)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    return check_call_id(value)


def decision_of(data: Any, due: Sequence[ApprovalRequested]) -> tuple[Decision, str]:
    """The decision a follow-up's data part holds, and the session of its call.

    ``data`` must be ``{"call_id": N, "approve": true|false, "reason": "..."}`` (``reason``
    needed to decline, kept as the note when approving) and ``call_id`` one of ``due``'s.
    :class:`Refused` otherwise, naming what is wrong and the calls that are due.
    """
    try:
        check_value(data)
    except OutOfBounds as exc:
        raise Refused(f"the data part is out of bounds: {exc.detail}; {due_text(due)}") from None
    if not isinstance(data, dict):
        raise Refused(f"the decision must be a data part object; {due_text(due)}")
    unknown = sorted(set(data) - {"call_id", "approve", "reason"})
    if unknown:
        raise Refused(f"unknown field {unknown[0][:40]!r} in the decision; {due_text(due)}")
    try:
        call_id = _whole(data.get("call_id"))
    except (TypeError, ValueError) as exc:
        raise Refused(f"call_id: {exc}; {due_text(due)}") from None
    approve = data.get("approve")
    if not isinstance(approve, bool):
        raise Refused(f'"approve" must be true or false; {due_text(due)}')
    reason = data.get("reason", "")
    try:
        reason = "" if reason is None else decision_text(reason, "the reason")
    except (TypeError, ValueError) as exc:
        raise Refused(f"{exc}; {due_text(due)}") from None
    if not approve and not reason.strip():
        raise Refused(f'a decline needs a "reason" (the model reads it); {due_text(due)}')
    for request in due:
        if request.call_id == call_id:
            return Decision(call_id, approve, reason), request.session
    raise Refused(f"call_id {call_id} does not wait for a person in this task; {due_text(due)}")


def event_update(event: TurnEvent, session: str) -> Update | None:
    """What ``event`` (of ``session``'s family) tells the task's client; None: nothing."""
    match event:
        case TurnStarted(session=s, agent=agent) if s == session:
            return Update(WORKING, f"turn of {s} started (agent {agent})")
        case SubagentStarted(child=child, agent=agent, background=background):
            where = " in the background" if background else ""
            return Update(WORKING, f"subagent {child} started{where} (agent {agent})")
        case SubagentFinished(child=child, completed=completed, reason=reason):
            how = "completed" if completed else f"failed ({reason.value if reason else ''})"
            return Update(WORKING, f"subagent {child} {how}")
        case ApprovalRequested():
            return Update(INPUT_REQUIRED, approval_text(event))
        case ApprovalSettled(session=s, call_id=call_id, approved=approved):
            how = "approved" if approved else "declined"
            return Update(WORKING, f"call_id {call_id} of {s} {how}")
        case TextDelta(session=s, text=text) if s == session:
            return Update(WORKING, artifact=text, append=True)
        case _:
            return None


def outcome_update(outcome: TurnOutcome) -> Update:
    """How the turn's outcome ends its task: ``COMPLETED`` with the answer as the artifact
    (and a typed output as data), ``CANCELED``, or ``FAILED`` with ``<reason>: <detail>``."""
    if isinstance(outcome, TurnCompleted):
        return Update(COMPLETED, "", artifact=outcome.content, data=outcome.output)
    assert isinstance(outcome, TurnFailed)
    text = f"{outcome.reason.value}: {outcome.detail}"
    if outcome.reason is FailReason.CANCELLED:
        return Update(CANCELED, text)
    return Update(FAILED, text)
