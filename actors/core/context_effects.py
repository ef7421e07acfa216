"""What the Context's decisions (:class:`~actors.core.context_state.ContextState`) ask its
actor to do: its effects.

Most are one message to one place (:class:`Reply`, :class:`ToSession`, :class:`ToStore`,
:class:`ToModel`, :class:`Emit`). Three touch a session actor the shell holds
(:class:`StartSession`, :class:`TellSession`, :class:`StopSession`), three a timer
(:class:`StartTimer`, :class:`CancelTimer`, :class:`ArmSweep`), two the memory source
(:class:`BuildBaseline`, :class:`UpdateMemory`). :class:`Report` hands a background child's
outcome back to the state.

Two are questions the shell answers at once, before it carries out the next effect, by calling
the state back: :class:`BuildBaseline` (``baseline_built`` or ``baseline_failed``) and
:class:`StartSession` (``started`` or ``start_failed``). A :class:`TellSession` to an actor that
has just died is answered ``undelivered``. The state never sees a thread, a ref's type or the
memory file: a session actor is an opaque ``ref`` it got from ``started``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from actors.core.approvals import ArmApprovalTimer, CancelApprovalTimer
from actors.core.turn_effects import Emit
from messages import RunTurn, SessionRecord, SubagentFinished, ToolSpec

__all__ = [
    "ArmApprovalTimer",
    "ArmSweep",
    "BuildBaseline",
    "CancelApprovalTimer",
    "CancelTimer",
    "ContextEffect",
    "Emit",
    "IfGone",
    "Reply",
    "Report",
    "StartSession",
    "StartTimer",
    "StopSession",
    "TellSession",
    "ToModel",
    "ToSession",
    "ToStore",
    "UpdateMemory",
]


@dataclass(frozen=True)
class Reply:
    """Tell ``message`` to a waiter's ``reply_to`` address (a user, a job, a session)."""

    to: str | None
    message: Any


@dataclass(frozen=True)
class ToSession:
    """Tell ``message`` to ``session``'s address (a parent's pending call, a denial)."""

    session: str
    message: Any


@dataclass(frozen=True)
class ToStore:
    """Tell ``message`` to the store."""

    message: Any


@dataclass(frozen=True)
class ToModel:
    """Tell ``message`` to the model service (a request the budget let through, its cancel)."""

    message: Any


@dataclass(frozen=True)
class BuildBaseline:
    """Question: build a new session's baseline for profile ``agent`` (reads memory, emitting
    what the memory source reports). Answer ``baseline_built(effect, baseline)``, or
    ``baseline_failed(effect, detail)`` if anything raised."""

    session: str
    agent: str
    output: ToolSpec | None = None
    """The ``final_answer`` tool the baseline lists last (a typed session); None: untyped."""
    known_only: bool = False
    """Build it only if that reads nothing (no memory file, or one unchanged since it was
    last read; a profile without ``system_file``), for a session that may be stored already:
    else the answer is ``baseline_unknown(effect)``, and the session is opened without one."""


@dataclass(frozen=True)
class StartSession:
    """Question: start a session actor on ``record`` as incarnation ``incarnation``. Answer
    ``started(effect, ref)``, or ``start_failed(effect, detail)`` if it could not start. The
    state then tells it ``run``."""

    record: SessionRecord
    incarnation: int
    run: RunTurn


class IfGone(enum.Enum):
    """What the state does when a :class:`TellSession` finds its actor dead."""

    NOTHING = enum.auto()
    """Its ``SessionCrashed`` or ``SessionStopped`` is on its way, and settles the hold."""
    REOPEN = enum.auto()
    """It was stopped from outside before this turn: rebuild it from the store."""
    RELEASE = enum.auto()
    """A cancel that cannot reach it: let the hold go here."""


@dataclass(frozen=True)
class TellSession:
    """Tell ``message`` to the live actor ``ref`` (incarnation ``incarnation`` of
    ``session``). Delivered, carry out ``then``; if the actor is dead, ask the state
    ``undelivered(effect)`` what to do instead (``otherwise`` and what ``if_gone`` says)."""

    session: str
    incarnation: int
    ref: object
    message: Any
    then: tuple[ContextEffect, ...] = ()
    if_gone: IfGone = IfGone.NOTHING
    otherwise: tuple[ContextEffect, ...] = ()


@dataclass(frozen=True)
class StopSession:
    """Stop the actor ``ref`` without waiting (passivation, or a session after a store
    error)."""

    ref: object


@dataclass(frozen=True)
class StartTimer:
    """In ``seconds``, tell the Context ``ChildTimedOut(child, spawn)``."""

    child: str
    spawn: int
    seconds: float


@dataclass(frozen=True)
class CancelTimer:
    """``child``'s timer is not needed any more (``fired``: it went off; only forget it)."""

    child: str
    fired: bool = False


@dataclass(frozen=True)
class ArmSweep:
    """In ``seconds``, tell the Context a ``Tick`` (the one pending sweep timer replaced)."""

    seconds: float


@dataclass(frozen=True)
class UpdateMemory:
    """Tell the memory source that child ``session`` ended after ``turns`` turns; a failure
    there is logged, nothing else."""

    session: str
    turns: int


@dataclass(frozen=True)
class Report:
    """Question: background ``child`` of ``parent`` (its call ``call_id``) ended; ``text`` is
    what the parent is told (None: it was cancelled with an ancestor, nothing is). Answer
    ``report(parent, child, call_id, text, untrusted)``: the state stores it, then delivers."""

    parent: str
    child: str
    call_id: int
    text: str | None
    untrusted: bool = False
    finished: SubagentFinished | None = None
    """Its ``SubagentFinished``, told once the report is stored (SPEC 18)."""


ContextEffect = (
    Reply
    | ToSession
    | ToStore
    | ToModel
    | Emit
    | BuildBaseline
    | StartSession
    | TellSession
    | StopSession
    | StartTimer
    | CancelTimer
    | ArmSweep
    | UpdateMemory
    | Report
    | ArmApprovalTimer
    | CancelApprovalTimer
)
"""Anything a :class:`~actors.core.context_state.ContextState` asks its actor to do."""
