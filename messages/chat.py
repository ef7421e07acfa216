"""The conversation a session keeps, and what goes to and comes back from the model."""

from __future__ import annotations

from typing import Any, Literal

from msgspec import field

from messages.base import Message
from messages.ids import CallId, SessionId
from messages.tools import ToolCall, ToolSpec

__all__ = [
    "Baseline",
    "CallDecision",
    "ChatMessage",
    "ModelAnswer",
    "ModelError",
    "ModelReply",
    "ModelRequest",
    "ProposedCall",
    "RequestOptions",
    "SlotPool",
    "Usage",
]

Role = Literal["system", "user", "assistant", "tool"]

SlotPool = Literal["main", "background"]
"""The two slot pools: top-level sessions use ``main``, children ``background``."""


class Usage(Message, frozen=True):
    """Tokens one or more model requests cost, as the server reported them.

    ``cached_tokens`` are the prompt tokens the server reused from its cache (llama.cpp's
    ``timings.cache_n``); ``requests`` counts the requests summed here, every one of them.
    ``unmeasured_requests`` counts those of them whose server reported no usage (or an
    impossible one): their tokens are unknown, counted as zero.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    requests: int = 0
    unmeasured_requests: int = 0
    """Added later: usage stored before it decodes with 0."""


class CallDecision(Message, frozen=True):
    """How a person (or the ``approvals.timeout_s``) decided a call that waited: approved
    with an optional ``note``, or declined for ``reason``."""

    approved: bool
    note: str | None = None
    reason: str | None = None


class ChatMessage(Message, frozen=True):
    """One message of a transcript, in the shape of the chat-completions API.

    ``tool_calls`` is set on assistant messages that call tools; ``tool_call_id`` on tool
    messages; ``name`` is an optional speaker on user messages.
    """

    role: Role
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: CallId | None = None
    name: str | None = None
    usage: Usage | None = None
    """On an assistant message: the tokens of the request that answered it, when the server
    said (stored with it, never sent back)."""
    untrusted: bool = False
    """On a tool message: the result came from an untrusted source (stored, never sent)."""
    decision: CallDecision | None = None
    """On a tool message of a call that waited for a person: how it was decided (stored,
    never sent)."""


class Baseline(Message, frozen=True):
    """What every request of a session starts with: the system prompt and the tools.

    Built once when the session is created and stored with it; byte-stable for the session's
    life, so the server's prompt cache of it stays valid.
    """

    system: str
    tools: tuple[ToolSpec, ...] = ()


class RequestOptions(Message, frozen=True):
    """The request fields an agent profile sets (``[agents.NAME]``); None leaves one out.

    ``model`` replaces ``model.name``; ``extra_body`` is merged into the request body last.
    """

    model: str | None = None
    backend: str | None = None
    """``openai``: leave llama.cpp's ``id_slot`` and ``cache_prompt`` out; anything else
    (``llama.cpp``, None) sends them."""
    stream: bool = False
    """Ask for server-sent events and show the text as it comes (``TextDelta`` events)."""
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] | None = None
    seed: int | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)


class ModelRequest(Message, frozen=True):
    """One chat-completions request of ``session``, to be answered at ``reply_to``.

    The model service sends the request on a free slot of ``pool``: ``slot`` if
    ``prefer_slot`` (the session's prompt is cached there) and it is free.
    ``agent`` is the session's profile and ``options`` the request fields it sets.
    """

    session: SessionId
    request_id: int
    slot: int
    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...]
    reply_to: str
    pool: SlotPool = "main"
    prefer_slot: bool = False
    agent: str = "default"
    options: RequestOptions = field(default_factory=RequestOptions)


class ProposedCall(Message, frozen=True):
    """A tool call as the model proposed it, before the session numbers it."""

    name: str
    arguments: str


class ModelAnswer(Message, frozen=True):
    """The model's answer to request ``request_id``.

    ``slot`` is the slot it ran on and ``slot_wait_s`` how long it waited for that slot to be
    free (None and 0 where the model has no slots).

    ``truncated`` is true when the server stopped it at ``max_tokens`` (``finish_reason:
    "length"``): its text or its tool calls are cut off.
    """

    session: SessionId
    request_id: int
    content: str | None
    tool_calls: tuple[ProposedCall, ...] = ()
    slot: int | None = None
    slot_wait_s: float = 0.0
    usage: Usage = field(default_factory=Usage)
    truncated: bool = False


class ModelError(Message, frozen=True):
    """Request ``request_id`` failed; ``detail`` names the cause.

    ``context_exceeded`` is true when the server refused the prompt as longer than its context
    (llama.cpp's ``exceed_context_size_error``); ``context_tokens`` is that context's size in
    tokens when the server said it.
    """

    session: SessionId
    request_id: int
    detail: str
    context_exceeded: bool = False
    context_tokens: int | None = None
    over_budget: bool = False
    """The request was never sent: its turn's family reached ``loop.token_budget``."""


ModelReply = ModelAnswer | ModelError
"""What a model worker sends back for a :class:`ModelRequest`."""
