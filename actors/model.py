"""The model client: one OpenAI-compatible ``POST <base_url>/chat/completions`` per request.

:func:`request_body` turns a :class:`~messages.ModelRequest` into the wire body (with llama.cpp's
``id_slot`` and ``cache_prompt``), :func:`parse_answer` turns the server's answer back into a
:class:`~messages.ModelAnswer`, and :class:`HttpChatModel` does the HTTP in between. Every failure
is a :class:`ModelFailure` whose message names the cause, ready to go into a ``ModelError``.
"""

from __future__ import annotations

from typing import Any, Protocol

import httpx
import msgspec

from actors.config import ModelConfig
from messages import ChatMessage, ModelAnswer, ModelRequest, ProposedCall, ToolCall, ToolSpec

__all__ = [
    "ChatModel",
    "HttpChatModel",
    "ModelFailure",
    "encode_body",
    "parse_answer",
    "request_body",
]

# At least this many requests may be in flight on one client at once (more if the configured
# concurrency asks for it), so the worker threads never queue on the connection pool.
_MIN_CONNECTIONS = 64

# How much of an error response's body goes into the failure message.
_ERROR_BODY_CHARS = 200


class ModelFailure(Exception):
    """A model request failed; ``str(failure)`` is a human sentence naming the cause."""


class ChatModel(Protocol):
    """Anything that answers chat-completions requests: the HTTP client, or a scripted fake."""

    def complete(self, request: ModelRequest) -> ModelAnswer:
        """Answer ``request``, blocking; raise :class:`ModelFailure` when that is impossible."""
        ...

    def close(self) -> None:
        """Release the model's resources (connections); ``complete`` may not be called after."""
        ...


# --- the request ------------------------------------------------------------------------------


def _call_id(number: int) -> str:
    return f"call_{number}"


def _wire_tool_call(call: ToolCall) -> dict[str, Any]:
    return {
        "id": _call_id(call.id),
        "type": "function",
        # The raw text goes back exactly as the model wrote it, so the prompt prefix is unchanged.
        "function": {"name": call.name, "arguments": call.arguments},
    }


def _wire_message(message: ChatMessage) -> dict[str, Any]:
    if message.role == "assistant":
        wire: dict[str, Any] = {"role": "assistant", "content": message.content}
        if message.tool_calls:
            wire["tool_calls"] = [_wire_tool_call(call) for call in message.tool_calls]
        return wire
    if message.role == "tool":
        if message.tool_call_id is None:
            raise ValueError("a tool message has no tool_call_id")
        return {
            "role": "tool",
            "tool_call_id": _call_id(message.tool_call_id),
            "content": message.content or "",
        }
    # system and user: servers refuse a null content here, so an absent one is sent as "".
    wire = {"role": message.role, "content": message.content or ""}
    if message.name is not None:
        wire["name"] = message.name
    return wire


