"""Turns and subagents: the requests a user or a session sends, and their answers."""

from __future__ import annotations

import enum
from typing import Any

from messages.base import Message
from messages.chat import Usage
from messages.ids import CallId, SessionId, check_text, check_top_level_session
from messages.tools import ToolSpec

__all__ = [
    "FailReason",
    "StartTurn",
    "SubagentCompleted",
    "SubagentFailed",
    "SubagentRequest",
    "SubagentResult",
    "TurnCompleted",
    "TurnFailed",
    "TurnOutcome",
]


class FailReason(enum.StrEnum):
    """Why a turn (or a subagent) ended without an answer."""

    TURN_LIMIT = "turn_limit"
    """The model still asked for tools after ``loop.max_steps`` requests."""
    MODEL_ERROR = "model_error"
    """The model endpoint failed or answered something unusable."""
    BUSY = "busy"
    """Someone already holds the session."""
    CANCELLED = "cancelled"
    """The turn was cancelled, or the runtime stopped under it."""
    CRASHED = "crashed"
    """The session's actor failed or was stopped during the turn."""
    STORE_ERROR = "store_error"
    """The session could not be created, opened or written."""
    SPAWN_ERROR = "spawn_error"
    """A new session's baseline could not be built (for example, the memory source failed)."""
    TIMEOUT = "timeout"
    """A child outlived ``loop.child_timeout_s``; it is cancelled."""
    BUDGET = "budget"
    """The top-level turn and its children spent ``loop.token_budget`` tokens; no further model
    request of that family is sent."""
    WRONG_AGENT = "wrong_agent"
    """The turn named an agent profile that is not the stored session's, or the session's
    profile is no longer configured; nothing was stored."""
    OUTPUT_INVALID = "output_invalid"
    """A typed session's model gave no valid ``final_answer`` in ``loop.output_retries`` + 1
    tries, or a typed child's answer was longer than ``loop.tool_result_cap``."""
    WRONG_OUTPUT = "wrong_output"
    """The turn named an output schema that is not the stored session's (or the session has
    none); nothing was stored. A turn that names none keeps the session's."""
    REMOTE_ERROR = "remote_error"
    """A remote (A2A) child's agent failed its task, asked for input, or could not be reached
    or understood; the detail names its URL and what went wrong."""


class StartTurn(Message, frozen=True):
    """Run one turn of ``session`` on ``text``; creates the session if it is new.

    The answer (:class:`TurnCompleted` or :class:`TurnFailed`) goes to the ``reply_to`` address,
    when one is given, and is also visible to event subscribers as a ``TurnEnded`` event.
    ``trace`` is the caller's trace context as text (W3C ``traceparent``), for tracing.

    Checked when built or decoded, before anything is stored: ``session`` must not be a child's
    id (``sub-...``: children are opened only by their parents), ``text`` must be a ``str`` and
    ``speaker`` a ``str`` or None (``TypeError``), both valid Unicode text (``ValueError``).
    """

    session: SessionId
    text: str
    speaker: str | None = None
    reply_to: str | None = None
    agent: str | None = None
    """The agent profile of a new session (None: ``default``); a stored session keeps its own,
    and naming another one fails the turn with ``WRONG_AGENT``."""
    trace: dict[str, str] | None = None
    output: ToolSpec | None = None
    """The ``final_answer`` tool of a typed turn (``actors.core.output.final_answer_spec``):
    a new session is created with it; a stored one must have been (else ``WRONG_OUTPUT``).
    None: a new session takes its profile's, a stored one keeps its own."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_top_level_session(self.session)
        check_text(self.text, "the turn text")
        check_text(self.speaker, "the speaker", optional=True)


class TurnCompleted(Message, frozen=True, repr_omit_defaults=True):
    """A turn ended with the model's answer ``content``.

    ``truncated`` is true when that answer was cut off at ``model.max_tokens`` and
    ``model.on_length`` is ``"keep"`` (its repr shows it only then). ``usage`` sums the tokens of
    every model request of the turn and of every child's turn it waited for, their children's
    included.
    """

    session: SessionId
    content: str
    truncated: bool = False
    usage: Usage = Usage()
    output: Any = None
    """A typed session's answer (``final_answer``): the validated value as plain JSON data
    (an object, or the inner value of a schema wrapped as ``value``); ``content`` is its JSON
    text. The facades decode it to the Python type the turn or the profile gave. None for an
    untyped turn."""


class TurnFailed(Message, frozen=True):
    """A turn ended without an answer; ``detail`` says what happened, for a person. ``usage``
    is what the turn spent before it ended, summed as :class:`TurnCompleted`'s (zero for a turn
    the Context refused or answered for a session that could not say)."""

    session: SessionId
    reason: FailReason
    detail: str = ""
    usage: Usage = Usage()


TurnOutcome = TurnCompleted | TurnFailed
"""How a turn ended."""


class SubagentRequest(Message, frozen=True):
    """A session asks the Context to run ``task`` in a child session for its call ``call_id``.

    ``untrusted`` is the parent's flag at the spawn: the child starts with it (SPEC 5 and the
    guide's untrusted rule), so what the flag denies the parent is denied the child too.
    ``trace`` is the trace context of that call (W3C ``traceparent``), so the child's turn is
    traced under it.
    """

    parent: SessionId
    call_id: CallId
    task: str
    untrusted: bool = False
    agent: str = "default"
    """The agent profile the child runs (the ``agent`` argument of the call)."""
    trace: dict[str, str] | None = None
    background: bool = False
    """The call runs in the background: answered at once, the outcome reported later."""


class SubagentCompleted(Message, frozen=True):
    """The child's turn completed; ``summary`` is its neutralised, capped answer."""

    parent: SessionId
    call_id: CallId
    child: SessionId
    summary: str
    untrusted: bool
    usage: Usage = Usage()
    """What the child's turn spent, its own children's included."""


class SubagentFailed(Message, frozen=True):
    """The child could not be run, or its turn failed (``TURN_LIMIT`` included)."""

    parent: SessionId
    call_id: CallId
    child: SessionId
    reason: FailReason
    untrusted: bool
    detail: str = ""
    usage: Usage = Usage()
    """What the child's turn spent before it failed (zero when it could not say: it crashed,
    or outlived its time limit)."""


SubagentResult = SubagentCompleted | SubagentFailed
"""What the Context sends the parent session for its pending ``subagent`` call."""
