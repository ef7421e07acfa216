"""The chat-completions wire format, sans I/O: request bodies out, answers and errors in.

:func:`request_body` turns a :class:`~messages.ModelRequest` into the wire body (with llama.cpp's
``id_slot`` and ``cache_prompt``), :func:`parse_answer` turns the server's answer back into a
:class:`~messages.ModelAnswer`, and :func:`http_failure` reads an error answer. Plain functions of
bytes and Structs: the HTTP transport is :mod:`actors.models.http`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import msgspec

from actors.core.bounded import MAX_BYTES, MAX_DEPTH, OutOfBounds, decode_json
from actors.core.dispatch import is_json_object
from actors.models.base import ModelFailure
from messages import (
    ChatMessage,
    ModelAnswer,
    ModelRequest,
    ProposedCall,
    RequestOptions,
    ToolCall,
    ToolSpec,
    Usage,
)

__all__ = [
    "MAX_REQUEST_TOKENS",
    "answer_too_large",
    "decode_answer",
    "encode_body",
    "error_detail",
    "error_fields",
    "http_failure",
    "names_request_fault",
    "parse_answer",
    "parse_usage",
    "prompt_token_limit",
    "request_body",
]


# How much of a server's error message goes into the failure message: enough for any real one.
_ERROR_MESSAGE_CHARS = 1000


# Error types (the ``error.type`` of an error body) that name a fault of the request itself,
# so the same request fails the same way again: no retry, whatever the status.
_DETERMINISTIC_TYPES = frozenset(
    {
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "not_supported_error",
        "exceed_context_size_error",
        "BadRequestError",  # vLLM's name for a 400
    }
)


_CONTEXT_EXCEEDED_TYPE = "exceed_context_size_error"


def _call_id(number: int) -> str:
    return f"call_{number}"


# A transcript's calls are checked again on every request: the answers of the short texts
# (nearly all of them) are kept, so a long transcript costs one lookup a call, not a decode.
_CHECKED_CHARS = 4096


@lru_cache(maxsize=4096)
def _checked_object(text: str) -> bool:
    return is_json_object(text)


def _sendable(text: str) -> bool:
    """True if the stored arguments ``text`` passes the bounded decode as a JSON object."""
    return _checked_object(text) if len(text) <= _CHECKED_CHARS else is_json_object(text)


def _wire_tool_call(call: ToolCall) -> dict[str, Any]:
    # The text goes back exactly as stored, so the prompt prefix is unchanged; only a stored
    # text the bounded decode refuses (written before raw_arguments existed, or before the
    # bounds: nested past 64, an integer past int64, a lone surrogate) is sent as {}: a server
    # refuses a whole request over one such call, which would stick the session for good.
    arguments = call.arguments if _sendable(call.arguments) else "{}"
    return {
        "id": _call_id(call.id),
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
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


def request_body(
    model_name: str, request: ModelRequest, *, max_tokens: int | None = None
) -> dict[str, Any]:
    """The chat-completions body of ``request``, as a JSON-ready dict.

    ``request.messages`` already starts with the system message. Tool calls and results use the
    standard ``tool_calls`` / ``role: "tool"`` shapes with ids ``call_<n>``; ``tools`` is left out
    when there are none; ``max_tokens``, when given, bounds the answer (``model.max_tokens``);
    the profile's ``request.options`` then set ``model`` and the sampling fields (its own
    ``max_tokens`` included) and merge ``extra_body``; ``id_slot`` is the request's slot and
    ``cache_prompt`` is true so llama.cpp reuses the slot's cached prefix, unless the backend is
    ``openai``, which gets the plain chat-completions request. Tool-call arguments that are not
    a JSON object go as ``{}``. A function of its arguments only: nothing
    time-varying goes in. Raises ``ValueError`` for a tool message without ``tool_call_id``.
    """
    body: dict[str, Any] = {
        "model": model_name,
        "messages": [_wire_message(message) for message in request.messages],
    }
    if request.tools:
        body["tools"] = [_wire_tool(tool) for tool in request.tools]
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    _add_options(body, request.options)
    if request.options.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    if request.options.backend != "openai":
        body["id_slot"] = request.slot
        body["cache_prompt"] = True
    return body


def _add_options(body: dict[str, Any], options: RequestOptions) -> None:
    """The request fields of the session's agent profile: ``model`` replaced, each sampling
    field that is set, then ``extra_body`` merged in (config refuses the keys loopd sets)."""
    if options.model is not None:
        body["model"] = options.model
    for key in ("temperature", "top_p", "max_tokens", "seed"):
        value = getattr(options, key)
        if value is not None:
            body[key] = value
    if options.stop is not None:
        body["stop"] = list(options.stop)
    body.update(options.extra_body)


def encode_body(model_name: str, request: ModelRequest, *, max_tokens: int | None = None) -> bytes:
    """:func:`request_body` as the exact bytes sent: compact JSON with sorted object keys.

    Sorting makes equal requests encode to equal bytes even when a tool's ``parameters`` dict
    was built in another key order (after a restart, say), so the server's prompt cache of a
    session's prefix stays valid. Raises ``ValueError`` if the request cannot be encoded.
    """
    body = request_body(model_name, request, max_tokens=max_tokens)
    try:
        return msgspec.json.encode(body, order="deterministic")
    except (msgspec.EncodeError, TypeError) as exc:
        raise ValueError(f"the request cannot be encoded as JSON: {exc}") from exc


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


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


MAX_REQUEST_TOKENS = 2**32
"""More tokens than any one request can cost: no model's context comes near it. A count past
it (or past :func:`prompt_token_limit`) is impossible, and the usage is not believed."""


def prompt_token_limit(request_bytes: int) -> int:
    """The most prompt tokens a request body of ``request_bytes`` bytes can hold.

    A token is at least a byte of the text it stands for; the chat template adds its own text
    and a few special tokens per message, which twice the body plus 65,536 covers with room.
    """
    return min(2 * request_bytes + 65536, MAX_REQUEST_TOKENS)


log = logging.getLogger(__name__)

_warned: set[str] = set()
"""The kinds of impossible usage already logged: each is logged once per process."""


def _impossible(name: str, value: int, limit: int) -> None:
    if name in _warned:
        return
    _warned.add(name)
    log.warning(
        "the model server reported %s = %d, more than one request can cost (at most %d); "
        "such usage is not counted (the request counts as unmeasured). Logged once.",
        name,
        value,
        limit,
    )


def parse_usage(data: Mapping[str, Any], *, prompt_limit: int | None = None) -> Usage:
    """The ``usage`` of a chat-completions response as a :class:`Usage` of one request.

    ``cached_tokens`` is ``usage.prompt_tokens_details.cached_tokens``, or llama.cpp's
    ``timings.cache_n`` when that is absent. Missing or malformed counts are zero. Every answer
    counts one request; an answer with no ``usage``, no count in it, or an impossible count
    (past :data:`MAX_REQUEST_TOKENS`, or prompt or cached tokens past ``prompt_limit``, see
    :func:`prompt_token_limit`) counts as one unmeasured request of zero tokens, and an
    impossible one is logged (once per process).
    """
    unmeasured = Usage(requests=1, unmeasured_requests=1)
    usage = data.get("usage")
    if not isinstance(usage, dict):
        return unmeasured
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else 0
    timings = data.get("timings")
    if not cached and isinstance(timings, dict):
        cached = _count(timings.get("cache_n"))
    prompt = _count(usage.get("prompt_tokens"))
    completion = _count(usage.get("completion_tokens"))
    if not any(_counted(usage.get(key)) for key in ("prompt_tokens", "completion_tokens")):
        return unmeasured
    prompt_cap = MAX_REQUEST_TOKENS if prompt_limit is None else prompt_limit
    for name, value, limit in (
        ("prompt_tokens", prompt, prompt_cap),
        ("cached_tokens", cached, prompt_cap),
        ("completion_tokens", completion, MAX_REQUEST_TOKENS),
    ):
        if value > limit:
            _impossible(name, value, limit)
            return unmeasured
    return Usage(
        prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached, requests=1
    )


def _counted(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def decode_answer(data: bytes | str, what: str, *, max_bytes: int = MAX_BYTES) -> Any:
    """A model server's JSON through the bounded decode (at most ``max_bytes``, nested at most
    :data:`~actors.core.bounded.MAX_DEPTH` deep, integers within int64, valid Unicode).

    Raises :class:`ModelFailure` beginning with ``what``: ``<what> is not valid JSON: <why>``
    for text that is not JSON, ``<what> is out of bounds: <the bound>`` for one refused by a
    bound (``JSON nested deeper than 64 levels``), never ``RecursionError``.
    """
    try:
        return decode_json(data, max_bytes=max_bytes, max_depth=MAX_DEPTH)
    except OutOfBounds as exc:
        if exc.detail.startswith("not valid JSON"):
            raise ModelFailure(f"{what} is {exc.detail}") from None
        raise ModelFailure(f"{what} is out of bounds: {exc.detail}") from None


def parse_answer(
    session: str,
    request_id: int,
    body: bytes,
    *,
    prompt_limit: int | None = None,
    max_bytes: int = MAX_BYTES,
) -> ModelAnswer:
    """Parse a chat-completions response body into the answer to request ``request_id``.

    Takes ``choices[0].message``: its ``content`` (may be null) and its ``tool_calls``, whose
    ``function.arguments`` text is kept exactly as sent (an object is encoded to compact JSON);
    ``choices[0].finish_reason == "length"`` marks it truncated; ``usage`` is read with
    :func:`parse_usage` (``prompt_limit`` bounds its prompt tokens). The body passes
    :func:`decode_answer` first (``max_bytes``: the transport's ``model.max_answer_bytes``).
    Raises :class:`ModelFailure` naming what is wrong when the body is not such a response.
    """
    data = decode_answer(body, "the model's answer", max_bytes=max_bytes)
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
    return ModelAnswer(
        session=session,
        request_id=request_id,
        content=content,
        tool_calls=calls,
        usage=parse_usage(data, prompt_limit=prompt_limit),
        truncated=choice.get("finish_reason") == "length",
    )


def error_fields(body: bytes) -> tuple[str, str | None, int | None]:
    """The ``(message, type, n_ctx)`` of an error body; the body's text when it is not JSON.

    Reads llama.cpp's and OpenAI's ``{"error": {"message", "type"}}``, vLLM's top-level
    ``message``/``type`` and Ollama's ``{"error": "<text>"}``.
    """
    text = body.decode("utf-8", "replace").strip()
    try:
        data = decode_json(body, max_bytes=max(len(body), 1))
    except OutOfBounds:
        return text, None, None
    if not isinstance(data, dict):
        return text, None, None
    error = data.get("error")
    if isinstance(error, str):
        return error, None, None
    fields = error if isinstance(error, dict) else data
    message = fields.get("message")
    kind = fields.get("type")
    size = _count(fields.get("n_ctx"))
    return (
        message if isinstance(message, str) else text,
        kind if isinstance(kind, str) else None,
        # An impossible context size is no size: it would not even fit a message.
        size if 0 < size <= MAX_REQUEST_TOKENS else None,
    )


def error_detail(message: str, limit: int = _ERROR_MESSAGE_CHARS) -> str:
    """``message`` whole when it has at most ``limit`` characters; else cut at the last word
    boundary before it, saying so: ``... (cut at 1000 of 5230 characters)``."""
    message = message.strip()
    if len(message) <= limit:
        return message
    head = message[:limit]
    space = head.rfind(" ")
    if space > limit // 2:
        head = head[:space]
    return f"{head.rstrip()} ... (cut at {len(head.rstrip())} of {len(message)} characters)"


def names_request_fault(body: bytes) -> bool:
    """True when an error body's type names a fault of the request itself
    (``invalid_request_error``, ``exceed_context_size_error``...): the same request fails again."""
    return error_fields(body)[1] in _DETERMINISTIC_TYPES


def http_failure(url: str, status: int, body: bytes) -> ModelFailure:
    """The :class:`ModelFailure` of an HTTP error answer: status, error type and the server's
    message (see :func:`error_detail`), flagged when the prompt exceeded the context."""
    message, kind, n_ctx = error_fields(body)
    named = f"HTTP {status} ({kind})" if kind else f"HTTP {status}"
    exceeded = kind == _CONTEXT_EXCEEDED_TYPE or "exceeds the available context size" in message
    return ModelFailure(
        f"the model at {url} answered {named}: {error_detail(message)}",
        context_exceeded=exceeded,
        context_tokens=n_ctx,
    )


def answer_too_large(cap: int) -> str:
    """The failure text of an answer body larger than ``model.max_answer_bytes``."""
    return f"the model's answer was larger than model.max_answer_bytes ({cap} bytes)"
