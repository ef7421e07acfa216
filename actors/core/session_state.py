"""A session's state as its actor keeps it, and the measures of its transcript.

:class:`SessionState` mirrors what the store holds of a session (its baseline, slot,
transcript, counters and untrusted flag) plus what the server last counted of its prompt. The
functions beside it measure a transcript the way compaction does (:func:`message_chars`,
:func:`estimate_tokens`, :func:`fitting_tail`) and repair one a cut-off turn left without
results (:func:`repair_results`). Nothing here does I/O.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from actors.core.approvals import declined_text
from actors.core.dispatch import ArgumentError, Registry, SpawnChild, child_id
from actors.core.dispatch import dispatch as route_call
from actors.core.text import cap_chars
from messages import (
    Baseline,
    CallDecision,
    ChatMessage,
    DenyReason,
    FailReason,
    SessionRecord,
    StoredApproval,
    StoreFailed,
    ToolCall,
    denial_message,
)

__all__ = [
    "CHARS_PER_TOKEN",
    "TOKENS_PER_MESSAGE",
    "SessionState",
    "estimate_tokens",
    "fitting_tail",
    "message_chars",
    "repair_results",
    "store_failure_reason",
    "stored_decision",
    "unanswered_text",
]

CHARS_PER_TOKEN = 3
"""Characters counted as one token for text the server has not counted yet. Tokenizers make
about 4 characters a token of English prose, fewer of code and JSON; 3 errs towards compacting
a little early rather than a request the server refuses."""

TOKENS_PER_MESSAGE = 4
"""Tokens a chat template adds around each message (role markers, separators)."""


def estimate_tokens(chars: int, messages: int = 0) -> int:
    """Tokens of ``chars`` characters in ``messages`` messages, as loopd estimates them."""
    return math.ceil(chars / CHARS_PER_TOKEN) + messages * TOKENS_PER_MESSAGE


def message_chars(messages: Iterable[ChatMessage]) -> int:
    """Characters of ``messages`` as compaction counts them: content, tool names, arguments."""
    total = 0
    for message in messages:
        total += len(message.content or "")
        for call in message.tool_calls:
            total += len(call.name) + len(call.arguments)
    return total


@dataclass
class SessionState:
    """A session's state as its actor keeps it; mirrors what the store holds.

    Grow the transcript with :meth:`extend` and replace it with :meth:`replace`, so the running
    length that compaction checks stays true without summing the transcript every turn.
    """

    id: str
    baseline: Baseline
    slot: int
    transcript: list[ChatMessage]
    turns: int = 0
    next_call_id: int = 1
    untrusted: bool = False
    parent: str | None = None
    slot_cached: bool = False
    """Whether ``slot`` holds this session's prompt: a model answer came from it in this
    actor's life. Only then do requests ask for that slot (otherwise every new session would
    ask for its pool's first slot, and evict the last one's cache)."""
    # Not stored: what the server last counted. ``known_tokens`` is the prompt tokens of the
    # system message, tools and the first ``known_messages`` transcript messages.
    known_tokens: int = 0
    known_messages: int = 0
    context_tokens: int | None = None
    """A slot's context size, once a server's refusal told it (overrides the configured one)."""
    decided: dict[int, StoredApproval] = field(default_factory=dict)
    """The stored decisions of calls the transcript leaves without a result, by call id
    (:attr:`SessionRecord.decided`): a repair answers each as decided."""
    _chars: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        self._chars = message_chars(self.transcript)

    @classmethod
    def from_record(cls, record: SessionRecord) -> SessionState:
        """The state of a stored session."""
        return cls(
            id=record.id,
            baseline=record.baseline,
            slot=record.slot,
            transcript=list(record.transcript),
            turns=record.turns,
            next_call_id=record.next_call_id,
            untrusted=record.untrusted,
            parent=record.parent,
            decided={d.request.call_id: d for d in record.decided},
        )

    def to_record(self) -> SessionRecord:
        """The state in the shape the store gives it back."""
        return SessionRecord(
            self.id,
            self.baseline,
            self.slot,
            tuple(self.transcript),
            self.turns,
            self.next_call_id,
            self.untrusted,
            self.parent,
        )

    def messages(self) -> tuple[ChatMessage, ...]:
        """What a model request carries: the system message, then the transcript."""
        system = ChatMessage(role="system", content=self.baseline.system)
        return (system, *self.transcript)

    def extend(self, messages: Iterable[ChatMessage]) -> None:
        """Append ``messages`` to the transcript."""
        added = list(messages)
        self.transcript.extend(added)
        self._chars += message_chars(added)

    def replace(self, messages: Iterable[ChatMessage]) -> None:
        """Make ``messages`` the whole transcript (after a compaction)."""
        self.transcript = list(messages)
        self._chars = message_chars(self.transcript)

    def transcript_chars(self) -> int:
        """Characters of the transcript after the baseline (what compaction is measured on)."""
        return self._chars

    def baseline_tokens(self) -> int:
        """An estimate of the system message and the tools, in tokens."""
        tools = sum(
            len(t.name) + len(t.description) + len(repr(t.parameters)) for t in self.baseline.tools
        )
        return estimate_tokens(len(self.baseline.system) + tools, 1)

    def prompt_tokens(self, extra: tuple[ChatMessage, ...] = ()) -> int:
        """An estimate of the next request's prompt tokens, with ``extra`` messages after the
        transcript: the server's count of the last request, plus the messages since."""
        if 0 < self.known_messages <= len(self.transcript):
            base, rest = self.known_tokens, self.transcript[self.known_messages :]
        else:
            base, rest = self.baseline_tokens(), self.transcript
        rest = [*rest, *extra]
        return base + estimate_tokens(message_chars(rest), len(rest))

    def forget_counts(self) -> None:
        """The transcript changed under the server's count (compaction): estimate afresh."""
        self.known_tokens = self.known_messages = 0


