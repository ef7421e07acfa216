"""What a llama.cpp server says about itself (``GET /props``), read once at start.

:func:`read_total_slots` reads the slot count strictly (``slots.total = "auto"`` needs it);
:func:`read_props` is lenient: a server without ``/props``, or one that is slow or sends too
much, just leaves the context size unknown. Either read has a deadline for the whole answer
(not per network read, which a server that drips its answer would keep alive) and reads at most
:data:`PROPS_MAX_BYTES`, so a hostile or stuck server can neither hold a start nor fill memory.
"""

from __future__ import annotations

import asyncio
import functools
import os
import ssl
import threading
from dataclasses import dataclass
from typing import Any

import aiohttp
import yarl

from actors.core.bounded import OutOfBounds, decode_json
from actors.core.config import ModelConfig
from actors.models.base import ModelFailure

__all__ = [
    "PROPS_DEADLINE_S",
    "PROPS_MAX_BYTES",
    "ServerProps",
    "get_small",
    "parse_props",
    "props_url",
    "read_props",
    "read_total_slots",
    "tls_context",
]

PROPS_DEADLINE_S = 3.0
"""How long :func:`read_props` waits for the whole ``/props`` answer: a local server answers in
milliseconds, and a start must not wait on a server that does not."""

PROPS_MAX_BYTES = 1 << 20
"""The largest ``/props`` answer read (1 MiB): llama.cpp's, chat template included, is a few
kilobytes."""

# A context or slot count past this is no real server's (see actors.models.wire).
_MAX_COUNT = 2**32


@dataclass(frozen=True)
class ServerProps:
    """A llama.cpp server's slots: how many, and the context size of each, in tokens."""

    total_slots: int | None
    slot_context_tokens: int | None


def props_url(base_url: str) -> str:
    """Where llama.cpp serves its ``/props``: beside ``/v1`` (a proxy's path prefix kept)."""
    base = base_url.rstrip("/")
    return base.removesuffix("/v1") + "/props"


class _TooLarge(Exception):
    pass


def tls_context() -> ssl.SSLContext:
    """The TLS context of ``https://`` connections to a model server: the system's defaults,
    trusting ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` when they name a file / folder, else
    certifi's CA bundle where it is installed (as httpx did), else the system's store."""
    cafile = os.environ.get("SSL_CERT_FILE") or None
    capath = os.environ.get("SSL_CERT_DIR") or None
    return _tls_context(
        cafile if cafile and os.path.isfile(cafile) else None,
        capath if capath and os.path.isdir(capath) else None,
    )


@functools.cache
def _tls_context(cafile: str | None, capath: str | None) -> ssl.SSLContext:
    # One per trust setting: each costs a read of the CA bundle (~0.1 s).
    if cafile is None and capath is None:
        try:
            import certifi
        except ImportError:  # pragma: no cover - certifi comes with httpx
            return ssl.create_default_context()
        cafile = certifi.where()
    return ssl.create_default_context(cafile=cafile, capath=capath)


async def _get(url: str, headers: dict[str, str], cap: int) -> tuple[int, bytes]:
    tls = tls_context() if url.startswith("https:") else True
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=tls, force_close=True),
        timeout=aiohttp.ClientTimeout(total=None),  # the caller's deadline is for the whole answer
        cookie_jar=aiohttp.DummyCookieJar(),
    ) as session:
        # Credentials in the URL are not sent (the API key is): as the model client does.
        target = yarl.URL(url).with_user(None)
        response = await session.get(target, headers=headers, allow_redirects=False)
        try:
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > cap:
                raise _TooLarge
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.content.iter_any():
                size += len(chunk)
                if size > cap:
                    raise _TooLarge
                chunks.append(chunk)
        finally:
            # Read whole or not (too large, out of time), the connection is closed now.
            response.close()
    return response.status, b"".join(chunks)


