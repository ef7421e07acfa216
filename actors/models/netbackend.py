"""Plain-TCP connections for the model client, on asyncio's own socket calls.

httpcore (under httpx) reaches the network through a backend; its default goes through anyio,
which wraps every read and write in a cancel scope and looks up the running async library
each time. On the model service's loop, with hundreds of requests in flight, that was about a
third of a request's CPU. :class:`AsyncioBackend` does the same job with
``loop.sock_connect``, ``loop.sock_recv`` and ``loop.sock_sendall`` on a non-blocking socket,
and sends what httpcore writes for one request (the head, then the body) in one ``send``, just
before it starts to read the answer: on loopback every ``send`` wakes the server's process.

It serves ``http://`` only: :func:`plain_transport` is an ``httpx`` transport of one
connection on it, and ``https://`` keeps httpx's own transport (TLS on anyio). Cancelling a
read closes the socket, as httpcore closes any connection whose response was not read to its
end, so the server sees the connection close at once.

It may import httpx and httpcore, nothing of loopd's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import select
import socket
import ssl
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

import httpcore
import httpx

__all__ = ["FLUSH_AT", "AsyncioBackend", "AsyncioStream", "plain_transport"]

_T = TypeVar("_T")

FLUSH_AT = 64 * 1024
"""Bytes written and held for one ``send`` past which they are sent at once (a large body)."""


async def _io(
    operation: Awaitable[_T],
    timeout: float | None,
    timed_out: type[Exception],
    failed: type[Exception],
) -> _T:
    """Await ``operation`` within httpcore's per-operation ``timeout``, if it gives one (the
    model client does not: its deadline is the whole attempt's), with httpcore's errors."""
    try:
        if timeout is None:
            return await operation
        async with asyncio.timeout(timeout):
            return await operation
    except TimeoutError as exc:  # the deadline, or the system's (ETIMEDOUT)
        raise timed_out(str(exc) or f"timed out after {timeout} s") from exc
    except OSError as exc:
        raise failed(str(exc) or type(exc).__name__) from exc


class AsyncioStream(httpcore.AsyncNetworkStream):
    """One connected, non-blocking TCP (or Unix) socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._held: list[bytes] = []
        self._held_bytes = 0

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        """Send what is held, then up to ``max_bytes`` bytes (``b""`` at the end)."""
        if self._held:
            # As httpcore does when a write fails: read all the same, since a server may
            # answer (an error, say) and close before it has read the whole request.
            with contextlib.suppress(httpcore.WriteError):
                await self._flush(timeout)
        receive = self._loop.sock_recv(self._sock, max_bytes)
        return await _io(receive, timeout, httpcore.ReadTimeout, httpcore.ReadError)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        """Hold ``buffer`` to go out with the next read (or once ``FLUSH_AT`` bytes wait)."""
        if not buffer:
            return
        self._held.append(buffer)
        self._held_bytes += len(buffer)
        if self._held_bytes >= FLUSH_AT:
            await self._flush(timeout)

    async def _flush(self, timeout: float | None) -> None:
        data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
        self._held = []
        self._held_bytes = 0
        send = self._loop.sock_sendall(self._sock, data)
        await _io(send, timeout, httpcore.WriteTimeout, httpcore.WriteError)

    async def aclose(self) -> None:
        """Close the socket; what is held is dropped (nobody waits for its answer)."""
        self._held = []
        self._held_bytes = 0
        self._sock.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        """Not served here: ``https://`` goes through httpx's own transport."""
        raise httpcore.ConnectError("TLS is not served by the asyncio backend")

    def get_extra_info(self, info: str) -> Any:
        """What httpcore asks of a stream: ``is_readable`` above all (an idle keep-alive
        connection that is readable was closed by the server, and is not reused)."""
        if info == "is_readable":
            return _readable(self._sock)
        if info == "socket":
            return self._sock
        if info == "client_addr":
            return self._sock.getsockname()
        if info == "server_addr":
            return self._sock.getpeername()
        return None


