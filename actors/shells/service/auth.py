"""The service's gates, as one plain ASGI middleware: a guard against other web pages, and
the bearer token.

With a token, every request needs ``Authorization: Bearer <token>`` except ``GET /healthz``,
``GET /``, the A2A agent card and the page's static files (a person's browser loads the page
first, then asks for the token). The token is compared in constant time
(``hmac.compare_digest``) and never logged or echoed.

Without a token the service listens on loopback only, and a browser is the one way in for
someone else: a page on another site may send requests to ``127.0.0.1`` (a form post needs no
permission), or rebind its own host name to ``127.0.0.1``. So a request whose ``Origin`` is not
the service's own, or that names a host other than a loopback one while the service listens on
loopback, is answered 403. Programs (curl, httpx) send no ``Origin`` and pass.
"""

from __future__ import annotations

import hmac
from typing import Any
from urllib.parse import urlsplit

import msgspec

from actors.core.listen import is_loopback

__all__ = ["OPEN_PATHS", "Gate", "is_open"]

OPEN_PATHS = ("/healthz", "/", "/a2a/.well-known/agent-card.json")
"""Paths a ``GET`` (or ``HEAD``) may reach without the token (the A2A agent card is public:
a client reads it to learn where and how to call)."""

STATIC_PREFIX = "/static/"
"""Where the page's own files are served; open like the page."""


def is_open(method: str, path: str) -> bool:
    """True if ``method path`` needs no token."""
    if method not in ("GET", "HEAD"):
        return False
    return path in OPEN_PATHS or path.startswith(STATIC_PREFIX)


async def _refuse(send: Any, status: int, text: str, extra: list[tuple[bytes, bytes]]) -> None:
    body = msgspec.json.encode({"error": text})
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Gate:
    """The service's one middleware, both gates in order: 403 to a request a web page of
    another origin made (its ``Origin`` is not this service's) or, on a loopback address, to
    one naming another host (DNS rebinding); then 401 to one without the right bearer token
    (``token`` None: no token gate).

    One layer rather than two, and a ``Host`` already found loopback is remembered: this runs on
    every request, and the address check parses an IP address.
    """

    def __init__(self, app: Any, token: str | None, loopback: bool) -> None:
        self.app = app
        self._token = None if token is None else token.encode("utf-8")
        self.loopback = loopback
        self._loopback_hosts: set[bytes] = set()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = origin = authorization = None  # each header's first value, as a server reads it
        for key, value in scope["headers"]:
            if key == b"host":
                host = bytes(value) if host is None else host
            elif key == b"origin":
                origin = bytes(value) if origin is None else origin
            elif key == b"authorization":
                authorization = bytes(value) if authorization is None else authorization
        refused = self._refusal(host or b"", origin)
        if refused is not None:
            await _refuse(send, 403, refused, [])
        elif (
            self._token is None
            or is_open(scope["method"], scope["path"])
            or self._allowed(authorization)
        ):
            await self.app(scope, receive, send)
        else:
            await _refuse(
                send,
                401,
                "this service needs a token: send the header Authorization: Bearer <token>",
                [(b"www-authenticate", b'Bearer realm="loopd"')],
            )

    def _allowed(self, authorization: bytes | None) -> bool:
        assert self._token is not None
        scheme, _, credential = (authorization or b"").partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        return hmac.compare_digest(credential.strip(), self._token)

    def _refusal(self, raw_host: bytes, origin: bytes | None) -> str | None:
        host = raw_host.decode("latin-1").strip()
        if self.loopback and raw_host not in self._loopback_hosts:
            if not is_loopback(_host_name(host)):
                return (
                    "this service listens on loopback and answers only requests for a loopback "
                    "host (localhost, 127.0.0.1, [::1])"
                )
            if len(self._loopback_hosts) < _KNOWN_HOSTS:
                self._loopback_hosts.add(raw_host)
        if origin is None:
            return None
        parts = urlsplit(origin.decode("latin-1").strip())
        if parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower():
            return None
        return "requests from a page of another origin are refused"


_KNOWN_HOSTS = 64
"""How many loopback ``Host`` values the gate remembers (a few in practice: the address, with
and without the port, localhost; the bound keeps a flood of odd ones from growing it)."""


def _host_name(authority: str) -> str:
    """The host of ``host[:port]`` (``[::1]:80`` is ``::1``), lower case."""
    if authority.startswith("["):
        return authority[1:].partition("]")[0].lower()
    return authority.rpartition(":")[0].lower() if ":" in authority else authority.lower()
