"""The model client over HTTP: one OpenAI-compatible ``POST <base_url>/chat/completions`` a request.

:class:`HttpChatModel` sends the bodies :mod:`actors.models.wire` builds and reads the answers it
parses, as a coroutine on an asyncio loop (the model service's, see
:mod:`actors.services.model_service`), with aiohttp (its C parser): about a third of the CPU a
request cost on httpx and httpcore, and no pool contention at hundreds of requests in flight
(docs/performance.md). Failures a retry can help (see :func:`is_retryable`) are retried a bounded
number of times, after the wait :func:`retry_delay` gives.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
import httpx
import yarl

from actors.core.config import ModelConfig
from actors.models.base import ModelFailure
from actors.models.llama import props_url, read_total_slots, tls_context
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

# An idle keep-alive connection is closed after this many seconds (llama-server keeps its own
# for 5 s by default: a connection it closed first is seen closed and not reused).
_KEEPALIVE_S = 4.0

# Statuses a retry can help: rate limited, or a server error that may be passing.
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# Statuses whose Retry-After header is honoured.
_RETRY_AFTER_STATUSES = frozenset({429, 503})
# Transport failures a retry can help: no connection, a connection reset or closed early, an
# answer that is not HTTP, no answer in time. httpx's are kept for callers that still pass them.
_RETRY_ERRORS = (
    aiohttp.ClientConnectionError,
    aiohttp.ClientPayloadError,
    aiohttp.ClientResponseError,
    OSError,
    TimeoutError,
    httpx.TimeoutException,
    httpx.ConnectError,
    httpx.RemoteProtocolError,
    httpx.ReadError,
    httpx.WriteError,
)
# Failures no retry helps: a URL aiohttp cannot send to.
_NEVER_RETRY = (aiohttp.InvalidURL,)
# At most this fraction is added at random to a backoff, so clients that failed together spread.
_JITTER = 0.1


# --- retries --------------------------------------------------------------------------------


def is_retryable(failure: BaseException | int, body: bytes = b"") -> bool:
    """Whether a retry can help after ``failure``: a transport error, or an HTTP status code
    with the response ``body``.

    True for no connection, a connection reset, a timeout, and HTTP 429, 500, 502, 503 and 504,
    unless the body's error type names a fault of the request itself (``invalid_request_error``,
    ``exceed_context_size_error``...); false for anything else (another 4xx, a URL that cannot
    be sent to). An answer that cannot be parsed is never retried.
    """
    if isinstance(failure, int):
        if failure not in _RETRY_STATUSES:
            return False
        return not names_request_fault(body)
    if isinstance(failure, _NEVER_RETRY):
        return False
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

    A ``Retry-After`` in ``headers`` (seconds, or an HTTP date; the name in any case) is
    honoured; pass the headers only for a status where the server means it (429, 503).
    Otherwise the wait is ``retry_backoff_s * 2**attempt`` plus up to 10 % jitter. Never more
    than ``retry_max_wait_s``.
    """
    if headers is not None:
        value = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
        after = _retry_after_s(value)
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
        headers: Mapping[str, str] | None = None,
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
    response: aiohttp.ClientResponse,
    url: str,
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

    assembler = StreamAssembler(max_bytes=cap)
    # Until a data: line shows that the server streams, the bytes are kept: they may be a
    # whole JSON answer instead (never more than cap).
    head: list[bytes] | None = []
    partial: list[bytes] = []  # the line being read, in pieces, until its end comes
    size = 0

    def feed(raw: bytes) -> None:
        text = assembler.feed(raw.decode("utf-8", "replace"))
        if text and on_text is not None:
            on_text(text)

    async for chunk in response.content.iter_any():
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
                        f"the model's streamed answer broke off in a line ({url})"
                    ) from None
    if not assembler.streamed and head and b"".join(head).strip():
        kind = response.headers.get("content-type", "no content type")
        return _unstreamed(url, kind, request, b"".join(head), on_text, prompt_limit, cap)
    try:
        return assembler.answer(request.session, request.request_id, prompt_limit=prompt_limit)
    except StreamBroken as exc:
        raise _Broken(f"{exc} (the model at {url})") from None


def _unstreamed(
    url: str,
    kind: str,
    request: ModelRequest,
    body: bytes,
    on_text: Callable[[str], None] | None,
    prompt_limit: int | None,
    cap: int,
) -> ModelAnswer:
    """The answer of a server that was asked to stream but sent one body (of content type
    ``kind``): read as a whole answer, or a failure saying the server did not stream."""
    try:
        answer = parse_answer(
            request.session, request.request_id, body, prompt_limit=prompt_limit, max_bytes=cap
        )
    except ModelFailure as exc:
        raise ModelFailure(
            f"the model at {url} did not stream its answer (asked with "
            f'"stream": true, it sent one {kind} body with no data: lines), and that body is '
            f"not a chat-completions answer either: {exc}"
        ) from None
    if answer.content and on_text is not None:
        on_text(answer.content)
    return answer