def get_small(
    url: str, headers: dict[str, str] | None, *, deadline_s: float, cap: int
) -> tuple[int, bytes]:
    """``GET url``: its status and body, the whole answer within ``deadline_s`` seconds and
    ``cap`` bytes.

    Runs on an event loop of its own in a short-lived thread, so it works from any caller, one
    inside a running loop included. Raises :class:`ModelFailure` saying what went wrong (no
    answer in time, too large, no connection), without the URL.
    """
    outcome: list[tuple[int, bytes] | BaseException] = []

    async def bounded() -> tuple[int, bytes]:
        async with asyncio.timeout(deadline_s):
            return await _get(url, dict(headers or {}), cap)

    def run() -> None:
        try:
            outcome.append(asyncio.run(bounded()))
        except BaseException as exc:  # handed to the caller's thread, which raises it
            outcome.append(exc)

    thread = threading.Thread(target=run, name="loopd-props", daemon=True)
    thread.start()
    # The deadline ends the read; the margin only covers closing the connection.
    thread.join(deadline_s + 5.0)
    result = outcome[0] if outcome else TimeoutError()
    if isinstance(result, TimeoutError):
        raise ModelFailure(f"no whole answer within {deadline_s:g} s")
    if isinstance(result, _TooLarge):
        raise ModelFailure(f"the answer is larger than {cap} bytes")
    if isinstance(result, aiohttp.ClientError | OSError):
        raise ModelFailure(str(result) or type(result).__name__)
    if isinstance(result, BaseException):
        raise result
    return result


def _positive(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= _MAX_COUNT:
        return value
    return None


def parse_props(body: bytes) -> ServerProps:
    """``total_slots`` and ``default_generation_settings.n_ctx`` of a ``/props`` body.

    llama.cpp reports ``n_ctx`` there per slot already (``-c`` divided by ``-np``). Anything
    missing, malformed or impossibly large is None.
    """
    try:
        data = decode_json(body, max_bytes=max(len(body), 1))
    except OutOfBounds:
        return ServerProps(None, None)
    if not isinstance(data, dict):
        return ServerProps(None, None)
    settings = data.get("default_generation_settings")
    n_ctx = _positive(settings.get("n_ctx")) if isinstance(settings, dict) else None
    return ServerProps(_positive(data.get("total_slots")), n_ctx)


def read_props(
    base_url: str, headers: dict[str, str] | None = None, *, timeout_s: float | None = None
) -> ServerProps:
    """Ask the server at ``base_url`` for its ``/props``, waiting at most ``timeout_s`` (by
    default :data:`PROPS_DEADLINE_S`) for the whole answer; a server without them (vLLM,
    Ollama, a hosted API), or one that cannot be reached, is slow or sends more than
    :data:`PROPS_MAX_BYTES`, gives all None, never an error."""
    deadline = PROPS_DEADLINE_S if timeout_s is None else timeout_s
    try:
        status, body = get_small(
            props_url(base_url), headers, deadline_s=deadline, cap=PROPS_MAX_BYTES
        )
    except ModelFailure:
        return ServerProps(None, None)
    if not 200 <= status < 300:
        return ServerProps(None, None)
    return parse_props(body)


def read_total_slots(config: ModelConfig) -> int:
    """The server's slot count, ``total_slots`` from ``GET /props`` (llama.cpp), read within
    ``model.timeout_s`` (at most 30 s) for the whole answer and :data:`PROPS_MAX_BYTES`.

    Raises :class:`ModelFailure` naming the URL and what was wrong.
    """
    url = props_url(config.base_url)
    headers = {}
    api_key = config.api_key()
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        status, body = get_small(
            url, headers, deadline_s=min(config.timeout_s, 30.0), cap=PROPS_MAX_BYTES
        )
    except ModelFailure as exc:
        raise ModelFailure(f"cannot read the server's slot count from {url}: {exc}") from None
    if not 200 <= status < 300:
        raise ModelFailure(f"cannot read the server's slot count from {url}: HTTP {status}")
    total = parse_props(body).total_slots
    if total is None:
        raise ModelFailure(f"the server's {url} has no total_slots of at least 1")
    return total