def _readable(sock: socket.socket) -> bool:
    fd = sock.fileno()
    if fd < 0:
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend on the running asyncio loop, for plain TCP."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        """Connect to ``host``:``port``, trying each address the name has, in order."""
        connect = self._connect_tcp(host, port, local_address, socket_options)
        return await _io(connect, timeout, httpcore.ConnectTimeout, httpcore.ConnectError)

    @staticmethod
    async def _connect_tcp(
        host: str, port: int, local_address: str | None, options: Iterable[Any] | None
    ) -> AsyncioStream:
        loop = asyncio.get_running_loop()
        targets: list[tuple[int, Any]]
        if _is_ip(host):
            targets = [(socket.AF_INET6 if ":" in host else socket.AF_INET, (host, port))]
        else:  # a name: resolved on the loop's executor, as anyio does
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            targets = [(info[0], info[4]) for info in infos]
        error: OSError = OSError(f"no address for {host}")
        for family, address in targets:
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                for option in options or ():
                    sock.setsockopt(*option)
                if local_address is not None:
                    sock.bind((local_address, 0))
                await loop.sock_connect(sock, address)
            except OSError as exc:
                sock.close()
                error = exc
                continue
            except BaseException:
                sock.close()
                raise
            return AsyncioStream(sock)
        raise error

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        """Connect to the Unix socket at ``path``."""
        connect = self._connect_unix(path, socket_options)
        return await _io(connect, timeout, httpcore.ConnectTimeout, httpcore.ConnectError)

    @staticmethod
    async def _connect_unix(path: str, options: Iterable[Any] | None) -> AsyncioStream:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            for option in options or ():
                sock.setsockopt(*option)
            await asyncio.get_running_loop().sock_connect(sock, path)
        except BaseException:
            sock.close()
            raise
        return AsyncioStream(sock)

    async def sleep(self, seconds: float) -> None:
        """Sleep on the loop."""
        await asyncio.sleep(seconds)


class _OneConnection:
    """What :func:`plain_transport` keeps where httpx's transport keeps its pool: one
    keep-alive HTTP/1.1 connection (httpcore's), for one request at a time.

    A connection that is not idle, past its keep-alive time or closed by the server (readable
    while idle) is replaced by a new one before a request. httpx's transport only calls
    ``handle_async_request`` and ``aclose`` on it, and maps httpcore's errors to its own.
    """

    def __init__(self, keepalive_expiry: float | None) -> None:
        self._keepalive_expiry = keepalive_expiry
        self._connection: httpcore.AsyncHTTP11Connection | None = None

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        """Send ``request`` on the connection, opening one first if need be."""
        connection = self._connection
        # Kept, a connection is idle: one that is not (closed, or a response never closed)
        # or has expired (past its keep-alive time, or closed by the server) is replaced.
        if connection is not None and (not connection.is_idle() or connection.has_expired()):
            self._connection = None
            await connection.aclose()
            connection = None
        if connection is None:
            url = request.url
            timeouts = request.extensions.get("timeout", {})
            stream = await _BACKEND.connect_tcp(
                url.host.decode("ascii"), url.port or 80, timeout=timeouts.get("connect")
            )
            origin = httpcore.Origin(url.scheme, url.host, url.port or 80)
            connection = httpcore.AsyncHTTP11Connection(
                origin, stream, keepalive_expiry=self._keepalive_expiry
            )
            self._connection = connection
        return await connection.handle_async_request(request)

    async def aclose(self) -> None:
        """Close the connection, if there is one."""
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.aclose()

    async def __aenter__(self) -> _OneConnection:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


_BACKEND = AsyncioBackend()


@functools.cache
def _no_tls() -> ssl.SSLContext:
    # httpx's transport builds a TLS context it is given none, at about 0.5 ms apiece: one,
    # never used, serves every plain transport.
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def plain_transport(keepalive_expiry: float | None = 5.0) -> httpx.AsyncHTTPTransport:
    """An ``httpx`` transport for ``http://`` URLs with one connection, on
    :class:`AsyncioBackend`, for one request at a time (the model client lends each of its
    transports to one attempt). httpx's request and response handling and error mapping are
    kept; httpcore's pool, built for many requests sharing connections, is left out: it was
    a fifth of a request's CPU."""
    transport = httpx.AsyncHTTPTransport(verify=_no_tls())
    # httpx takes neither a network backend nor a pool of one's own: the attribute is httpx's
    # (every release since 0.18), and tests/test_netbackend.py goes through it.
    transport._pool = _OneConnection(keepalive_expiry)  # type: ignore[assignment]
    return transport
