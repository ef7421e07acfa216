"""Turn events: what subscribers see of every session's work, children's included."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from msgspec import field

from messages.base import Message
from messages.chat import Usage
from messages.ids import CallId, SessionId
from messages.turns import FailReason

__all__ = [
    "ApprovalRequested",
    "ApprovalSettled",
    "Compacted",
    "CompactionFailed",
    "JobSkipped",
    "McpServerDown",
    "McpServerUp",
    "MemoryWarning",
    "ModelAnswered",
    "ModelRequestSent",
    "RuntimeEvent",
    "SubagentFinished",
    "SubagentStarted",
    "TextDelta",
    "ToolCallFinished",
    "ToolCallStarted",
    "ToolProgress",
    "ToolWorkerLost",
    "TurnEnded",
    "TurnEvent",
    "TurnStarted",
]


def _now() -> datetime:
    return datetime.now(UTC)


class _Event(Message, frozen=True, kw_only=True):
    at: datetime = field(default_factory=_now)


class TurnStarted(_Event, frozen=True):
    """``session`` began a turn on ``slot``, as agent profile ``agent``; ``slot`` is None
    when the profile's server has no slots (the ``openai`` backend)."""

    session: SessionId
    slot: int | None
    agent: str = "default"


class ModelRequestSent(_Event, frozen=True):
    """``session`` sent its model request number ``step`` (from 1) of this turn.

    ``slot`` is the slot the session asks for (the one of its last answer, or its pool's first);
    the model service may run it on another free slot of the pool, which
    :class:`ModelAnswered` names. None when the profile's server has no slots (the
    ``openai`` backend).
    """

    session: SessionId
    slot: int | None
    step: int


class ModelAnswered(_Event, frozen=True):
    """The model answered ``session``'s request ``step``; ``tools`` names the calls it made.

    ``slot`` is the slot the request ran on; ``slot_wait_s`` the seconds it waited for it.
    """

    session: SessionId
    step: int
    content: str | None
    tools: tuple[str, ...] = ()
    slot: int | None = None
    slot_wait_s: float = 0.0
    usage: Usage = Usage()
    """The tokens of this one request (zero if the server did not say)."""


class TextDelta(_Event, frozen=True):
    """A piece of ``session``'s answer ``text``, as a streamed answer is written
    (``model.stream``); the pieces of one answer, in order, make its text."""

    session: SessionId
    text: str


class ToolCallStarted(_Event, frozen=True):
    """``session`` started its tool call ``call_id``."""

    session: SessionId
    call_id: CallId
    name: str


class ToolCallFinished(_Event, frozen=True):
    """``session``'s tool call ``call_id`` has its result; ``denied`` if it was refused,
    ``untrusted`` if the result came from an untrusted source (an MCP server or port tool
    marked untrusted, a child that read untrusted data)."""

    session: SessionId
    call_id: CallId
    name: str
    denied: bool = False
    untrusted: bool = False


class ToolWorkerLost(_Event, frozen=True):
    """The port replaced a worker: the tool ``name``, running ``session``'s call ``call_id``,
    was told to stop (the call outlived ``port.timeout_s``, or its turn was cancelled) and did
    not return. Its thread is abandoned and a new worker took its place; ``stuck`` counts the
    runtime's abandoned tool threads that have not returned yet."""

    session: SessionId
    call_id: CallId
    name: str
    stuck: int


class ToolProgress(_Event, frozen=True):
    """``session``'s tool call ``call_id`` (an MCP tool, ``name``) reported progress: its
    server's ``notifications/progress``, ``progress`` of ``total`` (None: unknown), with
    ``message`` if it said one."""

    session: SessionId
    call_id: CallId
    name: str
    progress: float
    total: float | None = None
    message: str | None = None


