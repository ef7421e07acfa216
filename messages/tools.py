"""Tool calls, tool results, tool specs and denials."""

from __future__ import annotations

import enum
from typing import Any

from msgspec import field

from messages.base import Message
from messages.ids import CallId, check_text

__all__ = [
    "DataClass",
    "DenyReason",
    "ToolCall",
    "ToolResult",
    "ToolSpec",
    "denial_message",
]


class DataClass(enum.StrEnum):
    """How sensitive a tool result's text is."""

    PUBLIC = "public"
    PRIVATE = "private"


class DenyReason(enum.StrEnum):
    """Why a tool call was refused without running."""

    INVALID_ARGUMENTS = "invalid_arguments"
    UNKNOWN_TOOL = "unknown_tool"
    STEP_LIMIT = "step_limit"
    LIMIT = "limit"
    INTERRUPTED = "interrupted"
    UNTRUSTED = "untrusted"
    DECLINED = "declined"


_DENIAL_TEXT = {
    DenyReason.INVALID_ARGUMENTS: "the arguments are not valid for this tool",
    DenyReason.UNKNOWN_TOOL: "there is no tool with this name",
    DenyReason.STEP_LIMIT: "the turn reached its step limit before this call could run",
    DenyReason.LIMIT: "a limit of this runtime was reached",
    DenyReason.INTERRUPTED: "the turn ended before this call returned a result",
    DenyReason.UNTRUSTED: "this session has read untrusted data",
    DenyReason.DECLINED: "a person declined this call",
}


def denial_message(reason: DenyReason, detail: str | None = None) -> str:
    """The tool text a denied call returns to the model.

    ``denial_message(INVALID_ARGUMENTS, "task is required")`` is
    ``Denied: the arguments are not valid for this tool: task is required.``
    """
    text = f"Denied: {_DENIAL_TEXT[reason]}"
    return f"{text}: {detail}." if detail else f"{text}."


class ToolCall(Message, frozen=True):
    """One tool call of a model answer; ``arguments`` is the model's raw JSON text.

    When the model's text is not a JSON object, ``arguments`` is ``{}`` (what goes back to the
    server, which refuses a history with unparseable arguments) and ``raw_arguments`` keeps the
    model's text for dispatch, display and events. :attr:`as_written` is the model's text.
    """

    id: CallId
    name: str
    arguments: str
    raw_arguments: str | None = None

    @property
    def as_written(self) -> str:
        """The arguments exactly as the model wrote them."""
        return self.arguments if self.raw_arguments is None else self.raw_arguments


class ToolResult(Message, frozen=True):
    """The answer to one tool call, as it goes back to the model.

    ``text`` must be a ``str`` of valid Unicode text (a port tool that returns a lone surrogate
    gets an error text instead: nothing could store or send it). ``denied``: the call was
    refused (``text`` is a ``denial_message``), which its ``ToolCallFinished`` event says.
    """

    call_id: CallId
    text: str
    data_class: DataClass = DataClass.PUBLIC
    untrusted: bool = False
    denied: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_text(self.text, "a tool result's text")


class ToolSpec(Message, frozen=True):
    """A tool as the model sees it: a name, a description and a JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)
