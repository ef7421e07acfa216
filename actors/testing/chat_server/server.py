"""A fake OpenAI-compatible chat-completions server, for tests that cross real HTTP.

::

    with ChatServer([call("echo", text="hi"), reply("done")]) as server:
        config = ModelConfig(base_url=server.base_url)
        ...  # run a turn against it
        assert server.requests[0]["id_slot"] == 0

The server listens on ``127.0.0.1`` on a free port, records every request body, and answers from
a script: a list of :class:`~actors.testing.script.Answer` / ``RawResponse`` consumed in order,
or a callable that gets the request body and returns one. A step may be wrapped to answer
slowly: :class:`Delayed` (after a pause), :class:`Drip` (one byte at a time), :class:`Endless`
(a body that never ends).

The server also keeps what a test of the client's connection handling needs to see:
:attr:`ChatServer.closed` (requests whose client closed the connection before the answer was
sent), and :attr:`ChatServer.overlaps` (requests that arrived for an ``id_slot`` that already had
one in flight: with llama.cpp that mixes two sessions' prompts). With ``total_slots`` it serves
llama.cpp's ``GET /props``. With ``log`` it writes one JSON line per request it receives.
"""

from __future__ import annotations

import functools
import json
import select
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from actors.models.offline import allow_fake_server
from actors.testing.script import Answer, RawResponse, ScriptBook

__all__ = [
    "ChatServer",
    "Closed",
    "Delayed",
    "Drip",
    "Endless",
    "ScriptFunction",
    "Step",
    "sse_body",
]


@dataclass(frozen=True)
class Delayed:
    """Send ``step`` after ``seconds``; a client that closes the connection meanwhile is seen
    at once (recorded in :attr:`ChatServer.closed`) and gets nothing."""

    step: Answer | RawResponse
    seconds: float


@dataclass(frozen=True)
class Drip:
    """Send ``step``'s headers at once, then its body one byte every ``interval_s`` seconds."""

    step: Answer | RawResponse
    interval_s: float = 1.0


@dataclass(frozen=True)
class Endless:
    """Status 200 and a body that never ends: ``chunk`` again and again until the client closes
    the connection."""

    chunk: bytes = b'{"choices": [' + b" " * 4090 + b"\n"


@dataclass(frozen=True)
class Closed:
    """Request number ``number`` (from 1), on ``id_slot`` ``slot``, whose client closed the
    connection before its answer was complete; ``at`` is ``time.monotonic()`` then."""

    number: int
    slot: int | None
    at: float


Step = Answer | RawResponse | Delayed | Drip | Endless
"""What a script gives for one request."""

ScriptFunction = Callable[[dict[str, Any]], Step]
"""A script as a function: it gets each decoded request body and returns the answer to send."""

_PATH = "/v1/chat/completions"
_POLL_S = 0.02


class _ClientGone(Exception):
    pass


def _by_model(book: ScriptBook[dict[str, Any], Step], body: dict[str, Any]) -> Step:
    return book.answer(body.get("model"), body)


def sse_body(response: dict[str, Any], piece: int = 4) -> bytes:
    r"""``response`` (a whole ``chat.completion``) as a server streams it: ``data:`` lines of
    ``chat.completion.chunk``\ s, the text and each call's arguments ``piece`` characters at a
    time, then ``finish_reason``, the ``usage`` (if any) and ``data: [DONE]``.

    Cut its bytes short to play a stream that breaks off.
    """
    choice = response["choices"][0]
    message = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": response.get("id", "chatcmpl"),
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    chunks = [chunk({"role": "assistant", "content": ""})]
    text = message.get("content") or ""
    chunks += [chunk({"content": text[i : i + piece]}) for i in range(0, len(text), piece)]
    for index, call in enumerate(message.get("tool_calls") or ()):
        head = {"index": index, "id": call["id"], "type": "function"}
        chunks.append(
            chunk(
                {
                    "tool_calls": [
                        {**head, "function": {"name": call["function"]["name"], "arguments": ""}}
                    ]
                }
            )
        )
        arguments = call["function"]["arguments"]
        for i in range(0, len(arguments), piece):
            part = {"index": index, "function": {"arguments": arguments[i : i + piece]}}
            chunks.append(chunk({"tool_calls": [part]}))
    chunks.append(chunk({}, choice.get("finish_reason") or "stop"))
    if "usage" in response:
        chunks.append(
            {"object": "chat.completion.chunk", "choices": [], "usage": response["usage"]}
        )
    lines = [f"data: {json.dumps(c)}\n\n" for c in chunks] + ["data: [DONE]\n\n"]
    return "".join(lines).encode()


