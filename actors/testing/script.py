"""Scripted model answers, shared by the in-process ScriptedModel and the fake HTTP server."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import msgspec

from messages import ProposedCall, Usage

__all__ = ["Answer", "RawResponse", "ScriptBook", "call", "calls", "reply", "with_usage"]

_Step = TypeVar("_Step")
_Request = TypeVar("_Request")


class Answer(msgspec.Struct, frozen=True):
    """One model answer: text, tool calls, or both; ``usage``, the tokens the server reports
    for it (None: the server says nothing, as a scripted answer by default)."""

    content: str | None = None
    tool_calls: tuple[ProposedCall, ...] = ()
    usage: Usage | None = None


class RawResponse(msgspec.Struct, frozen=True):
    """An HTTP response sent as is by the fake server, to test bad answers (500, not JSON...)."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = msgspec.field(default_factory=dict)


def with_usage(answer: Answer, prompt: int, completion: int, cached: int = 0) -> Answer:
    """``answer`` reporting ``prompt`` + ``completion`` tokens (``cached`` of the prompt's from
    the server's cache), as a server's ``usage`` says them: ``with_usage(reply("hi"), 120, 8)``.
    """
    usage = Usage(
        prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached, requests=1
    )
    return msgspec.structs.replace(answer, usage=usage)


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


class ScriptBook(Generic[_Request, _Step]):
    """One script per name (an agent's model, or its profile), each a list answered in order or
    a function of the request: what lets a test play a planner and a researcher with different
    scripts. :meth:`answer` raises ``LookupError`` naming the name for a name without a script,
    or a list that ran out."""

    def __init__(
        self, scripts: Mapping[str, Sequence[_Step] | Callable[[_Request], _Step]]
    ) -> None:
        self._scripts = dict(scripts)
        self._next = dict.fromkeys(self._scripts, 0)
        self._lock = threading.Lock()

    def answer(self, name: object, request: _Request) -> _Step:
        """The next answer of ``name``'s script to ``request``."""
        if not isinstance(name, str) or name not in self._scripts:
            known = ", ".join(sorted(self._scripts))
            raise LookupError(f"no script for {name!r} (scripts: {known})")
        script = self._scripts[name]
        if callable(script):
            return script(request)
        with self._lock:
            index = self._next[name]
            if index >= len(script):
                raise LookupError(f"the script of {name!r} ran out of answers after {len(script)}")
            self._next[name] = index + 1
        return script[index]
