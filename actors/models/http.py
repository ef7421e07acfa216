"""The model client: one OpenAI-compatible ``POST <base_url>/chat/completions`` per request.

:func:`request_body` turns a :class:`~messages.ModelRequest` into the wire body (with llama.cpp's
``id_slot`` and ``cache_prompt``), :func:`parse_answer` turns the server's answer back into a
:class:`~messages.ModelAnswer`, and :class:`HttpChatModel` does the HTTP in between, as a
coroutine on an asyncio loop (the model service's, see :mod:`actors.services.model_service`). Every
failure is a :class:`ModelFailure` whose message names the cause, ready to go into a
``ModelError``. Failures a retry can help (see :func:`is_retryable`) are retried a bounded number
of times, after the wait :func:`retry_delay` gives.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

import httpx
import msgspec

from actors.core.config import ModelConfig
from actors.models.netbackend import plain_transport
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
    "AsyncChatModel",
    "ChatModel",
    "HttpChatModel",
    "ModelFailure",
    "answer_too_large",
    "encode_body",
    "error_detail",
    "http_failure",
    "is_json_object",
    "is_retryable",
    "parse_answer",
    "parse_usage",
    "props_url",
    "read_total_slots",
    "request_body",
    "retry_delay",
]

# At least this many idle keep-alive connections are kept per loop (more if the configured
# concurrency asks for it).
_MIN_CONNECTIONS = 64

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

# Statuses a retry can help: rate limited, or a server error that may be passing.
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# Statuses whose Retry-After header is honoured.
_RETRY_AFTER_STATUSES = frozenset({429, 503})
# Transport failures a retry can help: no connection, a connection reset, no answer in time.
_RETRY_ERRORS = (
    httpx.TimeoutException,
    httpx.ConnectError,
    httpx.RemoteProtocolError,
    httpx.ReadError,
    httpx.WriteError,
)
# At most this fraction is added at random to a backoff, so clients that failed together spread.
_JITTER = 0.1


class ModelFailure(Exception):
    """A model request failed; ``str(failure)`` is a human sentence naming the cause.

    ``context_exceeded`` is true when the server refused the prompt as longer than its context;
    ``context_tokens`` is then that context's size, when the server said it.
    """

    def __init__(
        self, message: str, *, context_exceeded: bool = False, context_tokens: int | None = None
    ) -> None:
        super().__init__(message)
        self.context_exceeded = context_exceeded
        self.context_tokens = context_tokens

    cut = False
    """True when the last attempt was cut off (a deadline, a body over the cap) while the
    server may still be working on it: its slot must rest before the next request."""


class ChatModel(Protocol):
    """Anything that answers chat-completions requests: the HTTP client, or a scripted fake.

    The model service runs ``complete`` on a bounded pool of threads, so it may block. A model
    may also have ``uses_slots = False`` (an in-process model: no llama.cpp slots to guard);
    without it, requests take slots of the slot table like the HTTP client's.
    """

    def complete(self, request: ModelRequest) -> ModelAnswer:
        """Answer ``request``, blocking; raise :class:`ModelFailure` when that is impossible."""
        ...

    def close(self) -> None:
        """Release the model's resources (connections); ``complete`` may not be called after."""
        ...


class AsyncChatModel(Protocol):
    """A model whose requests are coroutines: the model service awaits ``acomplete`` on its
    loop, and cancels the task when nobody waits for the answer any more."""

    async def acomplete(self, request: ModelRequest) -> ModelAnswer:
        """Answer ``request``; raise :class:`ModelFailure` when that is impossible."""
        ...

    async def aclose(self) -> None:
        """Release what the running loop holds (its connections); the model may be used again
        from another loop."""
        ...

    def close(self) -> None:
        """Release everything; no request may be made after."""
        ...


# --- the request ------------------------------------------------------------------------------


def _call_id(number: int) -> str:
    return f"call_{number}"


def is_json_object(text: str) -> bool:
    """True if ``text`` parses as a JSON object (what a server accepts as tool-call arguments)."""
    try:
        return isinstance(msgspec.json.decode(text), dict)
    except (msgspec.DecodeError, RecursionError):
        return False