def unanswered_text(state: SessionState, registry: Registry, call: ToolCall, now: datetime) -> str:
    """The result text of a call that will never get its own: ``<child> failed`` for a child,
    its decline for a call a person declined (told already: it stands)."""
    decided = state.decided.get(call.id)
    if decided is not None and decided.approved is False:
        return declined_text(decided.reason)
    if isinstance(route_call(registry, call.name, call.as_written, now), SpawnChild):
        with contextlib.suppress(ArgumentError):
            return f"{child_id(state.id, call.id)} failed"
    return denial_message(DenyReason.INTERRUPTED)


def repair_results(
    state: SessionState, registry: Registry, now: datetime
) -> tuple[ChatMessage, ...]:
    """Results for the calls of the last model answer that have none (a turn cut off).

    A transcript whose assistant message has calls without results is not valid for the model
    API. A child that was in flight answers ``<child> failed``; a call a person declined, its
    decline; any other call is denied as interrupted. A call a person decided carries the
    decision (the store then forgets its row). Nothing is repaired when every call has its
    result.
    """
    answered: set[int] = set()
    for message in reversed(state.transcript):
        if message.role == "tool" and message.tool_call_id is not None:
            answered.add(message.tool_call_id)
        elif message.role == "assistant":
            calls = [c for c in message.tool_calls if c.id not in answered]
            break
        else:
            return ()
    else:
        return ()
    results = [
        ChatMessage(
            role="tool",
            content=unanswered_text(state, registry, c, now),
            tool_call_id=c.id,
            decision=stored_decision(state.decided.get(c.id)),
        )
        for c in calls
    ]
    return tuple(results)


def stored_decision(entry: StoredApproval | None) -> CallDecision | None:
    """The decision of a stored row, as a result message keeps it (None: not decided)."""
    if entry is None or entry.approved is None:
        return None
    return CallDecision(entry.approved, None, None if entry.approved else entry.reason)


def fitting_tail(history: list[ChatMessage], budget: int) -> list[ChatMessage]:
    """The longest end of ``history`` whose estimated tokens fit ``budget``, never starting
    with a tool result (its call would be missing). A last message too long on its own is cut
    to fit, so a summary is never asked of nothing."""
    tail: list[ChatMessage] = []
    used = 0
    for message in reversed(history):
        cost = estimate_tokens(message_chars((message,)), 1)
        if used + cost > budget:
            if not tail and message.role != "tool":
                room = max(0, (budget - TOKENS_PER_MESSAGE) * CHARS_PER_TOKEN)
                content = cap_chars(message.content or "", room)
                tail.append(ChatMessage(role=message.role, content=content, name=message.name))
            break
        tail.append(message)
        used += cost
    while tail and tail[-1].role == "tool":
        tail.pop()
    return tail[::-1]


def store_failure_reason(failed: StoreFailed) -> FailReason:
    """The reason a turn fails with when the store answers ``failed``."""
    if failed.taken:  # a child id whose record its parent's spawn did not create: not ours
        return FailReason.SPAWN_ERROR
    if failed.held_elsewhere:  # another process runs it (a shared store's lock)
        return FailReason.BUSY
    return FailReason.STORE_ERROR
