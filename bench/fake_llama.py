"""A fake llama.cpp server for the benchmarks: asyncio, HTTP/1.1 with keep-alive.

The test kit's :class:`~actors.testing.ChatServer` is built for tests of the client's connection
handling: a thread per connection, HTTP/1.0 (a new TCP connection per request) and a poll of
each socket every 20 ms while an answer waits, to see a client that goes away. With hundreds of
requests in flight on a shared 2-core machine that server, not loopd, is what the fan-out bench
measured (a GIL shared by 512 polling threads). llama-server is C++ on an event loop and keeps
connections alive; this server does the same in one asyncio loop, so a request waiting for its
answer costs a timer and nothing else. It serves ``POST /v1/chat/completions`` only, answers
from a script function of the request body (like ChatServer's), and counts requests, the most
in flight at once and requests that arrived for an ``id_slot`` already in flight. A request with
``"stream": true`` is answered with server-sent events in chunked encoding (the first text piece
at once, the rest after :data:`STREAM_GAP_S`), as llama-server streams. ``GET /v1/last`` gives
the bodies of the last :data:`KEPT` requests (a JSON list), so a bench can send the very
requests loopd sent with a client of its own.

Run it in a process of its own (:func:`serve`), as a real server would be.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from actors.testing.script import Answer

__all__ = ["KEPT", "STREAM_GAP_S", "Stats", "serve"]

KEPT = 8
"""How many of the last request bodies ``GET /v1/last`` gives."""

STREAM_GAP_S = 0.002
"""The wait between a streamed answer's first piece and the rest."""

Script = Callable[[dict[str, Any]], tuple[Answer, float]]
"""Gets a request body; returns the answer and the seconds to wait before sending it."""


@dataclass
class Stats:
    """What the server saw."""

    requests: int = 0
    in_flight: int = 0
    most_in_flight: int = 0
    overlaps: int = 0
    busy_slots: set[int] = field(default_factory=set)
    calls: int = 0
    last: list[bytes] = field(default_factory=list)


def _completion(answer: Answer, model: str, number: int, stats: Stats) -> bytes:
    message: dict[str, Any] = {"role": "assistant", "content": answer.content}
    if answer.tool_calls:
        first = stats.calls + 1
        stats.calls += len(answer.tool_calls)
        message["tool_calls"] = [
            {
                "id": f"call_{first + i}",
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for i, c in enumerate(answer.tool_calls)
        ]
    finish = "tool_calls" if answer.tool_calls else "stop"
    body = {
        "id": f"chatcmpl-{number}",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }
    return json.dumps(body).encode()


def _response(status: str, body: bytes, close: bool) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: {'close' if close else 'keep-alive'}\r\n\r\n"
    )
    return head.encode() + body


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _events(answer: Answer, model: str, number: int) -> tuple[bytes, bytes]:
    """The stream of a text answer: its head with the first piece, and the rest."""
    text = answer.content or ""
    half = max(1, len(text) // 2)

    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        chunk = {
            "id": f"chatcmpl-{number}",
            "object": "chat.completion.chunk",
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"
    )
    first = head + _chunk(event({"role": "assistant", "content": text[:half]}))
    rest = event({"content": text[half:]}) + event({}, "stop") + b"data: [DONE]\n\n"
    return first, _chunk(rest) + b"0\r\n\r\n"


async def _answer(
    script: Script, stats: Stats, path: str, raw: bytes, writer: asyncio.StreamWriter
) -> bytes:
    if path != "/v1/chat/completions":
        return b'{"error": {"message": "no such path"}}'
    body = json.loads(raw)
    stats.last = [*stats.last[-(KEPT - 1) :], raw]
    stats.requests += 1
    number = stats.requests
    slot = body.get("id_slot")
    if isinstance(slot, int):
        if slot in stats.busy_slots:
            stats.overlaps += 1
        stats.busy_slots.add(slot)
    stats.in_flight += 1
    stats.most_in_flight = max(stats.most_in_flight, stats.in_flight)
    try:
        answer, delay = script(body)
        await asyncio.sleep(delay)
        if body.get("stream"):
            first, rest = _events(answer, str(body.get("model", "")), number)
            writer.write(first)
            await writer.drain()
            await asyncio.sleep(STREAM_GAP_S)
            writer.write(rest)
            return b""
        return _completion(answer, str(body.get("model", "")), number, stats)
    finally:
        stats.in_flight -= 1
        if isinstance(slot, int):
            stats.busy_slots.discard(slot)


async def _connection(
    script: Script, stats: Stats, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, version = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    name, value = line.split(":", 1)
                    headers[name.strip().lower()] = value.strip()
            raw = await reader.readexactly(int(headers.get("content-length", "0")))
            close = headers.get("connection", "").lower() == "close" or version == "HTTP/1.0"
            if method == "GET" and path == "/v1/last":
                kept = b"[" + b",".join(stats.last) + b"]"
                writer.write(_response("200 OK", kept, close))
            elif method != "POST":
                writer.write(_response("404 Not Found", b"{}", close))
            else:
                body = await _answer(script, stats, path, raw, writer)
                if body:  # a streamed answer was written already
                    writer.write(_response("200 OK", body, close))
            await writer.drain()
            if close:
                break
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _main(script: Script, pipe: Connection) -> None:
    stats = Stats()
    server = await asyncio.start_server(
        lambda r, w: _connection(script, stats, r, w), "127.0.0.1", 0, backlog=4096
    )
    port = server.sockets[0].getsockname()[1]
    pipe.send(f"http://127.0.0.1:{port}/v1")
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, pipe.recv)  # the bench says stop
    server.close()
    pipe.send((stats.most_in_flight, stats.overlaps, stats.requests))


def serve(script: Script, pipe: Connection) -> None:
    """Serve until ``pipe`` receives anything; send the base URL first and the counts
    ``(most in flight, overlaps, requests)`` last."""
    asyncio.run(_main(script, pipe))