def _wire_tool_call(call: ToolCall) -> dict[str, Any]:
    # The text goes back exactly as stored, so the prompt prefix is unchanged; only a stored
    # text a server cannot parse (written before raw_arguments existed) is sent as {}: servers
    # refuse a whole request over one such call, which would stick the session for good.
    arguments = call.arguments if is_json_object(call.arguments) else "{}"
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


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def parse_usage(data: Mapping[str, Any]) -> Usage:
    """The ``usage`` of a chat-completions response as a :class:`Usage` of one request.

    ``cached_tokens`` is ``usage.prompt_tokens_details.cached_tokens``, or llama.cpp's
    ``timings.cache_n`` when that is absent. Missing or malformed counts are zero; no ``usage``
    at all is ``Usage()``, all zeros (``requests`` too).
    """
    usage = data.get("usage")
    if not isinstance(usage, dict):
        return Usage()
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else 0
    timings = data.get("timings")
    if not cached and isinstance(timings, dict):
        cached = _count(timings.get("cache_n"))
    return Usage(
        prompt_tokens=_count(usage.get("prompt_tokens")),
        completion_tokens=_count(usage.get("completion_tokens")),
        cached_tokens=cached,
        requests=1,
    )


def parse_answer(session: str, request_id: int, body: bytes) -> ModelAnswer:
    """Parse a chat-completions response body into the answer to request ``request_id``.

    Takes ``choices[0].message``: its ``content`` (may be null) and its ``tool_calls``, whose
    ``function.arguments`` text is kept exactly as sent (an object is encoded to compact JSON);
    ``choices[0].finish_reason == "length"`` marks it truncated; ``usage`` is read with
    :func:`parse_usage`. Raises :class:`ModelFailure` naming what is wrong when the body is not
    such a response.
    """
    try:
        data = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise ModelFailure(f"the model's answer is not valid JSON: {exc}") from exc
    except RecursionError:  # msgspec's depth limit: a hostile or broken server, not a bug
        raise ModelFailure("the model's answer is nested too deeply to be read") from None
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
        usage=parse_usage(data),
        truncated=choice.get("finish_reason") == "length",
    )


# --- retries --------------------------------------------------------------------------------


def _error_fields(body: bytes) -> tuple[str, str | None, int | None]:
    """The ``(message, type, n_ctx)`` of an error body; the body's text when it is not JSON.

    Reads llama.cpp's and OpenAI's ``{"error": {"message", "type"}}``, vLLM's top-level
    ``message``/``type`` and Ollama's ``{"error": "<text>"}``.
    """
    text = body.decode("utf-8", "replace").strip()
    try:
        data = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return text, None, None
    if not isinstance(data, dict):
        return text, None, None
    error = data.get("error")
    if isinstance(error, str):
        return error, None, None
    fields = error if isinstance(error, dict) else data
    message = fields.get("message")
    kind = fields.get("type")
    n_ctx = _count(fields.get("n_ctx")) or None
    return (
        message if isinstance(message, str) else text,
        kind if isinstance(kind, str) else None,
        n_ctx,
    )


def is_retryable(failure: httpx.HTTPError | int, body: bytes = b"") -> bool:
    """Whether a retry can help after ``failure``: a transport error, or an HTTP status code
    with the response ``body``.

    True for no connection, a connection reset, a timeout, and HTTP 429, 500, 502, 503 and 504,
    unless the body's error type names a fault of the request itself (``invalid_request_error``,
    ``exceed_context_size_error``...); false for anything else (another 4xx, say). An answer
    that cannot be parsed is never retried.
    """
    if isinstance(failure, int):
        if failure not in _RETRY_STATUSES:
            return False
        return _error_fields(body)[1] not in _DETERMINISTIC_TYPES
    return isinstance(failure, _RETRY_ERRORS)


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


