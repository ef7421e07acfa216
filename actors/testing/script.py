"""Scripted model answers, shared by the in-process ScriptedModel and the fake HTTP server."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from messages import ProposedCall

__all__ = ["Answer", "RawResponse", "call", "calls", "reply"]


class Answer(msgspec.Struct, frozen=True):
    """One model answer: text, tool calls, or both."""

    content: str | None = None
    tool_calls: tuple[ProposedCall, ...] = ()


class RawResponse(msgspec.Struct, frozen=True):
    """An HTTP response sent as is by the fake server, to test bad answers (500, not JSON...)."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = msgspec.field(default_factory=dict)


def reply(text: str) -> Answer:
    """An answer with no tool calls: it ends the turn with ``text``."""
    return Answer(content=text)


def _arguments(arguments: str | dict[str, Any] | None, kwargs: dict[str, Any]) -> str:
    if isinstance(arguments, str):
        return arguments
    merged = dict(arguments or {})
    merged.update(kwargs)
    return json.dumps(merged)


def call(name: str, arguments: str | dict[str, Any] | None = None, **kwargs: Any) -> Answer:
    """An answer with one tool call. ``arguments`` as raw text, a dict, or keyword arguments."""
    return Answer(tool_calls=(ProposedCall(name, _arguments(arguments, kwargs)),))


def calls(*items: tuple[str, str | dict[str, Any]]) -> Answer:
    """An answer with several tool calls, each ``(name, arguments)``, in the order given."""
    return Answer(tool_calls=tuple(ProposedCall(n, _arguments(a, {})) for n, a in items))
