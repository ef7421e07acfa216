"""What a :class:`~actors.core.turn.Turn` asks its session actor to do: its effects.

Each input of a turn returns a list of these; ``SessionActor._carry_out`` turns each into one
message (``Persist`` into ``AppendMessages``, ``RequestModel`` into ``ModelRequest``...). Kept
apart from the machine, as h11 keeps its events apart from its connection: the vocabulary a
shell must know, without the rules that produce it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from messages import ChatMessage, StoredApproval, TurnEvent, TurnOutcome

__all__ = [
    "Announce",
    "AskApproval",
    "CallPort",
    "CancelModel",
    "CancelPort",
    "Compact",
    "DropWaiting",
    "Effect",
    "Emit",
    "Finish",
    "ForgetApprovals",
    "Persist",
    "RequestModel",
    "Spawn",
    "TurnPhase",
    "WriteMemory",
]


class TurnPhase(enum.Enum):
    """What a turn waits for now (the machine's own state, shared with its step modules)."""

    IDLE = enum.auto()
    SAVING = enum.auto()  # waiting for a Persist; then the turn's ``_after_save`` runs
    ASKING = enum.auto()  # waiting for the model
    CALLING = enum.auto()  # waiting for tool results
    SUMMARISING = enum.auto()  # waiting for the compaction summary
    COMPACTING = enum.auto()  # waiting for the store to compact
    DONE = enum.auto()


@dataclass(frozen=True)
class Persist:
    """Append ``messages`` and the session's counters to the store; answer ``persisted``."""

    request_id: int
    messages: tuple[ChatMessage, ...]
    reports: tuple[str, ...] = ()
    """Background children whose reports ``messages`` deliver (their rows go with them)."""
    running: bool | None = None
    """True: the turn's first write (it is stored as running); False: its last (it ended)."""


@dataclass(frozen=True)
class Compact:
    """Replace the stored live history by ``summary`` (old rows kept, marked compacted)."""

    request_id: int
    summary: ChatMessage


@dataclass(frozen=True)
class RequestModel:
    """Send a model request; answer ``model_answer`` or ``model_error`` with ``request_id``."""

    request_id: int
    slot: int
    messages: tuple[ChatMessage, ...]
    prefer_slot: bool = False
    """Whether ``slot`` caches the session's prompt, so the request should go there if free."""


@dataclass(frozen=True)
class CallPort:
    """Run port tool ``name`` for call ``call_id``; answer ``tool_result``."""

    call_id: int
    name: str
    arguments: str


@dataclass(frozen=True)
class CancelModel:
    """The turn no longer waits for model request ``request_id``: stop it (close its
    connection, so the server stops generating)."""

    request_id: int


@dataclass(frozen=True)
class CancelPort:
    """The turn no longer waits for port call ``call_id``: tell the tool."""

    call_id: int


@dataclass(frozen=True)
class Spawn:
    """Ask the Context to run ``task`` in ``child``; answer ``subagent_result``."""

    call_id: int
    child: str
    task: str
    agent: str = "default"
    background: bool = False
    """Answered at once by the Context; the outcome is reported later."""


@dataclass(frozen=True)
class WriteMemory:
    """Ask the Context to append ``text`` to memory for call ``call_id``; answer ``tool_result``."""

    call_id: int
    text: str


@dataclass(frozen=True)
class Emit:
    """Publish ``event`` to subscribers (``tell``) and hand it to the tracer (``trace``)."""

    event: TurnEvent
    tell: bool = True
    trace: bool = True
    """False where the tracer has it already: a ``TurnStarted`` is traced when the turn
    starts and told once it is stored as running (its spans open before its requests')."""


@dataclass(frozen=True)
class Finish:
    """The turn, compaction included, is over with ``outcome``."""

    outcome: TurnOutcome


@dataclass(frozen=True)
class AskApproval:
    """Store ``approval``, a call that waits for a person; answer ``persisted``."""

    request_id: int
    approval: StoredApproval
    spawns: bool = False
    """The held work is a ``Spawn`` (``StoreApproval.spawns``)."""
    background: bool = False


@dataclass(frozen=True)
class Announce:
    """Tell the Context that ``approval`` is stored and waits: it publishes the request."""

    approval: StoredApproval


@dataclass(frozen=True)
class ForgetApprovals:
    """The calls ``call_ids`` have their results stored: the store forgets their requests."""

    call_ids: tuple[int, ...]


@dataclass(frozen=True)
class DropWaiting:
    """The turn ended while ``call_ids`` waited for a person: the Context drops the requests."""

    call_ids: tuple[int, ...]


Effect = (
    Persist
    | Compact
    | RequestModel
    | CallPort
    | CancelModel
    | CancelPort
    | Spawn
    | WriteMemory
    | Emit
    | Finish
    | AskApproval
    | Announce
    | ForgetApprovals
    | DropWaiting
)
"""Anything a :class:`Turn` asks its actor to do."""