def http_failure(url: str, status: int, body: bytes) -> ModelFailure:
    """The :class:`ModelFailure` of an HTTP error answer: status, error type and the server's
    message (see :func:`error_detail`), flagged when the prompt exceeded the context."""
    message, kind, n_ctx = _error_fields(body)
    named = f"HTTP {status} ({kind})" if kind else f"HTTP {status}"
    exceeded = kind == _CONTEXT_EXCEEDED_TYPE or "exceeds the available context size" in message
    return ModelFailure(
        f"the model at {url} answered {named}: {error_detail(message)}",
        context_exceeded=exceeded,
        context_tokens=n_ctx,
    )


def _retry_after_s(value: str | None) -> float | None:
    """A ``Retry-After`` value in seconds from now (never negative), or None if unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def retry_delay(attempt: int, headers: Mapping[str, str] | None, config: ModelConfig) -> float:
    """Seconds to wait after failed attempt ``attempt`` (0 for the first) before the next one.

    A ``Retry-After`` in ``headers`` (seconds, or an HTTP date) is honoured; pass the headers only
    for a status where the server means it (429, 503). Otherwise the wait is
    ``retry_backoff_s * 2**attempt`` plus up to 10 % jitter. Never more than ``retry_max_wait_s``.
    """
    if headers is not None:
        after = _retry_after_s(httpx.Headers(headers).get("retry-after"))
        if after is not None:
            return min(after, config.retry_max_wait_s)
    backoff = config.retry_backoff_s * 2.0**attempt * (1 + random.uniform(0, _JITTER))
    return min(backoff, config.retry_max_wait_s)


# --- the client -------------------------------------------------------------------------------


class _Failed(Exception):
    """One attempt failed: why, whether a retry can help, and whether the request was cut off
    while the server may still be working on it."""

    def __init__(
        self,
        cause: str,
        *,
        retry: bool,
        cut: bool,
        headers: httpx.Headers | None = None,
        error: BaseException | None = None,
        context_exceeded: bool = False,
        context_tokens: int | None = None,
    ) -> None:
        super().__init__(cause)
        self.cause = cause
        self.retry = retry
        self.cut = cut
        self.headers = headers
        self.error = error
        self.context_exceeded = context_exceeded
        self.context_tokens = context_tokens


class _TooLarge(Exception):
    pass


class _Broken(Exception):
    """A streamed answer ended before it was whole."""


async def _read_stream(
    response: httpx.Response,
    request: ModelRequest,
    cap: int,
    on_text: Callable[[str], None] | None,
) -> ModelAnswer:
    """The answer of a server-sent event stream, each text piece given to ``on_text`` as it
    comes; :class:`_TooLarge` past ``cap`` bytes, :class:`_Broken` if it ends too soon."""
    from actors.models.stream import StreamAssembler, StreamBroken  # it builds on this module

    assembler = StreamAssembler()

    def feed(line: str) -> None:
        text = assembler.feed(line)
        if text and on_text is not None:
            on_text(text)

    size = 0
    pending: str | None = None  # a line is whole only once the next one begins
    async for line in response.aiter_lines():
        size += len(line) + 1
        if size > cap:
            raise _TooLarge
        if pending is not None:
            feed(pending)
            if assembler.done:
                break
        pending = line
    else:
        if pending:
            try:  # the last line, maybe cut off in its middle
                feed(pending)
            except ModelFailure:
                if not assembler.ended:
                    raise _Broken(
                        f"the model's streamed answer broke off in a line ({response.url})"
                    ) from None
    try:
        return assembler.answer(request.session, request.request_id)
    except StreamBroken as exc:
        raise _Broken(f"{exc} (the model at {response.url})") from None


async def _read_capped(response: httpx.Response, cap: int) -> bytes:
    """The body of ``response``, or :class:`_TooLarge` as soon as it passes ``cap`` bytes."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise _TooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > cap:
            raise _TooLarge  # stop reading: leaving the stream closes the connection
        chunks.append(chunk)
    return b"".join(chunks)


def answer_too_large(cap: int) -> str:
    """The failure text of an answer body larger than ``model.max_answer_bytes``."""
    return f"the model's answer was larger than model.max_answer_bytes ({cap} bytes)"


