"""The model client's plain-TCP backend (actors.models.netbackend), against real sockets on
127.0.0.1:
one request goes out in one send when its answer is read, a large body goes out whole, a
keep-alive connection the server closed is not reused, a name is resolved, and a refused
connection is an httpx.ConnectError."""

from __future__ import annotations

import asyncio
import select
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import httpx
import pytest

import actors.models.http
from actors.core.config import ModelConfig
from actors.models.http import HttpChatModel
from actors.models.netbackend import FLUSH_AT, AsyncioBackend, AsyncioStream, plain_transport
from actors.testing import ChatServer
from actors.testing.script import reply
from messages import ChatMessage, ModelAnswer, ModelRequest, Usage

WAIT = 10.0

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def run(coro: Awaitable[None]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(WAIT):
            await coro

    asyncio.run(bounded())


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[tuple[int, list[int]]]:
    """An asyncio server on 127.0.0.1: its port, and one entry per connection it accepted."""
    accepted: list[int] = []

    async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(len(accepted) + 1)
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(count, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield port, accepted
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


def answer(body: bytes, *, close: bool = False) -> bytes:
    """A 200 answer with ``body``; keep-alive unless ``close``."""
    connection = b"Connection: close\r\n" if close else b""
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
        + connection
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def readable(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


def test_writes_are_held_and_sent_together_when_the_answer_is_read() -> None:
    async def main() -> None:
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)
        port = listener.getsockname()[1]
        loop = asyncio.get_running_loop()
        try:
            connecting = asyncio.ensure_future(AsyncioBackend().connect_tcp("127.0.0.1", port))
            server_side, _ = await loop.sock_accept(listener)
            stream = await connecting
            assert isinstance(stream, AsyncioStream)
            with server_side:
                await stream.write(b"POST / HTTP/1.1\r\nContent-Length: 4\r\n\r\n")
                await stream.write(b"body")
                await asyncio.sleep(0)
                assert not readable(server_side)  # nothing went out yet
                reading = asyncio.ensure_future(stream.read(100))
                got = await loop.sock_recv(server_side, 65536)
                # One send, so the server has it all in its first receive.
                assert got == b"POST / HTTP/1.1\r\nContent-Length: 4\r\n\r\nbody"
                await loop.sock_sendall(server_side, b"reply")
                assert await reading == b"reply"
            assert await stream.read(100) == b""  # the server closed: the end of the stream
            await stream.aclose()
        finally:
            listener.close()

    run(main())


def test_a_large_body_goes_out_without_waiting_for_a_read() -> None:
    chunk = b"x" * (FLUSH_AT // 2)

    async def main() -> None:
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            port = listener.getsockname()[1]
            connecting = asyncio.ensure_future(AsyncioBackend().connect_tcp("127.0.0.1", port))
            server_side, _ = await loop.sock_accept(listener)
            stream = await connecting
            with server_side:

                async def write_all() -> None:
                    for _ in range(6):
                        await stream.write(chunk)

                writing = asyncio.ensure_future(write_all())
                got = 0
                while got < 6 * len(chunk):  # all of it, and no read() on the client side
                    got += len(await loop.sock_recv(server_side, 1 << 20))
                await writing
            await stream.aclose()
        finally:
            listener.close()

    run(main())


def test_a_body_larger_than_the_flush_size_arrives_whole() -> None:
    body = bytes(range(256)) * (3 * FLUSH_AT // 256 + 7)

    async def echo_length(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got = await read_request(reader)
        writer.write(answer(f"{len(got)} {got == body}".encode(), close=True))
        await writer.drain()

    async def main() -> None:
        async with serving(echo_length) as (port, _):
            transport = plain_transport()
            async with httpx.AsyncClient(transport=transport) as client:
                response = await client.post(f"http://127.0.0.1:{port}/", content=body)
        assert response.text == f"{len(body)} True"

    run(main())


def test_a_keep_alive_connection_the_server_closed_is_not_reused() -> None:
    closed = asyncio.Event()

    async def once_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Says nothing of closing (HTTP/1.1 keeps the connection), then closes it.
        got = await read_request(reader)
        writer.write(answer(got))
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        closed.set()

    async def main() -> None:
        async with serving(once_then_close) as (port, accepted):
            transport = plain_transport()
            async with httpx.AsyncClient(transport=transport) as client:
                first = await client.post(f"http://127.0.0.1:{port}/", content=b"one")
                await closed.wait()  # on loopback the close has reached this side by now
                second = await client.post(f"http://127.0.0.1:{port}/", content=b"two")
        assert (first.text, second.text) == ("one", "two")
        assert accepted == [1, 2]

    run(main())


def test_a_connection_whose_response_was_left_open_is_not_reused() -> None:
    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                got = await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(answer(got))
            await writer.drain()

    async def main() -> None:
        async with serving(reply) as (port, accepted):
            transport = plain_transport()
            url = f"http://127.0.0.1:{port}/"
            # The first answer is never read nor closed: its connection is still busy.
            await transport.handle_async_request(httpx.Request("POST", url, content=b"one"))
            second = await transport.handle_async_request(
                httpx.Request("POST", url, content=b"two")
            )
            assert await second.aread() == b"two"
            await transport.aclose()
        assert accepted == [1, 2]

    run(main())


def test_a_name_is_resolved_and_each_address_tried() -> None:
    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(answer(await read_request(reader), close=True))
        await writer.drain()

    async def main() -> None:
        async with serving(reply) as (port, _):
            transport = plain_transport()
            # localhost may name ::1 first, where nothing listens: the next address answers.
            async with httpx.AsyncClient(transport=transport) as client:
                response = await client.post(f"http://localhost:{port}/", content=b"hi")
        assert response.text == "hi"

    run(main())


def test_a_refused_connection_is_a_connect_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening: refused

        async def main() -> None:
            transport = plain_transport()
            async with httpx.AsyncClient(transport=transport) as client:
                with pytest.raises(httpx.ConnectError):
                    await client.post(f"http://127.0.0.1:{port}/", content=b"x")

        run(main())


def test_the_model_client_speaks_plain_http_through_this_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[httpx.AsyncHTTPTransport] = []

    def counted() -> httpx.AsyncHTTPTransport:
        built.append(plain_transport())
        return built[-1]

    monkeypatch.setattr(actors.models.http, "plain_transport", counted)
    request = ModelRequest(
        session="s1",
        request_id=1,
        slot=0,
        messages=(ChatMessage("user", "hello"),),
        tools=(),
        reply_to="s1",
    )
    with ChatServer([reply("ok"), reply("again")]) as server:
        model = HttpChatModel(ModelConfig(base_url=server.base_url, name="m"))
        try:
            unmeasured = Usage(requests=1, unmeasured_requests=1)  # no usage in the answers
            assert model.complete(request) == ModelAnswer("s1", 1, content="ok", usage=unmeasured)
            assert model.complete(request) == ModelAnswer(
                "s1", 1, content="again", usage=unmeasured
            )
        finally:
            model.close()
    assert len(built) == 2  # complete() runs on a loop of its own each time