def _wire_tool(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


def request_body(model_name: str, request: ModelRequest) -> dict[str, Any]:
    """The chat-completions body of ``request``, as a JSON-ready dict.

    ``request.messages`` already starts with the system message. Tool calls and results use the
    standard ``tool_calls`` / ``role: "tool"`` shapes with ids ``call_<n>``; ``tools`` is left out
    when there are none; ``id_slot`` is the request's slot and ``cache_prompt`` is true so
    llama.cpp reuses the slot's cached prefix. A function of ``request`` only: nothing
    time-varying goes in. Raises ``ValueError`` for a tool message without ``tool_call_id``.
    """
    body: dict[str, Any] = {
        "model": model_name,
        "messages": [_wire_message(message) for message in request.messages],
    }
    if request.tools:
        body["tools"] = [_wire_tool(tool) for tool in request.tools]
    body["id_slot"] = request.slot
    body["cache_prompt"] = True
    return body


def encode_body(model_name: str, request: ModelRequest) -> bytes:
    """:func:`request_body` as the exact bytes sent: compact JSON with sorted object keys.

    Sorting makes equal requests encode to equal bytes even when a tool's ``parameters`` dict
    was built in another key order (after a restart, say), so the server's prompt cache of a
    session's prefix stays valid. Raises ``ValueError`` if the request cannot be encoded.
    """
    body = request_body(model_name, request)
    try:
        return msgspec.json.encode(body, order="deterministic")
    except (msgspec.EncodeError, TypeError) as exc:
        raise ValueError(f"the request cannot be encoded as JSON: {exc}") from exc


# --- the answer -------------------------------------------------------------------------------


def _arguments_text(arguments: object) -> str:
    if isinstance(arguments, str):
        # Kept as is, even if it is not valid JSON: the dispatcher denies it with a reason the
        # model can read, which is better than failing the whole request here.
        return arguments
    if arguments is None:
        # Some servers omit the arguments of a tool that takes none.
        return "{}"
    # Some servers send an object instead of JSON text; make it the text it stands for.
    return msgspec.json.encode(arguments).decode()


def _proposed_call(index: int, item: object) -> ProposedCall:
    if not isinstance(item, dict):
        raise ModelFailure(f"the model's answer has a tool call #{index} that is not an object")
    function = item.get("function")
    if not isinstance(function, dict):
        raise ModelFailure(f"the model's answer has a tool call #{index} without a function")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ModelFailure(f"the model's answer has a tool call #{index} without a function name")
    return ProposedCall(name=name, arguments=_arguments_text(function.get("arguments")))


def parse_answer(session: str, request_id: int, body: bytes) -> ModelAnswer:
    """Parse a chat-completions response body into the answer to request ``request_id``.

    Takes ``choices[0].message``: its ``content`` (may be null) and its ``tool_calls``, whose
    ``function.arguments`` text is kept exactly as sent (an object is encoded to compact JSON).
    Raises :class:`ModelFailure` naming what is wrong when the body is not such a response.
    """
    try:
        data = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise ModelFailure(f"the model's answer is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelFailure("the model's answer is not a JSON object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ModelFailure("the model's answer has no choices")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise ModelFailure("the model's answer has a choice without a message")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise ModelFailure("the model's answer has a content that is not text")
    raw_calls = message.get("tool_calls")
    if raw_calls is None:
        raw_calls = []
    if not isinstance(raw_calls, list):
        raise ModelFailure("the model's answer has tool_calls that are not a list")
    calls = tuple(_proposed_call(index, item) for index, item in enumerate(raw_calls, start=1))
    return ModelAnswer(session=session, request_id=request_id, content=content, tool_calls=calls)


# --- the client -------------------------------------------------------------------------------


class HttpChatModel:
    """A :class:`ChatModel` over HTTP, to any OpenAI-compatible server.

    One ``httpx.Client`` serves every caller: it is thread-safe, so several model workers may
    call :meth:`complete` at once, each on its own pooled connection. No retries.
    """

    def __init__(self, config: ModelConfig, *, transport: httpx.BaseTransport | None = None):
        """Connect lazily to ``config.base_url``; ``transport`` replaces the network (tests)."""
        self._config = config
        self._url = config.base_url.rstrip("/") + "/chat/completions"
        headers = {"Content-Type": "application/json"}
        api_key = config.api_key()
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        connections = max(_MIN_CONNECTIONS, config.concurrency)
        self._client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(config.timeout_s),
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
            transport=transport,
        )

    @property
    def url(self) -> str:
        """The endpoint every request is posted to: ``<base_url>/chat/completions``."""
        return self._url

    def complete(self, request: ModelRequest) -> ModelAnswer:
        """POST ``request`` and parse the answer; raise :class:`ModelFailure` naming the cause."""
        if self._client.is_closed:
            raise ModelFailure("the model client is closed")
        try:
            content = encode_body(self._config.name, request)
        except ValueError as exc:
            raise ModelFailure(f"cannot send the request to the model: {exc}") from exc
        try:
            response = self._client.post(self._url, content=content)
        except httpx.TimeoutException as exc:
            # Checked before ConnectError: a connect timeout is a timeout, not a refusal.
            raise ModelFailure(
                f"the model at {self._url} did not answer within {self._config.timeout_s:g} s"
            ) from exc
        except httpx.ConnectError as exc:
            raise ModelFailure(f"cannot reach the model at {self._url}: {exc}") from exc
        except httpx.HTTPError as exc:
            raise ModelFailure(f"the request to the model at {self._url} failed: {exc}") from exc
        if not response.is_success:
            excerpt = response.content.decode("utf-8", "replace")[:_ERROR_BODY_CHARS]
            raise ModelFailure(
                f"the model at {self._url} answered HTTP {response.status_code}: {excerpt}"
            )
        return parse_answer(request.session, request.request_id, response.content)

    def close(self) -> None:
        """Close the connections; later :meth:`complete` calls fail with ModelFailure."""
        self._client.close()
