"""The service's bearer-token gate, as plain ASGI middleware.

With a token, every request needs ``Authorization: Bearer <token>`` except ``GET /healthz``,
``GET /`` and the page's static files (a person's browser loads the page first, then asks for
the token). The token is compared in constant time (``hmac.compare_digest``) and never logged
or echoed.
"""

from __future__ import annotations

import hmac
from typing import Any

import msgspec

__all__ = ["OPEN_PATHS", "BearerAuth", "is_open"]

OPEN_PATHS = ("/healthz", "/")
"""Paths a ``GET`` (or ``HEAD``) may reach without the token."""

STATIC_PREFIX = "/static/"
"""Where the page's own files are served; open like the page."""


def is_open(method: str, path: str) -> bool:
    """True if ``method path`` needs no token."""
    if method not in ("GET", "HEAD"):
        return False
    return path in OPEN_PATHS or path.startswith(STATIC_PREFIX)


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
        body = msgspec.json.encode(
            {"error": "this service needs a token: send the header Authorization: Bearer <token>"}
        )
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b'Bearer realm="loopd"'),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _allowed(self, scope: Any) -> bool:
        assert self._token is not None
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                given = value
                break
        scheme, _, credential = given.partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        return hmac.compare_digest(credential.strip(), self._token)
