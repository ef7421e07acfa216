"""Approvals: which calls wait for a person, and the table of those that wait (SPEC 11).

Pure parts only. :class:`ApprovalPolicy` says whether a tool's calls wait (``[approvals]
tools``, ``[agents.NAME] approve``, ``@port_tool(..., approval=True)``); :class:`ApprovalBook`
is the Context's table of the calls waiting now, each stored before it is announced. The turn's
side is ``actors.core.approval_steps``, the Context's ``actors.core.approval_desk``.

The texts a person's decision leaves for the model are fixed: a declined call answers
``denial_message(DenyReason.DECLINED, reason)``; the timeout declines with
``no decision within <timeout_s> s``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Final

from actors.core.bounded import INT64_MAX, check_text
from actors.core.config import Config
from actors.core.text import cap_chars, neutralise
from messages import (
    ApprovalRequested,
    DenyReason,
    StoredApproval,
    ToolCall,
    denial_message,
)
from messages.ids import CHILD_PREFIX

__all__ = [
    "BACKGROUND_CUT_OFF",
    "MAX_DECISION_CHARS",
    "NOT_WAITING",
    "PAST_DEADLINE",
    "ApprovalBook",
    "ApprovalPolicy",
    "ArmApprovalTimer",
    "CancelApprovalTimer",
    "Waiting",
    "approval_policies",
    "check_call_id",
    "decision_text",
    "declined_text",
    "dropped_at_start",
    "past_deadline",
    "past_deadline_detail",
    "shell_refusal",
    "stored_approval",
    "stored_timeout_s",
    "timeout_reason",
]

NOT_WAITING = "call {call_id} of session {session} is not waiting for a decision"
"""The ``ApprovalRefused.detail`` of a decision for a call that is not waiting (never was,
settled already, or cancelled)."""

BACKGROUND_CUT_OFF = (
    "call {call_id} of session {session} waits in a background subagent that a stop cut off: "
    "the next start drops it and the child reports failed, so a decision here would never be "
    "carried out; see docs/runbook.md#approval-of-a-cut-off-background-child"
)
"""What ``loopd approve`` / ``deny`` print (exit 1) for a stored call of a background child:
no parent's call waits for it, so the next start drops it (:func:`dropped_at_start`)."""

PAST_DEADLINE = (
    "call {call_id} of session {session} was declined for its timeout ({reason}): a decision "
    "past its deadline is not carried out; see docs/runbook.md#approval-past-its-deadline"
)
"""The ``ApprovalRefused.detail`` of a decision that comes past the call's stored deadline:
the deadline is binding, so the call is declined with the timeout's reason (by the runtime's
timer, or at the next start) whether or not a runtime ran meanwhile."""


MAX_DECISION_CHARS: Final = 2_000
"""The most characters a person's reason (``deny``) or note (``approve``) may have. A reason
goes to the model as a tool result (``Denied: a person declined this call: <reason>.``): a
person's few words, never a document, so the cap is far below ``loop.tool_result_cap``
(16,000 by default) and a reason can never crowd the model's context; every door refuses a
longer one, naming the cap."""


def check_call_id(value: object) -> int:
    """``value`` as a call id a decision may name: an ``int`` (``TypeError`` naming it for a
    bool, a float such as ``1.0``, a text such as ``"1"``), from 1 to the largest 64-bit
    integer (``ValueError`` naming it otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"call_id must be an int, not {type(value).__name__} ({value!r:.40})")
    if not 1 <= value <= INT64_MAX:
        shown = str(value) if value.bit_length() <= 128 else f"a {value.bit_length()}-bit integer"
        raise ValueError(f"call_id must be a whole number from 1 to {INT64_MAX}, not {shown}")
    return value


def decision_text(value: object, what: str) -> str:
    """A person's reason or note (``what`` names it) as a door takes it: a ``str``
    (``TypeError``), valid Unicode and at most :data:`MAX_DECISION_CHARS` characters
    (``ValueError``: :class:`~actors.core.bounded.OutOfBounds`, naming ``what``), then
    neutralised as any text that goes to the model (chat-template tokens, terminal escapes
    and control characters but newline and tab removed)."""
    return neutralise(check_text(value, what, max_chars=MAX_DECISION_CHARS))


def timeout_reason(timeout_s: float) -> str:
    """The reason the timeout declines a call with: ``no decision within 604800 s``."""
    return f"no decision within {timeout_s:g} s"


def dropped_at_start(entry: StoredApproval) -> bool:
    """Whether the next ``Runtime.start`` drops ``entry`` instead of holding its turn: a
    background child's call (no parent's call waits for it; the child reports failed)."""
    return entry.background and entry.request.session.startswith(CHILD_PREFIX)


def past_deadline(entry: StoredApproval, now: datetime) -> bool:
    """Whether ``entry``'s deadline has passed at ``now``: it is declined for its timeout."""
    return entry.deadline <= now


def past_deadline_detail(session: str, call_id: int, timeout_s: float) -> str:
    """The :data:`PAST_DEADLINE` detail of ``session``'s call ``call_id``."""
    reason = timeout_reason(timeout_s)
    return PAST_DEADLINE.format(call_id=call_id, session=session, reason=reason)


def stored_timeout_s(entry: StoredApproval) -> float:
    """The ``approvals.timeout_s`` ``entry``'s deadline was set with (what a shell tells of
    it: the shell's own configuration may differ from the runtime's)."""
    return (entry.deadline - entry.request.at).total_seconds()