class _Connections:
    """One loop's HTTP connections: each an ``httpx.AsyncHTTPTransport`` of one connection,
    lent to one attempt at a time.

    httpcore's own pool, when a burst of requests meets its idle keep-alive connections,
    assigns several requests to the same idle connection; all but one then retry, and each
    retry scans the whole pool again (512 requests over 8 pools of 64 took 8 s of CPU).
    Lending one-connection transports from a free list makes a burst cost O(1) per request.
    The most recently returned one is lent first (its connection is the warmest), and at most
    ``keep`` idle ones are kept: the rest are closed when they come back. A ``shared``
    transport (tests) is lent to every attempt at once and closed only by :meth:`close`.
    """

    def __init__(
        self,
        new: Callable[[], httpx.AsyncBaseTransport],
        keep: int,
        shared: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._new = new
        self._keep = keep
        self._shared = shared
        self._idle: list[httpx.AsyncBaseTransport] = []
        self._lent: set[httpx.AsyncBaseTransport] = set()
        self._closed = False

    def take(self) -> httpx.AsyncBaseTransport:
        """An idle transport, or a new one."""
        if self._shared is not None:
            return self._shared
        transport = self._idle.pop() if self._idle else self._new()
        self._lent.add(transport)
        return transport

    def give(self, transport: httpx.AsyncBaseTransport) -> None:
        """Take ``transport`` back; closed (in the background) if enough are idle already."""
        if transport is self._shared:
            return
        self._lent.discard(transport)
        if not self._closed and len(self._idle) < self._keep:
            self._idle.append(transport)
            return
        task = asyncio.get_running_loop().create_task(transport.aclose())
        _closing.add(task)
        task.add_done_callback(_closing.discard)

    def close(self) -> list[httpx.AsyncBaseTransport]:
        """Every transport, lent or idle, for the caller to close; later returns are closed."""
        self._closed = True
        transports = [*self._idle, *self._lent]
        if self._shared is not None:
            transports.append(self._shared)
        self._idle.clear()
        self._lent.clear()
        return transports


# Closes started by _Connections.give, kept until done (a task nobody holds may be collected).
_closing: set[asyncio.Task[None]] = set()


class HttpChatModel:
    """A :class:`ChatModel` and :class:`AsyncChatModel` over HTTP, to any OpenAI-compatible
    server.

    :meth:`acomplete` is a coroutine of the loop that awaits it, on a connection of that
    loop (an ``httpx`` transport: the client layer's redirects, cookies and auth are not
    needed, and cost a third of a request's CPU): cancelling its task closes the connection,
    which is what makes llama.cpp stop generating. :meth:`complete` is the same for a caller in
    a plain thread. Each attempt has a deadline of ``timeout_s`` from connect to the last byte,
    whatever the server's pace, and reads at most ``max_answer_bytes``. A failure a retry can
    help is retried up to ``retries`` times.
    """

    uses_slots = True
    """Requests go to llama.cpp slots (``id_slot``), which the model service guards."""

    def __init__(
        self,
        config: ModelConfig,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        connections: int | None = None,
    ):
        """Connect lazily to ``config.base_url``; ``transport`` replaces the network (tests).

        ``connections`` is how many idle keep-alive connections each loop keeps (default: at
        least 64, and at least ``config.concurrency``). A request never queues inside the
        client: each attempt takes an idle connection or opens a new one.
        """
        self._config = config
        self._url = config.base_url.rstrip("/") + "/chat/completions"
        self._http_url = httpx.URL(self._url)
        self._headers = {"Content-Type": "application/json"}
        api_key = config.api_key()
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._connections = connections or max(_MIN_CONNECTIONS, config.concurrency)
        self._transport = transport
        self._lock = threading.Lock()
        self._closed = False
        self._clients: dict[asyncio.AbstractEventLoop, _Connections] = {}
        # One TLS context for all connections: each costs a read of the CA bundle (~0.1 s).
        self._tls: ssl.SSLContext | None = None
        # complete() calls in flight, each a task on a loop of its own: close() cancels them.
        self._calls: set[tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = set()

    @property
    def url(self) -> str:
        """The endpoint every request is posted to: ``<base_url>/chat/completions``."""
        return self._url

    # Async.

    streams = True
    """:meth:`acomplete` and :meth:`complete` take ``on_text`` for a streamed request."""

    async def acomplete(
        self, request: ModelRequest, on_text: Callable[[str], None] | None = None
    ) -> ModelAnswer:
        """POST ``request`` and parse the answer; raise :class:`ModelFailure` naming the cause.

        A request with ``options.stream`` asks for server-sent events and builds the answer from
        them, calling ``on_text`` with each piece of its text as it arrives; a stream that
        breaks off is a failure a retry can help (a retried answer's text is given again).

        After the last attempt the message names the last failure's cause and, if there was more
        than one attempt, how many were made. Cancelling the task stops the request at once,
        a wait before a retry included.
        """
        try:
            content = encode_body(self._config.name, request, max_tokens=self._config.max_tokens)
        except ValueError as exc:
            raise ModelFailure(f"cannot send the request to the model: {exc}") from exc
        attempt = 0
        while True:
            connections = self._connections_here()
            transport = connections.take()
            try:
                return await self._attempt(transport, request, content, on_text)
            except asyncio.CancelledError:
                if self._closed:
                    raise ModelFailure("the model client was closed during the request") from None
                raise
            except _Failed as failed:
                if not failed.retry or attempt == self._config.retries:
                    cause = failed.cause
                    if attempt:
                        cause += f" (after {attempt + 1} attempts)"
                    failure = ModelFailure(
                        cause,
                        context_exceeded=failed.context_exceeded,
                        context_tokens=failed.context_tokens,
                    )
                    failure.cut = failed.cut
                    raise failure from failed.error
                delay = retry_delay(attempt, failed.headers, self._config)
                if failed.cut:  # the server may still work on it: let it notice first
                    delay = max(delay, self._config.disconnect_grace_s)
            finally:
                connections.give(transport)
            try:
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                if self._closed:
                    raise ModelFailure(
                        "the model client was closed while waiting to retry"
                    ) from None
                raise
            attempt += 1

    async def _attempt(
        self,
        transport: httpx.AsyncBaseTransport,
        request: ModelRequest,
        content: bytes,
        on_text: Callable[[str], None] | None = None,
    ) -> ModelAnswer:
        cap = self._config.max_answer_bytes
        try:
            # The deadline is asyncio.timeout's, around the whole attempt; httpx's own timeouts
            # per read would only add work to every request.
            async with asyncio.timeout(self._config.timeout_s):
                http_request = httpx.Request(
                    "POST", self._http_url, headers=self._headers, content=content
                )
                response = await transport.handle_async_request(http_request)
                response.request = http_request  # as the client layer does: response.url
                try:
                    if request.options.stream and response.is_success:
                        return await _read_stream(response, request, cap, on_text)
                    body = await _read_capped(response, cap)
                finally:
                    # Closing a response not read to its end closes its connection.
                    await response.aclose()
        except TimeoutError as exc:
            raise _Failed(self._timed_out(), retry=True, cut=True, error=exc) from None
        except _TooLarge:
            raise _Failed(answer_too_large(cap), retry=False, cut=True) from None
        except _Broken as broken:
            raise _Failed(str(broken), retry=True, cut=True) from None
        except httpx.HTTPError as exc:
            cut = not isinstance(exc, httpx.ConnectError)
            cause = self._transport_cause(exc)
            raise _Failed(cause, retry=is_retryable(exc), cut=cut, error=exc) from None
        status = response.status_code
        if response.is_success:
            return parse_answer(request.session, request.request_id, body)
        failure = http_failure(self._url, status, body)
        headers = response.headers if status in _RETRY_AFTER_STATUSES else None
        raise _Failed(
            str(failure),
            retry=is_retryable(status, body),
            cut=False,
            headers=headers,
            context_exceeded=failure.context_exceeded,
            context_tokens=failure.context_tokens,
        )

    def _connections_here(self) -> _Connections:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._closed:
                raise ModelFailure("the model client is closed")
            connections = self._clients.get(loop)
            if connections is None:
                new: Callable[[], httpx.AsyncBaseTransport]
                if self._http_url.scheme == "http":
                    # Plain HTTP (a llama.cpp server, say): one connection on asyncio's own
                    # sockets, with no pool: half the CPU a request (actors.models.netbackend).
                    new = plain_transport
                else:
                    one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
                    if self._tls is None:
                        self._tls = httpx.create_ssl_context()
                    new = functools.partial(httpx.AsyncHTTPTransport, verify=self._tls, limits=one)
                connections = self._clients[loop] = _Connections(
                    new,
                    keep=self._connections,
                    shared=self._transport,
                )
            return connections

    def _timed_out(self) -> str:
        return f"the model at {self._url} did not answer within {self._config.timeout_s:g} s"

    def _transport_cause(self, exc: httpx.HTTPError) -> str:
        # A timeout first: a connect timeout is a timeout, not a refusal.
        if isinstance(exc, httpx.TimeoutException):
            return self._timed_out()
        if isinstance(exc, httpx.ConnectError):
            return f"cannot reach the model at {self._url}: {exc}"
        return f"the request to the model at {self._url} failed: {exc}"

    async def aclose(self) -> None:
        """Close the connections of the running loop."""
        with self._lock:
            connections = self._clients.pop(asyncio.get_running_loop(), None)
        for transport in connections.close() if connections is not None else []:
            await transport.aclose()

    # Sync.

    def complete(
        self, request: ModelRequest, on_text: Callable[[str], None] | None = None
    ) -> ModelAnswer:
        """:meth:`acomplete` for a caller in a thread without a running loop (blocks).

        :meth:`close` from another thread ends it at once with a :class:`ModelFailure`.
        """
        try:
            return asyncio.run(self._complete_here(request, on_text))
        except asyncio.CancelledError:
            raise ModelFailure("the model client is closed") from None

    async def _complete_here(
        self, request: ModelRequest, on_text: Callable[[str], None] | None
    ) -> ModelAnswer:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        with self._lock:
            if self._closed:
                raise ModelFailure("the model client is closed")
            self._calls.add((loop, task))
        try:
            return await self.acomplete(request, on_text)
        finally:
            with self._lock:
                self._calls.discard((loop, task))
            await self.aclose()

    def close(self) -> None:
        """Stop every request of :meth:`complete` (and any wait before a retry); later calls
        fail. Loops that still hold connections should :meth:`aclose` them first."""
        with self._lock:
            self._closed = True
            calls, self._calls = set(self._calls), set()
            clients, self._clients = dict(self._clients), {}
        for loop, task in calls:
            with contextlib.suppress(RuntimeError):  # that loop has just ended
                loop.call_soon_threadsafe(task.cancel)
        for loop, held in clients.items():
            for transport in held.close():
                if not loop.is_closed() and loop.is_running():
                    with contextlib.suppress(RuntimeError):
                        asyncio.run_coroutine_threadsafe(transport.aclose(), loop)


def props_url(base_url: str) -> str:
    """Where llama.cpp serves its ``/props``: beside ``/v1`` (a proxy's path prefix kept)."""
    base = base_url.rstrip("/")
    return base.removesuffix("/v1") + "/props"


def read_total_slots(config: ModelConfig) -> int:
    """The server's slot count, ``total_slots`` from ``GET /props`` (llama.cpp).

    Raises :class:`ModelFailure` naming the URL and what was wrong.
    """
    url = props_url(config.base_url)
    headers = {}
    api_key = config.api_key()
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        response = httpx.get(url, headers=headers, timeout=min(config.timeout_s, 30.0))
    except httpx.HTTPError as exc:
        raise ModelFailure(f"cannot read the server's slot count from {url}: {exc}") from exc
    if not response.is_success:
        raise ModelFailure(
            f"cannot read the server's slot count from {url}: HTTP {response.status_code}"
        )
    try:
        total = msgspec.json.decode(response.content).get("total_slots")
    except (msgspec.DecodeError, AttributeError):
        total = None
    if not isinstance(total, int) or isinstance(total, bool) or total < 1:
        raise ModelFailure(f"the server's {url} has no total_slots of at least 1")
    return total