def _json_error(status: int, message: str) -> RawResponse:
    body = json.dumps({"error": {"message": message, "type": "chat_server_error"}})
    return RawResponse(
        status=status, body=body.encode(), headers={"Content-Type": "application/json"}
    )


class _Server(ThreadingHTTPServer):
    # Handler threads must not keep the test process alive, nor be joined on close: a test may
    # leave one blocked in its script (a timeout test) while the server stops.
    daemon_threads = True
    # Many clients connect at once (a fan-out of children): a short listen queue would drop
    # their SYNs and make them wait a second for the retransmission.
    request_queue_size = 1024
    chat: ChatServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (a timeout test) makes the late write fail; that is expected
        # and must not print a traceback. Anything else is recorded for the test to see.
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            return
        self.chat._record_error(f"the handler failed: {exc!r}")


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    _number: int = 0
    _slot: int | None = None

    def log_message(self, format: str, *args: Any) -> None:
        # Quiet: no line on stderr per request.
        pass

    def do_POST(self) -> None:
        if self.path != _PATH:
            self.server.chat._log_request("POST", self.path)
            self._send(_json_error(404, f"no such path: {self.path}"))
            return
        self._number, self._slot, self._over_told = 0, None, False
        try:
            self._post()
        except (_ClientGone, ConnectionError):
            self.close_connection = True
            self.server.chat._record_closed(self._number, self._slot)
        finally:
            self._over()

    def _over(self) -> None:
        """The request is no longer in flight on its slot (once: a second call does nothing)."""
        if self._number and not self._over_told:
            self._over_told = True
            self.server.chat._request_over(self._slot)

    def _post(self) -> None:
        """Answer one chat request; ``_number`` and ``_slot`` say which, once it counts."""
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except ValueError as exc:
            self.server.chat._log_request("POST", self.path, raw=raw)
            self.server.chat._record_error(f"a request body is not JSON: {exc}")
            self._send(_json_error(400, f"the request body is not JSON: {exc}"))
            return
        if not isinstance(body, dict):
            self.server.chat._log_request("POST", self.path, raw=raw)
            self.server.chat._record_error("a request body is not a JSON object")
            self._send(_json_error(400, "the request body is not a JSON object"))
            return
        headers = {key.lower(): value for key, value in self.headers.items()}
        slot = body.get("id_slot")
        slot = slot if isinstance(slot, int) else None
        chat = self.server.chat
        number = self._number = chat._arrived(body, headers, slot)
        self._slot = slot
        step = chat._answer(body, number)
        if isinstance(step, Delayed):
            self._pause(step.seconds)
            step = step.step
        if isinstance(step, Drip):
            self._drip(chat._response(step.step, body, number), step.interval_s)
        elif isinstance(step, Endless):
            self._endless(step.chunk)
        else:
            response = chat._response(step, body, number)
            # The slot is free once the answer is made, before its bytes go out, as llama.cpp
            # frees a slot when generation ends: a client that reads the answer and sends the
            # next request on another connection at once must not look like an overlap.
            self._over()
            self._send(response)

    def do_GET(self) -> None:
        self.server.chat._log_request("GET", self.path)
        total = self.server.chat.total_slots
        if self.path.rstrip("/") == "/props" and total is not None:
            props = {"total_slots": total, "default_generation_settings": {"n_ctx": 4096 * total}}
            body = json.dumps(props).encode()
            self._send(RawResponse(body=body, headers={"Content-Type": "application/json"}))
            return
        self._send(_json_error(404, f"no such path: {self.path}"))

    # Slow answers that notice a client that went away.

    def _client_gone(self, wait_s: float) -> bool:
        """Wait up to ``wait_s`` for the client to close the connection; True if it did."""
        sock = self.connection
        readable, _, _ = select.select([sock], [], [], wait_s)
        if not readable:
            return False
        try:
            peeked: bytes = sock.recv(1, socket.MSG_PEEK)
        except OSError:
            return True
        return peeked == b""

    def _pause(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if self._client_gone(min(left, _POLL_S)):
                raise _ClientGone
            if self.server.chat._stopping.is_set():
                raise _ClientGone

    def _drip(self, response: RawResponse, interval_s: float) -> None:
        self._head(response, len(response.body))
        for i in range(len(response.body)):
            self.wfile.write(response.body[i : i + 1])
            self.wfile.flush()
            self._pause(interval_s)

    def _endless(self, chunk: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()  # no length: the body ends when the connection does (HTTP/1.0)
        while not self.server.chat._stopping.is_set():
            self.wfile.write(chunk)
            if self._client_gone(0):
                raise _ClientGone

    def _head(self, response: RawResponse, length: int) -> None:
        self.send_response(response.status)
        for key, value in response.headers.items():
            self.send_header(key, value)
        if not any(key.lower() == "content-length" for key in response.headers):
            self.send_header("Content-Length", str(length))
        self.end_headers()
        self.wfile.flush()

    def _send(self, response: RawResponse) -> None:
        self.send_response(response.status)
        for key, value in response.headers.items():
            self.send_header(key, value)
        if not any(key.lower() == "content-length" for key in response.headers):
            self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        self.wfile.write(response.body)


class ChatServer:
    """A fake chat-completions server on ``127.0.0.1``, answering from a script.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`. It serves
    ``POST /v1/chat/completions`` (anything else is 404), handling requests concurrently.
    A list script answers in order; once it runs out every further request gets HTTP 500 and the
    fact is recorded in :attr:`errors`. A callable script gets each request body. A mapping
    gives one script (list or callable) per request ``model``, so each agent profile's model
    plays its own part: ``ChatServer({"big": [call("subagent", ...)], "small": [reply(..)]})``.
    A script (or a callable's) ``LookupError`` is an answer it has not: HTTP 500, recorded.
    """

    def __init__(
        self,
        script: Sequence[Step] | ScriptFunction | Mapping[str, Sequence[Step] | ScriptFunction],
        *,
        total_slots: int | None = None,
        log: str | Path | None = None,
    ):
        """Prepare a server answering from ``script``; nothing listens before :meth:`start`.

        ``total_slots`` makes it answer ``GET /props`` like llama-server with that many slots.
        ``log`` names a file that :meth:`start` empties, then gets one JSON line per request
        received, written as it arrives (before its answer): ``n`` (the request's number, as
        in :attr:`requests`; none for a request that is not a chat request), ``at`` (Unix
        time), ``method``, ``path``, and ``body`` (the decoded body) or ``raw`` (a body that is
        not a JSON object, as text). Headers are left out: they may carry an API key.
        """
        if isinstance(script, Mapping):
            book: ScriptBook[dict[str, Any], Step] = ScriptBook(script)
            script = functools.partial(_by_model, book)
        self._function: ScriptFunction | None = script if callable(script) else None
        self._script: list[Step] = [] if callable(script) else list(script)
        self.total_slots = total_slots
        self._next = 0
        self._call_number = 0
        self._requests: list[dict[str, Any]] = []
        self._headers: list[dict[str, str]] = []
        self._errors: list[str] = []
        self._closed: list[Closed] = []
        self._arrivals: list[float] = []
        self._in_flight: dict[int | None, int] = {}
        self._overlaps: list[tuple[int, int]] = []
        self._most_in_flight = 0
        self._stopping = threading.Event()
        self._changed = threading.Condition()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._log_path = log
        self._log: IO[str] | None = None

    # --- life ---

    def start(self, port: int = 0) -> ChatServer:
        """Listen on ``port`` (a free one by default) and serve in a daemon thread; returns self."""
        if self._server is not None:
            raise RuntimeError("the chat server is already started")
        if self._log_path is not None:
            self._log = open(self._log_path, "w", encoding="utf-8")  # noqa: SIM115 (until stop)
        try:
            server = _Server(("127.0.0.1", port), _Handler)
        except OSError:
            if self._log is not None:
                self._log.close()
                self._log = None
            raise
        server.chat = self
        self._stopping.clear()
        self._server = server
        # serve_forever only notices shutdown() between polls; a short poll keeps stop() fast.
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": _POLL_S},
            name=f"chat-server-{self.port}",
            daemon=True,
        )
        self._thread.start()
        allow_fake_server(self.base_url, running=True)
        return self

    def stop(self) -> None:
        """Stop serving and close the socket. Safe to call twice."""
        server, thread = self._server, self._thread
        if server is None:
            return
        allow_fake_server(self.base_url, running=False)
        self._stopping.set()  # slow answers end now
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join()
        self._server = None
        self._thread = None
        with self._changed:
            if self._log is not None:
                self._log.close()
                self._log = None

    def __enter__(self) -> ChatServer:
        """Start the server."""
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the server."""
        self.stop()

    # --- what users look at ---

    @property
    def port(self) -> int:
        """The port the server listens on (only once started)."""
        if self._server is None:
            raise RuntimeError("the chat server is not started")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``: the ``model.base_url`` to configure."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def requests(self) -> list[dict[str, Any]]:
        """A copy of the decoded JSON bodies received so far, in arrival order."""
        with self._changed:
            return list(self._requests)

    @property
    def request_headers(self) -> list[dict[str, str]]:
        """The HTTP headers of each recorded request (names in lower case), as ``requests``."""
        with self._changed:
            return [dict(headers) for headers in self._headers]

    @property
    def errors(self) -> list[str]:
        """What went wrong on the server side (script ran out, script raised, bad body)."""
        with self._changed:
            return list(self._errors)

    @property
    def arrivals(self) -> list[float]:
        """``time.monotonic()`` at the arrival of each request, as ``requests``."""
        with self._changed:
            return list(self._arrivals)

    @property
    def closed(self) -> list[Closed]:
        """Requests whose client closed the connection before the answer was complete."""
        with self._changed:
            return list(self._closed)

    @property
    def overlaps(self) -> list[tuple[int, int]]:
        """``(request number, id_slot)`` of each request that arrived while another request on
        the same ``id_slot`` was in flight (llama.cpp would mix their prompts)."""
        with self._changed:
            return list(self._overlaps)

    @property
    def most_in_flight(self) -> int:
        """The most requests that were in flight at once."""
        with self._changed:
            return self._most_in_flight

    def in_flight(self) -> dict[int | None, int]:
        """``id_slot`` -> requests in flight on it now (None: requests without an id_slot)."""
        with self._changed:
            return {slot: n for slot, n in self._in_flight.items() if n}

    def wait_for_closed(self, n: int, timeout: float = 5.0) -> list[Closed]:
        """Block until the clients of ``n`` requests have closed their connections early.

        Raises ``AssertionError`` saying how many did if ``timeout`` seconds pass first.
        """
        with self._changed:
            self._wait_until(
                lambda: len(self._closed) >= n,
                timeout,
                lambda: (
                    f"expected {n} connection(s) closed by the client within {timeout:g} s, "
                    f"but {len(self._closed)} were"
                ),
            )
            return list(self._closed)

    def wait_for_idle(self, timeout: float = 5.0) -> None:
        """Block until no request is in flight; ``AssertionError`` after ``timeout`` seconds."""
        self._wait_until(
            lambda: not any(self._in_flight.values()),
            timeout,
            lambda: f"requests still in flight after {timeout:g} s",
        )

    def wait_for_requests(self, n: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Block until at least ``n`` requests have arrived and return them all.

        Raises ``AssertionError`` saying how many arrived if ``timeout`` seconds pass first.
        """
        with self._changed:
            self._wait_until(
                lambda: len(self._requests) >= n,
                timeout,
                lambda: (
                    f"expected {n} request(s) within {timeout:g} s, "
                    f"but {len(self._requests)} arrived"
                ),
            )
            return list(self._requests)

    def _wait_until(
        self, done: Callable[[], bool], timeout: float, failure: Callable[[], str]
    ) -> None:
        """Wait until ``done()``; ``AssertionError(failure())`` after ``timeout`` seconds."""
        with self._changed:  # re-entrant: a caller may hold it, to read what it waited for
            if not self._changed.wait_for(done, timeout):
                raise AssertionError(failure())

    # --- called from handler threads ---

    def _record_error(self, text: str) -> None:
        with self._changed:
            self._errors.append(text)
            self._changed.notify_all()

    def _log_request(
        self,
        method: str,
        path: str,
        *,
        number: int | None = None,
        body: dict[str, Any] | None = None,
        raw: bytes | None = None,
    ) -> None:
        """Write a request's line to the log, if there is one (the caller may hold the lock)."""
        if self._log is None:
            return
        line: dict[str, Any] = {"n": number} if number is not None else {}
        line.update(at=time.time(), method=method, path=path)
        if body is not None:
            line["body"] = body
        if raw is not None:
            line["raw"] = raw.decode("utf-8", "replace")
        text = json.dumps(line, ensure_ascii=False) + "\n"
        with self._changed:
            if self._log is not None:
                self._log.write(text)
                self._log.flush()  # a test, or tail -f, reads it while the server runs

    def _arrived(self, body: dict[str, Any], headers: dict[str, str], slot: int | None) -> int:
        with self._changed:
            self._requests.append(body)
            self._headers.append(headers)
            self._arrivals.append(time.monotonic())
            number = len(self._requests)
            self._log_request("POST", _PATH, number=number, body=body)
            if slot is not None and self._in_flight.get(slot, 0):
                self._overlaps.append((number, slot))
            self._in_flight[slot] = self._in_flight.get(slot, 0) + 1
            self._most_in_flight = max(self._most_in_flight, sum(self._in_flight.values()))
            self._changed.notify_all()
            return number

    def _request_over(self, slot: int | None) -> None:
        with self._changed:
            self._in_flight[slot] -= 1
            self._changed.notify_all()

    def _record_closed(self, number: int, slot: int | None) -> None:
        with self._changed:
            self._closed.append(Closed(number, slot, time.monotonic()))
            self._changed.notify_all()

    def _answer(self, body: dict[str, Any], number: int) -> Step:
        with self._changed:
            step: Step | None = None
            if self._function is None:
                if self._next < len(self._script):
                    step = self._script[self._next]
                    self._next += 1
                else:
                    self._errors.append(
                        f"the script ran out: request {number} has no answer "
                        f"(the script has {len(self._script)})"
                    )
                    return _json_error(500, "the chat server's script ran out of answers")
        if step is None:
            assert self._function is not None
            # Called outside the lock: a script may block (to hold requests in flight).
            try:
                step = self._function(body)
            except LookupError as exc:  # a script of answers that has none for this request
                self._record_error(f"request {number} has no answer: {exc}")
                return _json_error(500, f"the chat server's script has no answer: {exc}")
            except Exception as exc:
                self._record_error(f"the script raised: {exc!r}")
                return _json_error(500, f"the chat server's script raised: {exc!r}")
        return step

    def _response(
        self, step: Answer | RawResponse, body: dict[str, Any], number: int
    ) -> RawResponse:
        if isinstance(step, RawResponse):
            return step
        return self._completion(step, body, number)

    def _completion(self, answer: Answer, body: dict[str, Any], number: int) -> RawResponse:
        message: dict[str, Any] = {"role": "assistant", "content": answer.content}
        if answer.tool_calls:
            with self._changed:
                first = self._call_number + 1
                self._call_number += len(answer.tool_calls)
            message["tool_calls"] = [
                {
                    "id": f"call_{first + offset}",
                    "type": "function",
                    "function": {"name": proposed.name, "arguments": proposed.arguments},
                }
                for offset, proposed in enumerate(answer.tool_calls)
            ]
        response = {
            "id": f"chatcmpl-{number}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", ""),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if answer.tool_calls else "stop",
                }
            ],
        }
        if answer.usage is not None:
            used = answer.usage
            response["usage"] = {
                "prompt_tokens": used.prompt_tokens,
                "completion_tokens": used.completion_tokens,
                "total_tokens": used.prompt_tokens + used.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": used.cached_tokens},
            }
        if body.get("stream") is True:
            return RawResponse(
                status=200,
                body=sse_body(response),
                headers={"Content-Type": "text/event-stream"},
            )
        return RawResponse(
            status=200,
            body=json.dumps(response).encode(),
            headers={"Content-Type": "application/json"},
        )