def shell_refusal(
    entry: StoredApproval | None, session: str, call_id: int, now: datetime
) -> str | None:
    """Why a decision from outside any runtime (the CLI) at ``now`` for ``session``'s call
    ``call_id``, stored as ``entry`` (None: no such row), would never be carried out, as the
    ``ApprovalRefused`` detail; None if it may be recorded."""
    if entry is None or entry.approved is not None:
        return NOT_WAITING.format(call_id=call_id, session=session)
    if dropped_at_start(entry):
        return BACKGROUND_CUT_OFF.format(call_id=call_id, session=session)
    if past_deadline(entry, now):
        return past_deadline_detail(session, call_id, stored_timeout_s(entry))
    return None


def declined_text(reason: str) -> str:
    """What a declined call answers the model: ``Denied: a person declined this call: ...``.
    The reason is neutralised and capped at :data:`MAX_DECISION_CHARS` here too (a reason
    stored before the doors checked it, or told to the Context by hand, is no exception)."""
    return denial_message(DenyReason.DECLINED, cap_chars(neutralise(reason), MAX_DECISION_CHARS))


@dataclass(frozen=True)
class ApprovalPolicy:
    """The tools whose calls wait for a person in one profile's sessions, and how long."""

    names: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()
    """What each pattern ending in ``*`` begins with (``github__`` of ``github__*``; ``""`` of
    ``*``, every tool): a tool whose name begins so waits."""
    timeout_s: float = 604800.0
    checks: Mapping[str, Callable[[str], str | None]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    """The port tools' argument checks by name (raw JSON in, a denial's detail or None out):
    a call that would be denied anyway is denied before anyone is asked."""

    @classmethod
    def of(
        cls,
        names: Iterable[str],
        timeout_s: float,
        checks: Mapping[str, Callable[[str], str | None]] | None = None,
    ) -> ApprovalPolicy:
        """The policy for ``names``; a name ending in ``*`` is a prefix pattern (the config
        refuses any other ``*``)."""
        names = tuple(names)
        exact = {n for n in names if not n.endswith("*")}
        prefixes = tuple(sorted({n[:-1] for n in names if n.endswith("*")}))
        return cls(frozenset(exact), prefixes, timeout_s, MappingProxyType(dict(checks or {})))

    def needs(self, tool: str) -> bool:
        """Whether a call of ``tool`` waits for a person."""
        return tool in self.names or any(tool.startswith(p) for p in self.prefixes)

    def check(self, tool: str, arguments: str) -> str | None:
        """The ``INVALID_ARGUMENTS`` detail of a call of port tool ``tool`` with
        ``arguments``, or None when they are valid (or ``tool`` has no check here)."""
        check = self.checks.get(tool)
        return None if check is None else check(arguments)


def approval_policies(
    config: Config,
    marked: Iterable[str] = (),
    checks: Mapping[str, Callable[[str], str | None]] | None = None,
) -> dict[str, ApprovalPolicy]:
    """Every profile's policy: ``approvals.tools``, the profile's ``approve`` and the port
    tools marked ``approval=True``; ``checks``: the port tools' argument checks."""
    common = (*config.approvals.tools, *marked)
    timeout = config.approvals.timeout_s
    return {
        name: ApprovalPolicy.of((*common, *config.agent(name).approve), timeout, checks)
        for name in config.agent_names()
    }


def stored_approval(
    session: str, call: ToolCall, untrusted: bool, at: datetime, timeout_s: float
) -> StoredApproval:
    """The record of ``call`` waiting from ``at``, with its deadline."""
    request = ApprovalRequested(
        session=session,
        call_id=call.id,
        tool=call.name,
        arguments=call.as_written,
        untrusted=untrusted,
        at=at,
    )
    return StoredApproval(request, at + timedelta(seconds=timeout_s))


@dataclass(frozen=True)
class ArmApprovalTimer:
    """A Context effect: tell the Context ``ApprovalTimedOut`` after ``seconds``."""

    session: str
    call_id: int
    seconds: float


@dataclass(frozen=True)
class CancelApprovalTimer:
    """A Context effect: the call was settled or dropped; its timer goes."""

    session: str
    call_id: int


@dataclass
class Waiting:
    """One call waiting for a person. ``live``: its turn runs in this runtime and hears the
    decision; otherwise the turn was cut off (a stop, a crash) and the decision resumes it."""

    entry: StoredApproval
    live: bool = True


@dataclass
class ApprovalBook:
    """The calls waiting for a person now, by session and call id."""

    _waiting: dict[tuple[str, int], Waiting] = field(default_factory=dict)

    def add(self, entry: StoredApproval, *, live: bool = True) -> None:
        """``entry`` waits (it is stored already)."""
        request = entry.request
        self._waiting[(request.session, request.call_id)] = Waiting(entry, live)

    def take(self, session: str, call_id: int) -> Waiting | None:
        """Remove and return the waiting call, or None if it is not waiting: whoever takes it
        settles it, so of two decisions only the first finds it."""
        return self._waiting.pop((session, call_id), None)

    def expired(self, session: str, call_id: int, now: datetime) -> bool:
        """Whether ``session``'s call ``call_id`` waits past its deadline (its timer, armed for
        the deadline, is about to decline it)."""
        waiting = self._waiting.get((session, call_id))
        return waiting is not None and past_deadline(waiting.entry, now)

    def of(self, session: str) -> list[Waiting]:
        """``session``'s waiting calls, in call order."""
        found = [w for (s, _), w in self._waiting.items() if s == session]
        return sorted(found, key=lambda w: w.entry.request.call_id)

    def waits(self, session: str) -> bool:
        """Whether any call of ``session`` waits."""
        return any(s == session for s, _ in self._waiting)

    def pending(self) -> tuple[ApprovalRequested, ...]:
        """Every waiting request, oldest ``at`` first."""
        requests = [w.entry.request for w in self._waiting.values()]
        return tuple(sorted(requests, key=lambda r: (r.at, r.session, r.call_id)))

    def __len__(self) -> int:
        return len(self._waiting)
