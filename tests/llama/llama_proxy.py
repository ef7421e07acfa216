"""A small recording HTTP proxy between loopd and a real llama-server.

Every request is forwarded as is (or as :attr:`Proxy.edit_request` makes it) and every
chat-completions exchange is recorded with the server's answer, ``timings`` included, so a test
can read what the server reused from its prompt cache. :attr:`Proxy.edit_answer` may replace an
answer (to turn a tiny model's first answer into a ``subagent`` call) after the server has
processed the prompt for real. A client that closes its connection closes the upstream one at
once, as loopd's own connection would: the server then stops generating.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = ["Exchange", "Proxy"]

_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


@dataclass
class Exchange:
    """One chat-completions request and what the server answered (before any edit)."""

    request: dict[str, Any]
    answer: dict[str, Any] | None = None
    status: int | None = None
    started: float = field(default_factory=time.monotonic)
    seconds: float | None = None
    cancelled: bool = False

    @property
    def timings(self) -> dict[str, Any]:
        """llama.cpp's ``timings`` of the answer: ``cache_n``, ``prompt_n``, ``prompt_ms``..."""
        return (self.answer or {}).get("timings", {})

    @property
    def prompt_tokens(self) -> int:
        """Tokens of the whole prompt: reused from the cache plus evaluated."""
        return int(self.timings.get("cache_n", 0)) + int(self.timings.get("prompt_n", 0))


class Proxy:
    """Forward ``http://127.0.0.1:<port>/...`` to ``upstream``; record chat completions."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.exchanges: list[Exchange] = []
        self.edit_request: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        self.edit_answer: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] | None = None
        self.hide_props = False
        """Answer ``GET /props`` with 404, like a server that has none (vLLM, a hosted API)."""
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llama-proxy", daemon=True)
        self.port = 0

    # Life cycle.

    def start(self) -> Proxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the proxy did not start")
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._client = httpx.AsyncClient(timeout=None)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()
        self._loop.run_until_complete(self._client.aclose())
        self._loop.close()

    # Waiting.

    def wait_for(self, count: int, timeout: float) -> list[Exchange]:
        """The first ``count`` exchanges once each has its answer (or was cancelled)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                done = [e for e in self.exchanges if e.answer is not None or e.cancelled]
                if len(self.exchanges) >= count and len(done) >= count:
                    return self.exchanges[:count]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(done)} of {count} exchanges after {timeout} s")
                self._changed.wait(left)

    def wait_for_request(self, count: int, timeout: float) -> Exchange:
        """Exchange number ``count`` (from 1) as soon as its request has been sent on."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self.exchanges) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(self.exchanges)} of {count} requests")
                self._changed.wait(left)
            return self.exchanges[count - 1]

    # Serving.

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
                length = int({k.lower(): v for k, v in headers.items()}.get("content-length", 0))
                body = await reader.readexactly(length) if length else b""
                if not await self._forward(method, path, headers, body, reader, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _forward(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        exchange: Exchange | None = None
        if self.hide_props and path == "/props":
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            return True
        if path.endswith("/chat/completions"):
            data = json.loads(body)
            if self.edit_request is not None:
                data = self.edit_request(data)
                body = json.dumps(data).encode()
            exchange = Exchange(request=data)
            with self._changed:
                self.exchanges.append(exchange)
                self._changed.notify_all()
        send = {k: v for k, v in headers.items() if k.lower() not in _HOP_HEADERS}
        upstream = asyncio.ensure_future(
            self._client.request(method, self.upstream + path, headers=send, content=body)
        )
        # A keep-alive client sends nothing while it waits: a read that ends means it left.
        gone = asyncio.ensure_future(reader.read(1))
        await asyncio.wait({upstream, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not upstream.done():
            upstream.cancel()  # closes the upstream connection: the server stops generating
            with contextlib.suppress(BaseException):
                await upstream
            if exchange is not None:
                with self._changed:
                    exchange.cancelled = True
                    exchange.seconds = time.monotonic() - exchange.started
                    self._changed.notify_all()
            return False
        gone.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await gone  # the reader is free again only once the cancel has landed
        response = upstream.result()
        content = response.content
        if exchange is not None:
            answer = json.loads(content) if content else {}
            if response.is_success and self.edit_answer is not None:
                content = json.dumps(self.edit_answer(exchange.request, answer)).encode()
            with self._changed:
                exchange.answer = answer
                exchange.status = response.status_code
                exchange.seconds = time.monotonic() - exchange.started
                self._changed.notify_all()
        reason = response.reason_phrase or "OK"
        head = f"HTTP/1.1 {response.status_code} {reason}\r\n"
        head += f"Content-Type: {response.headers.get('content-type', 'application/json')}\r\n"
        head += f"Content-Length: {len(content)}\r\n\r\n"
        writer.write(head.encode("latin-1") + content)
        await writer.drain()
        return True
