"""Scripts in a file, for ``python -m actors.testing.chat_server --script FILE``.

Start the fake server on its own to try a supervisor (or ``loopd run``) by hand, offline::

    $ python -m actors.testing.chat_server --script answers.json --port 8089 --log requests.jsonl
    serving http://127.0.0.1:8089/v1 (3 answers)

The file is JSON. Its simplest form is an array of answers, used in order, whoever asks::

    [{"tool_calls": [{"name": "subagent", "arguments": {"task": "look it up"}}]},
     "found it",
     "Here is what the child found."]

An answer is a string (an answer with that text: it ends the turn) or an object in the shape
of an OpenAI assistant message: ``content`` and/or ``tool_calls``, an optional
``"role": "assistant"``, and an optional ``usage`` (``prompt_tokens``, ``completion_tokens``,
optionally ``total_tokens`` and ``prompt_tokens_details.cached_tokens``) that the server reports
with it. A call is ``{"name": ..., "arguments": ...}`` or OpenAI's
``{"id": ..., "type": "function", "function": {"name": ..., "arguments": ...}}`` (the id is not
kept: the server numbers the calls it sends); its arguments an object or raw JSON text.

When several conversations ask at once (a parent's children, running in parallel), answers in
file order go to whichever request comes first. An object file keys answers by the
conversation instead: by its first user message, which for a child holds its task::

    {"conversations": [
        {"first_user_contains": "weather in Oslo", "answers": ["Snow, -3 C."]},
        {"first_user_contains": "weather in Rome", "answers": ["Sun, 21 C."]}],
     "answers": [
        {"tool_calls": [
            {"name": "subagent", "arguments": {"task": "weather in Oslo"}},
            {"name": "subagent", "arguments": {"task": "weather in Rome"}}]},
        "Oslo is cold, Rome is warm."]}

A request's first user message (its text parts, for a list of parts) is matched against each
conversation's ``first_user_contains`` in file order; the first that it contains answers it,
from that conversation's ``answers`` in order. A request that matches none is answered from
the top-level ``answers`` in order. A request whose answers ran out is answered HTTP 500 and
recorded in the server's errors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from actors.testing.script import Answer, ScriptBook, reply
from messages import ProposedCall, Usage

__all__ = ["FileScript", "first_user_text", "load_script"]

_Tokens = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]


class _Function(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    arguments: str | dict[str, Any] = msgspec.field(default_factory=dict)


class _Call(msgspec.Struct, forbid_unknown_fields=True):
    # Either loopd's short form (name, arguments) or OpenAI's (id, type, function).
    name: str | None = None
    arguments: str | dict[str, Any] | None = None
    id: str | None = None
    type: Literal["function"] | None = None
    function: _Function | None = None


class _PromptDetails(msgspec.Struct):
    cached_tokens: _Tokens = 0


class _Usage(msgspec.Struct):
    # Unknown fields are let through: OpenAI's usage carries more (completion_tokens_details).
    prompt_tokens: _Tokens
    completion_tokens: _Tokens
    total_tokens: _Tokens | None = None
    prompt_tokens_details: _PromptDetails | None = None


class _Answer(msgspec.Struct, forbid_unknown_fields=True):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[_Call] = msgspec.field(default_factory=list)
    usage: _Usage | None = None


_Item = str | _Answer


class _Conversation(msgspec.Struct, forbid_unknown_fields=True):
    first_user_contains: Annotated[str, msgspec.Meta(min_length=1)]
    answers: list[_Item]


class _Keyed(msgspec.Struct, forbid_unknown_fields=True):
    answers: list[_Item] = msgspec.field(default_factory=list)
    conversations: list[_Conversation] = msgspec.field(default_factory=list)


def first_user_text(body: dict[str, Any]) -> str:
    """The text of the first ``user`` message of a chat request body ("" if it has none).

    A content given as a list of parts gives its ``text`` parts, joined by newlines.
    """
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            parts = (p.get("text") for p in content if isinstance(p, dict))
            return "\n".join(p for p in parts if isinstance(p, str))
        return ""
    return ""


class FileScript:
    """A script file's answers as a chat server script: a function of the request body.

    ``in_order`` answers any request no conversation claims; ``conversations`` pairs each
    ``first_user_contains`` text with its own answers. Each list is used in order (a
    :class:`~actors.testing.script.ScriptBook` keeps their places); a list that ran out
    raises ``LookupError`` saying whose (the server answers that request HTTP 500).
    """

    def __init__(
        self, in_order: list[Answer], conversations: list[tuple[str, list[Answer]]]
    ) -> None:
        """Answer from ``in_order`` and ``conversations`` (matched in the order given; their
        texts are not empty and differ)."""
        self.in_order = in_order
        self.conversations = conversations
        # "" names the answers in order: no conversation's text is empty.
        self._book: ScriptBook[dict[str, Any], Answer] = ScriptBook(
            {"": in_order, **dict(conversations)}
        )

    @property
    def count(self) -> int:
        """How many answers the file holds in all."""
        return len(self.in_order) + sum(len(answers) for _, answers in self.conversations)

    def describe(self) -> str:
        """``3 answers``, or ``5 answers, 2 conversations`` for a file keyed by conversation."""
        text = f"{self.count} answers"
        if self.conversations:
            text += f", {len(self.conversations)} conversations"
        return text

    def __call__(self, body: dict[str, Any]) -> Answer:
        """The next answer to the request ``body``."""
        first = first_user_text(body)
        key = next((key for key, _ in self.conversations if key in first), "")
        try:
            return self._book.answer(key, body)
        except LookupError:
            if key:
                raise
        shown = first[:60] + ("…" if len(first) > 60 else "")
        raise LookupError(
            f"the answers in order ran out after {len(self.in_order)} (no conversation's text "
            f"is in the first user message {shown!r})"
        )


def _call(item: _Call, where: str) -> ProposedCall:
    if (item.name is None) == (item.function is None):
        raise ValueError(
            f"a call needs either `name` or `function` (OpenAI's shape), not both - at `{where}`"
        )
    if item.function is not None:
        if item.arguments is not None:
            raise ValueError(f"a call's `arguments` go inside its `function` - at `{where}`")
        name, arguments = item.function.name, item.function.arguments
    else:
        assert item.name is not None
        name, arguments = item.name, {} if item.arguments is None else item.arguments
    return ProposedCall(name, arguments if isinstance(arguments, str) else json.dumps(arguments))


def _answer(item: _Item, where: str) -> Answer:
    if isinstance(item, str):
        return reply(item)
    calls = tuple(_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(item.tool_calls))
    usage = None
    if item.usage is not None:
        details = item.usage.prompt_tokens_details
        usage = Usage(
            prompt_tokens=item.usage.prompt_tokens,
            completion_tokens=item.usage.completion_tokens,
            cached_tokens=0 if details is None else details.cached_tokens,
            requests=1,
        )
    return Answer(content=item.content, tool_calls=calls, usage=usage)


def _answers(items: list[_Item], where: str) -> list[Answer]:
    return [_answer(item, f"{where}[{i}]") for i, item in enumerate(items)]


def load_script(path: str | Path) -> FileScript:
    """Read a script file (see the module's doc); ``ValueError`` naming the file and the place."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read the script {path}: {exc.strerror or exc}") from None
    try:
        data = msgspec.json.decode(raw, type=list[_Item] | _Keyed)
    except msgspec.ValidationError as exc:
        raise ValueError(f"the script {path} is not valid: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ValueError(f"the script {path} is not JSON: {exc}") from None
    try:
        if isinstance(data, list):
            return FileScript(_answers(data, "$"), [])
        conversations: list[tuple[str, list[Answer]]] = []
        for i, conversation in enumerate(data.conversations):
            key, where = conversation.first_user_contains, f"$.conversations[{i}]"
            if key in dict(conversations):  # the second would never answer
                raise ValueError(f"{key!r} is the text of an earlier conversation - at `{where}`")
            conversations.append((key, _answers(conversation.answers, f"{where}.answers")))
        return FileScript(_answers(data.answers, "$.answers"), conversations)
    except ValueError as exc:
        raise ValueError(f"the script {path} is not valid: {exc}") from None