async def read_capped(response: aiohttp.ClientResponse, cap: int) -> bytes:
    """The body of ``response``, or :class:`_TooLarge` as soon as it passes ``cap`` bytes (a
    declared length past it is refused before any of the body is read)."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise _TooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > cap:
            raise _TooLarge  # stop reading: the caller closes the connection
        chunks.append(chunk)
    return b"".join(chunks)


def new_session(tls: ssl.SSLContext | None) -> aiohttp.ClientSession:
    """An aiohttp session for the running loop: no limit on connections (a request never
    queues in the client: the model service bounds them), idle keep-alive connections kept
    :data:`_KEEPALIVE_S`, no timeouts of its own (the caller's deadline is for the whole
    answer), no cookies, and ``tls`` for ``https://``."""
    connector = aiohttp.TCPConnector(
        limit=0, keepalive_timeout=_KEEPALIVE_S, ssl=tls if tls is not None else True
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None),
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=True,
    )


class HttpChatModel:
    """A :class:`ChatModel` and :class:`AsyncChatModel` over HTTP, to any OpenAI-compatible
    server.

    :meth:`acomplete` is a coroutine of the loop that awaits it, on that loop's aiohttp session:
    its keep-alive connections are pooled for the endpoint, each lent to one request at a
    time. Cancelling the task closes the request's connection at once, which is what makes
    llama.cpp stop generating. :meth:`complete` is the same for a caller in a plain thread.
    Each attempt has a deadline of ``timeout_s`` from connect to the last byte, whatever the
    server's pace, and reads at most ``max_answer_bytes`` (a streamed answer too). A failure a
    retry can help is retried up to ``retries`` times.
    """

    uses_slots = True
    """Requests go to llama.cpp slots (``id_slot``), which the model service guards."""

    def __init__(self, config: ModelConfig) -> None:
        """Connect lazily to ``config.base_url``."""
        self._config = config
        self._url = config.base_url.rstrip("/") + "/chat/completions"
        self._headers = {"Content-Type": "application/json"}
        api_key = config.api_key()
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        # Credentials in the URL are not sent (as before, on httpx's transport): the API key is.
        self._target = yarl.URL(self._url).with_user(None)
        self._lock = threading.Lock()
        self._closed = False
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
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
            try:
                return await self._attempt(self._session_here(), request, content, on_text)
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
        session: aiohttp.ClientSession,
        request: ModelRequest,
        content: bytes,
        on_text: Callable[[str], None] | None = None,
    ) -> ModelAnswer:
        cap = self._config.max_answer_bytes
        limit = prompt_token_limit(len(content))
        try:
            # The deadline is asyncio.timeout's, around the whole attempt (aiohttp's own are off).
            async with asyncio.timeout(self._config.timeout_s):
                response = await session.post(
                    self._target, data=content, headers=self._headers, allow_redirects=False
                )
                try:
                    if request.options.stream and response.ok:
                        answer = await _read_stream(
                            response, self._url, request, cap, on_text, limit
                        )
                        response.release()
                        return answer
                    body = await read_capped(response, cap)
                except BaseException:
                    # Not read to its end (too large, cancelled, out of time): the connection
                    # is closed at once, never lent again, and the server sees it go.
                    response.close()
                    raise
                response.release()
        except TimeoutError as exc:
            raise _Failed(self._timed_out(), retry=True, cut=True, error=exc) from None
        except _TooLarge:
            raise _Failed(answer_too_large(cap), retry=False, cut=True) from None
        except _Broken as broken:
            raise _Failed(str(broken), retry=True, cut=True) from None
        except (aiohttp.ClientError, OSError) as exc:
            cut = not isinstance(exc, aiohttp.ClientConnectorError)
            cause = self._transport_cause(exc)
            raise _Failed(cause, retry=is_retryable(exc), cut=cut, error=exc) from None
        status = response.status
        if response.ok:
            return parse_answer(
                request.session, request.request_id, body, prompt_limit=limit, max_bytes=cap
            )
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

    def _session_here(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._closed:
                raise ModelFailure("the model client is closed")
            session = self._sessions.get(loop)
            if session is None:
                if self._tls is None and self._url.startswith("https:"):
                    self._tls = tls_context()
                session = self._sessions[loop] = new_session(self._tls)
            return session

    def _timed_out(self) -> str:
        return f"the model at {self._url} did not answer within {self._config.timeout_s:g} s"

    def _transport_cause(self, exc: BaseException) -> str:
        if isinstance(exc, aiohttp.ClientConnectorError):
            return f"cannot reach the model at {self._url}: {exc}"
        detail = str(exc) or type(exc).__name__
        return f"the request to the model at {self._url} failed: {detail}"

    async def aclose(self) -> None:
        """Close the connections of the running loop."""
        with self._lock:
            session = self._sessions.pop(asyncio.get_running_loop(), None)
        if session is not None:
            await session.close()

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
            sessions, self._sessions = dict(self._sessions), {}
        for loop, task in calls:
            with contextlib.suppress(RuntimeError):  # that loop has just ended
                loop.call_soon_threadsafe(task.cancel)
        for loop, session in sessions.items():
            if not loop.is_closed() and loop.is_running():
                with contextlib.suppress(RuntimeError):
                    asyncio.run_coroutine_threadsafe(session.close(), loop)
