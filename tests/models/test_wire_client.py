"""The model client's connections (actors.models.http on aiohttp), against real sockets on
127.0.0.1: keep-alive connections are reused one request at a time, one the server closed is
not reused, a cancel closes the connection at once, a name is resolved and each address tried,
a refused connection says so, and ``https://`` speaks TLS with certificates checked."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trustme

import actors.models.http
from actors.core.config import ModelConfig
from actors.models.base import ModelFailure
from actors.models.http import HttpChatModel
from messages import ChatMessage, ModelRequest

WAIT = 10.0

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def run(coro: Awaitable[None]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(WAIT):
            await coro

    asyncio.run(bounded())


class Seen:
    """What the server saw: connections accepted, requests in flight on each, the most."""

    def __init__(self) -> None:
        self.accepted = 0
        self.closed = asyncio.Event()
        self.requests: list[int] = []  # the connection number of each request
        self.overlapped = 0


@asynccontextmanager
async def serving(
    handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter, Seen, int], Awaitable[None]],
    tls: ssl.SSLContext | None = None,
    host: str = "127.0.0.1",
) -> AsyncIterator[tuple[int, Seen]]:
    """An asyncio server: its port and what it saw."""
    seen = Seen()

    async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.accepted += 1
        try:
            await handler(reader, writer, seen, seen.accepted)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            seen.closed.set()
            writer.close()

    server = await asyncio.start_server(count, host, 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    try:
        yield port, seen
    finally:
        server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One HTTP/1.1 request with a Content-Length body; its body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return await reader.readexactly(length)


def answer(text: str, *, close: bool = False) -> bytes:
    """A 200 chat-completions answer saying ``text``; keep-alive unless ``close``."""
    body = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]})
    connection = b"Connection: close\r\n" if close else b""
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + connection
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body.encode()
    )


def request(number: int = 1) -> ModelRequest:
    return ModelRequest(f"s{number}", number, 0, (ChatMessage("user", "hi"),), (), "s1")


def client(url: str, **config: Any) -> HttpChatModel:
    config.setdefault("retries", 0)
    return HttpChatModel(ModelConfig(base_url=url, name="m", **config))


async def keep_answering(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen, number: int
) -> None:
    busy = 0
    while True:
        await read_request(reader)
        seen.requests.append(number)
        busy += 1
        seen.overlapped += busy > 1
        await asyncio.sleep(0.01)
        writer.write(answer(f"on {number}"))
        await writer.drain()
        busy -= 1


def test_sequential_requests_share_one_keep_alive_connection() -> None:
    async def main() -> None:
        async with serving(keep_answering) as (port, seen):
            model = client(f"http://127.0.0.1:{port}/v1")
            try:
                texts = [(await model.acomplete(request(i))).content for i in range(3)]
            finally:
                await model.aclose()
        assert texts == ["on 1"] * 3
        assert seen.accepted == 1

    run(main())


def test_requests_at_once_each_have_a_connection_of_their_own() -> None:
    async def main() -> None:
        async with serving(keep_answering) as (port, seen):
            model = client(f"http://127.0.0.1:{port}/v1")
            try:
                for _ in range(2):  # the second burst finds the first's idle connections
                    await asyncio.gather(*(model.acomplete(request(i)) for i in range(8)))
            finally:
                await model.aclose()
        assert len(seen.requests) == 16
        assert seen.overlapped == 0  # never two requests on one connection at once
        assert 8 <= seen.accepted <= 16

    run(main())


def test_a_keep_alive_connection_the_server_closed_is_not_reused() -> None:
    async def once_then_close(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen, number: int
    ) -> None:
        # Says nothing of closing (HTTP/1.1 keeps the connection), then closes it.
        await read_request(reader)
        writer.write(answer(f"on {number}"))
        await writer.drain()

    async def main() -> None:
        async with serving(once_then_close) as (port, seen):
            model = client(f"http://127.0.0.1:{port}/v1")
            try:
                first = await model.acomplete(request(1))
                await seen.closed.wait()
                await asyncio.sleep(0.05)  # the close reaches this side of the loopback
                second = await model.acomplete(request(2))
            finally:
                await model.aclose()
        assert (first.content, second.content) == ("on 1", "on 2")
        assert seen.accepted == 2

    run(main())


def test_a_cancel_closes_the_connection_at_once() -> None:
    arrived = asyncio.Event()

    async def never_answer(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen, number: int
    ) -> None:
        await read_request(reader)
        arrived.set()
        assert await reader.read() == b""  # the client closed the connection

    async def main() -> None:
        async with serving(never_answer) as (port, seen):
            model = client(f"http://127.0.0.1:{port}/v1", timeout_s=30.0)
            task = asyncio.create_task(model.acomplete(request()))
            await arrived.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            async with asyncio.timeout(1.0):  # not the 30 s deadline
                await seen.closed.wait()
            await model.aclose()

    run(main())


def test_a_name_is_resolved_and_each_address_tried() -> None:
    async def main() -> None:
        async with serving(keep_answering) as (port, _):
            # localhost may name ::1 first, where nothing listens: the next address answers.
            model = client(f"http://localhost:{port}/v1")
            try:
                assert (await model.acomplete(request())).content == "on 1"
            finally:
                await model.aclose()

    run(main())


def test_a_refused_connection_says_the_model_cannot_be_reached(unused_port: int) -> None:
    model = client(f"http://127.0.0.1:{unused_port}/v1")
    with pytest.raises(ModelFailure, match="cannot reach the model at") as caught:
        model.complete(request())
    assert caught.value.cut is False  # nothing reached a server: its slot is free at once


@pytest.fixture
def unused_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.fixture(scope="module")
def authority() -> trustme.CA:
    return trustme.CA()


def server_tls(authority: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost", "127.0.0.1").configure_cert(context)
    return context


def test_https_speaks_tls_to_a_server_it_trusts(
    authority: trustme.CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    trusting = ssl.create_default_context()
    authority.configure_trust(trusting)
    # The system's CA bundle does not know the test's authority: the client is told of it.
    monkeypatch.setattr(actors.models.http, "tls_context", lambda: trusting)

    async def main() -> None:
        async with serving(keep_answering, tls=server_tls(authority)) as (port, seen):
            model = client(f"https://127.0.0.1:{port}/v1")
            try:
                assert (await model.acomplete(request())).content == "on 1"
                assert (await model.acomplete(request())).content == "on 1"
            finally:
                await model.aclose()
        assert seen.accepted == 1  # TLS connections are kept alive too

    run(main())


def test_https_trusts_the_authorities_ssl_cert_file_names(
    authority: trustme.CA, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(bundle))
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))

    async def main() -> None:
        async with serving(keep_answering, tls=server_tls(authority)) as (port, _):
            model = client(f"https://localhost:{port}/v1")
            try:
                assert (await model.acomplete(request())).content == "on 1"
            finally:
                await model.aclose()

    run(main())


def test_https_refuses_a_certificate_it_cannot_check(authority: trustme.CA) -> None:
    async def main() -> None:
        async with serving(keep_answering, tls=server_tls(authority)) as (port, seen):
            model = client(f"https://127.0.0.1:{port}/v1")
            try:
                with pytest.raises(ModelFailure, match=r"cannot reach the model at .*certificate"):
                    await model.acomplete(request())
            finally:
                await model.aclose()
        assert seen.requests == []

    run(main())


def test_credentials_in_the_url_are_not_sent() -> None:
    heads: list[bytes] = []

    async def keep_heads(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: Seen, number: int
    ) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        heads.append(head.lower())
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                await reader.readexactly(int(line.split(b":")[1]))
        writer.write(answer("ok"))
        await writer.drain()

    async def main() -> None:
        async with serving(keep_heads) as (port, _):
            model = client(f"http://ann:hunter2@127.0.0.1:{port}/v1")
            try:
                assert (await model.acomplete(request())).content == "ok"
            finally:
                await model.aclose()

    run(main())
    (head,) = heads
    assert head.startswith(b"post /v1/chat/completions http/1.1\r\n")
    assert b"authorization" not in head and b"hunter2" not in head