class SubagentStarted(_Event, frozen=True):
    """``session`` (the parent) spawned ``child`` for its call ``call_id``; the child runs
    agent profile ``agent``."""

    session: SessionId
    call_id: CallId
    child: SessionId
    agent: str = "default"
    background: bool = False
    """The call runs in the background: it resolved at once, and the outcome comes later as
    a user message named ``subagent``."""

    @property
    def parent(self) -> str:
        """The parent session: the same as ``session``."""
        return self.session


class SubagentFinished(_Event, frozen=True):
    """``child`` answered ``session``'s call ``call_id``: completed, or failed for ``reason``;
    ``detail`` says why it failed (empty for a local child that completed); a remote child's
    names the remote agent's URL and what went wrong."""

    session: SessionId
    call_id: CallId
    child: SessionId
    completed: bool
    reason: FailReason | None = None
    detail: str = ""

    @property
    def parent(self) -> str:
        """The parent session: the same as ``session``."""
        return self.session


class JobSkipped(_Event, frozen=True):
    """Scheduled job ``job`` did not run on ``session`` because ``held`` ids were busy."""

    session: SessionId
    job: str
    held: tuple[SessionId, ...]


class TurnEnded(_Event, frozen=True):
    """``session``'s turn ended: completed, or failed for ``reason``. A typed turn that
    completed carries its validated ``output`` as JSON data (objects as dicts: what
    ``TurnCompleted.output`` encodes to); None for a text turn."""

    session: SessionId
    completed: bool
    reason: FailReason | None = None
    detail: str = ""
    output: Any = None


class Compacted(_Event, frozen=True):
    """``session``'s history was summarised: ``before`` and ``after`` are transcript chars."""

    session: SessionId
    before: int
    after: int


class CompactionFailed(_Event, frozen=True):
    """Compacting ``session`` failed; the turn's outcome stands and the history is kept."""

    session: SessionId
    detail: str


class MemoryWarning(_Event, frozen=True):
    """Building ``session``'s baseline, the memory file was found damaged or too long; ``detail``
    says which. The baseline used what could be read. Each version of the file warns once."""

    session: SessionId
    detail: str


class ApprovalRequested(_Event, frozen=True):
    """``session``'s call ``call_id`` of ``tool`` waits for a person's yes or no (published once
    the waiting call is stored). ``arguments`` is the model's JSON text, as
    ``ToolCall.arguments``; ``untrusted``: the session had read untrusted data, so the
    arguments may come from injected text."""

    session: SessionId
    call_id: CallId
    tool: str
    arguments: str
    untrusted: bool = False


class ApprovalSettled(_Event, frozen=True):
    """A person (or the ``approvals.timeout_s``) decided ``session``'s call ``call_id``: the
    approval's ``note``, or the decline's ``reason`` (what the model reads; the timeout's is
    ``no decision within <timeout_s> s``). Both None in events stored before they existed."""

    session: SessionId
    call_id: CallId
    approved: bool
    note: str | None = None
    reason: str | None = None


TurnEvent = (
    TurnStarted
    | ModelRequestSent
    | ModelAnswered
    | TextDelta
    | ToolCallStarted
    | ToolCallFinished
    | ToolWorkerLost
    | ToolProgress
    | SubagentStarted
    | SubagentFinished
    | TurnEnded
    | JobSkipped
    | Compacted
    | CompactionFailed
    | MemoryWarning
    | ApprovalRequested
    | ApprovalSettled
)
"""Every event a subscriber can see."""


class McpServerUp(_Event, frozen=True):
    """The MCP server ``server`` is up and lists ``tools`` (the joined names ``files__read``
    new sessions are offered); ``skipped`` names the server's tools left out (a joined name
    that is no valid tool name, or an input schema that is no valid JSON schema). It names a
    server, not a session."""

    server: str
    tools: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()


class McpServerDown(_Event, frozen=True):
    """The MCP server ``server`` could not start, or stopped; ``detail`` says why. Its calls
    are answered at once that it is not running while loopd starts it again."""

    server: str
    detail: str


RuntimeEvent = McpServerUp | McpServerDown
"""The events about the runtime itself rather than a session (subscribers see them too)."""
