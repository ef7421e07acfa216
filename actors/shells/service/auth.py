"""The service's gates, as plain ASGI middleware: the bearer token, and a guard against other
web pages.

With a token, every request needs ``Authorization: Bearer <token>`` except ``GET /healthz``,
``GET /`` and the page's static files (a person's browser loads the page first, then asks for
the token). The token is compared in constant time (``hmac.compare_digest``) and never logged
or echoed.

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

__all__ = ["OPEN_PATHS", "BearerAuth", "BrowserGuard", "is_open"]

OPEN_PATHS = ("/healthz", "/")
"""Paths a ``GET`` (or ``HEAD``) may reach without the token."""

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


def _header(scope: Any, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


class BearerAuth:
    """Answers 401 to a request without the right bearer token (``token`` None: no gate)."""

    def __init__(self, app: Any, token: str | None) -> None:
        self.app = app
        self._token = None if token is None else token.encode("utf-8")

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (
            scope["type"] != "http"
            or self._token is None
            or is_open(scope["method"], scope["path"])
            or self._allowed(scope)
        ):
            await self.app(scope, receive, send)
            return
        await _refuse(
            send,
            401,
            "this service needs a token: send the header Authorization: Bearer <token>",
            [(b"www-authenticate", b'Bearer realm="loopd"')],
        )

    def _allowed(self, scope: Any) -> bool:
        assert self._token is not None
        scheme, _, credential = (_header(scope, b"authorization") or b"").partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        return hmac.compare_digest(credential.strip(), self._token)


def _host_name(authority: str) -> str:
    """The host of ``host[:port]`` (``[::1]:80`` is ``::1``), lower case."""
    if authority.startswith("["):
        return authority[1:].partition("]")[0].lower()
    return authority.rpartition(":")[0].lower() if ":" in authority else authority.lower()


class BrowserGuard:
    """Answers 403 to a request a web page of another origin made (its ``Origin`` is not this
    service's), and, on a loopback address, to one naming another host (DNS rebinding)."""

    def __init__(self, app: Any, loopback: bool) -> None:
        self.app = app
        self.loopback = loopback

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            refused = self._refusal(scope)
            if refused is not None:
                await _refuse(send, 403, refused, [])
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Any) -> str | None:
        host = (_header(scope, b"host") or b"").decode("latin-1").strip()
        if self.loopback and not is_loopback(_host_name(host)):
            return (
                "this service listens on loopback and answers only requests for a loopback "
                "host (localhost, 127.0.0.1, [::1])"
            )
        origin = _header(scope, b"origin")
        if origin is None:
            return None
        parts = urlsplit(origin.decode("latin-1").strip())
        if parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower():
            return None
        return "requests from a page of another origin are refused"
