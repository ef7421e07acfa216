"""The model client over HTTP: one OpenAI-compatible ``POST <base_url>/chat/completions`` a request.

:class:`HttpChatModel` sends the bodies :mod:`actors.models.wire` builds and reads the answers it
parses, as a coroutine on an asyncio loop (the model service's, see
:mod:`actors.services.model_service`). Failures a retry can help (see :func:`is_retryable`) are
retried a bounded number of times, after the wait :func:`retry_delay` gives.
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
from typing import Any

import httpx

from actors.core.config import ModelConfig
from actors.models.base import ModelFailure
from actors.models.llama import props_url, read_total_slots
from actors.models.netbackend import plain_transport
from actors.models.stream import StreamAssembler, StreamBroken
from actors.models.wire import (
    answer_too_large,
    encode_body,
    http_failure,
    names_request_fault,
    parse_answer,
    prompt_token_limit,
)
from messages import ModelAnswer, ModelRequest

__all__ = [
    "HttpChatModel",
    "is_retryable",
    "props_url",
    "read_total_slots",
    "retry_delay",
]

# At least this many idle keep-alive connections are kept per loop (more if the configured
# concurrency asks for it).
_MIN_CONNECTIONS = 64


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


# --- the request ------------------------------------------------------------------------------


# --- the answer -------------------------------------------------------------------------------


# --- retries --------------------------------------------------------------------------------


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
        return not names_request_fault(body)
    return isinstance(failure, _RETRY_ERRORS)


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


_NEWLINES = (b"\n", b"\r")


async def _read_stream(
    response: httpx.Response,
    request: ModelRequest,
    cap: int,
    on_text: Callable[[str], None] | None,
    prompt_limit: int | None = None,
) -> ModelAnswer:
    """The answer of a server-sent event stream, each text piece given to ``on_text`` as it
    comes; :class:`_TooLarge` as soon as ``cap`` bytes have come (a line without its end
    included), :class:`_Broken` if it ends too soon.

    A server that ignores ``"stream": true`` and sends one JSON body has that body read as the
    answer (its text given to ``on_text`` at once).
    """

    assembler = StreamAssembler()
    # Until a data: line shows that the server streams, the bytes are kept: they may be a
    # whole JSON answer instead (never more than cap).
    head: list[bytes] | None = []
    partial: list[bytes] = []  # the line being read, in pieces, until its end comes
    size = 0

    def feed(raw: bytes) -> None:
        text = assembler.feed(raw.decode("utf-8", "replace"))
        if text and on_text is not None:
            on_text(text)

    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > cap:
            raise _TooLarge
        if head is not None:
            head.append(chunk)
        if not any(mark in chunk for mark in _NEWLINES):
            partial.append(chunk)  # no line ends here: nothing to split, nothing copied
            continue
        partial.append(chunk)
        lines = b"".join(partial).splitlines(keepends=True)
        partial = [] if lines[-1].endswith(_NEWLINES) else [lines.pop()]
        for line in lines:
            feed(line.rstrip(b"\r\n"))
            if assembler.streamed:
                head = None
            if assembler.done:
                break
        if assembler.done:
            break
    else:
        if partial:
            try:  # the last line, without its end: maybe cut off in its middle
                feed(b"".join(partial))
            except ModelFailure:
                if not assembler.ended:
                    raise _Broken(
                        f"the model's streamed answer broke off in a line ({response.url})"
                    ) from None
    if not assembler.streamed and head and b"".join(head).strip():
        return _unstreamed(response, request, b"".join(head), on_text, prompt_limit)
    try:
        return assembler.answer(request.session, request.request_id, prompt_limit=prompt_limit)
    except StreamBroken as exc:
        raise _Broken(f"{exc} (the model at {response.url})") from None


def _unstreamed(
    response: httpx.Response,
    request: ModelRequest,
    body: bytes,
    on_text: Callable[[str], None] | None,
    prompt_limit: int | None,
) -> ModelAnswer:
    """The answer of a server that was asked to stream but sent one body: read as a whole
    answer, or a failure saying the server did not stream."""
    try:
        answer = parse_answer(request.session, request.request_id, body, prompt_limit=prompt_limit)
    except ModelFailure as exc:
        kind = response.headers.get("content-type", "no content type")
        raise ModelFailure(
            f"the model at {response.url} did not stream its answer (asked with "
            f'"stream": true, it sent one {kind} body with no data: lines), and that body is '
            f"not a chat-completions answer either: {exc}"
        ) from None
    if answer.content and on_text is not None:
        on_text(answer.content)
    return answer


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
        limit = prompt_token_limit(len(content))
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
                        return await _read_stream(response, request, cap, on_text, limit)
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
            return parse_answer(request.session, request.request_id, body, prompt_limit=limit)
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
