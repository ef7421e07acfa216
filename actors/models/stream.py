"""Streamed answers: a chat-completions answer built from its server-sent events.

A server asked for ``"stream": true`` answers with ``data: {chunk}`` lines, each a
``chat.completion.chunk`` whose ``choices[0].delta`` holds a piece of the text and pieces of the
tool calls (the first piece of a call names it; its ``arguments`` text then arrives in pieces,
by ``index``), then a chunk with ``finish_reason``, maybe one with ``usage`` (and llama.cpp's
``timings``), then ``data: [DONE]``. :class:`StreamAssembler` takes the lines one by one, says
which text each added, and builds the same :class:`~messages.ModelAnswer` as the whole answer
would have given. Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from actors.core.bounded import MAX_BYTES
from actors.models.base import ModelFailure
from actors.models.wire import decode_answer, parse_answer
from messages import ModelAnswer

__all__ = ["StreamAssembler", "StreamBroken"]


class StreamBroken(ModelFailure):
    """The stream ended before its answer did (no ``finish_reason`` and no ``[DONE]``)."""


@dataclass
class _Call:
    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class StreamAssembler:
    """One streamed answer, fed line by line with :meth:`feed`; :meth:`answer` once it ended."""

    _text: list[str] = field(default_factory=list)
    _calls: dict[int, _Call] = field(default_factory=dict)
    _finish: str | None = None
    _usage: Any = None
    _timings: Any = None
    done: bool = False
    """``data: [DONE]`` arrived."""
    streamed: bool = False
    """A ``data:`` line arrived: the server does stream (one that ignores ``"stream": true``
    sends a whole JSON body instead)."""
    max_bytes: int = MAX_BYTES
    """The most bytes one piece, or the answer built, may take (``model.max_answer_bytes``)."""

    def feed(self, line: str) -> str:
        """Take one line of the event stream; returns the answer text it added ('' for none).

        Blank lines, comments (``: ...``) and other fields (``event:``, ``id:``) carry nothing.
        Raises :class:`~actors.models.base.ModelFailure` for a ``data`` line that is not a JSON
        object or is refused by the bounded decode (named), or one that reports an ``error``.
        """
        if not line.startswith("data:"):
            return ""
        self.streamed = True
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return ""
        chunk = decode_answer(
            data, "a piece of the model's streamed answer", max_bytes=self.max_bytes
        )
        if not isinstance(chunk, dict):
            raise ModelFailure("a piece of the model's streamed answer is not a JSON object")
        if "error" in chunk:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise ModelFailure(f"the model's stream reported an error: {message}")
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        if isinstance(chunk.get("timings"), dict):
            self._timings = chunk["timings"]
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return ""
        choice = choices[0]
        if isinstance(choice.get("finish_reason"), str):
            self._finish = choice["finish_reason"]
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return ""
        for item in delta.get("tool_calls") or ():
            if isinstance(item, dict):
                self._call_piece(item)
        text = delta.get("content")
        if isinstance(text, str) and text:
            self._text.append(text)
            return text
        return ""

    def _call_piece(self, item: dict[str, Any]) -> None:
        index = item.get("index")
        function = item.get("function")
        function = function if isinstance(function, dict) else {}
        name = function.get("name")
        if index is None:
            index = self._unindexed(item.get("id"), name)
        elif not isinstance(index, int) or isinstance(index, bool):
            raise ModelFailure(
                "the model's streamed answer has a tool call piece whose index is not a whole "
                f"number: {msgspec.json.encode(index).decode()[:40]}"
            )
        call = self._calls.setdefault(index, _Call())
        if isinstance(item.get("id"), str):
            call.id = item["id"]
        if isinstance(name, str):
            call.name += name
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call.arguments.append(arguments)
        elif arguments is not None:
            # An object instead of JSON text, as parse_answer takes it from a whole answer.
            call.arguments.append(msgspec.json.encode(arguments).decode())

    def _unindexed(self, id: object, name: object) -> int:
        """Where a piece without an ``index`` goes (some servers leave it out): a piece with an
        id other than the last call's, or a name while the last call has one, begins a new
        call; any other piece goes on the last one."""
        if not self._calls:
            return 0
        last = max(self._calls)
        call = self._calls[last]
        if isinstance(id, str) and id != call.id and (call.id is not None or call.name):
            return last + 1
        if not isinstance(id, str) and isinstance(name, str) and name and call.name:
            return last + 1
        return last

    @property
    def ended(self) -> bool:
        """True once the answer is whole: a ``finish_reason`` or ``[DONE]`` arrived."""
        return self.done or self._finish is not None

    def answer(
        self, session: str, request_id: int, *, prompt_limit: int | None = None
    ) -> ModelAnswer:
        """The answer the stream built, as :func:`~actors.models.wire.parse_answer` reads a
        whole one (``prompt_limit`` as there).

        Raises :class:`StreamBroken` if the stream has not :attr:`ended`, and
        :class:`~actors.models.base.ModelFailure` for a tool call never named.
        """
        if not self.ended:
            raise StreamBroken("the model's streamed answer broke off before it ended")
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self._text) if self._text else None,
        }
        if self._calls:
            message["tool_calls"] = [
                self._whole_call(i, call) for i, call in sorted(self._calls.items())
            ]
        whole: dict[str, Any] = {"choices": [{"message": message, "finish_reason": self._finish}]}
        if self._usage is not None:
            whole["usage"] = self._usage
        if self._timings is not None:
            whole["timings"] = self._timings
        body = msgspec.json.encode(whole)
        # Built from pieces that each passed the bounded decode: only its size is new.
        return parse_answer(
            session, request_id, body, prompt_limit=prompt_limit, max_bytes=max(len(body), 1)
        )

    @staticmethod
    def _whole_call(index: int, call: _Call) -> dict[str, Any]:
        if not call.name:
            raise ModelFailure(
                f"the model's streamed answer has a tool call (index {index}) whose pieces "
                "never named its function"
            )
        # No arguments piece at all is what a body without "arguments" says: parse_answer
        # reads that as {}.
        arguments = "".join(call.arguments) if call.arguments else None
        function = {"name": call.name, "arguments": arguments}
        return {"id": call.id or f"call_{index}", "type": "function", "function": function}
