"""What a llama.cpp server says about itself (``GET /props``), read once at start.

:func:`actors.models.http.read_total_slots` reads the slot count strictly (``slots.total = "auto"``
needs it); :func:`read_props` is lenient: a server without ``/props`` just leaves the context
size unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import msgspec

from actors.models.http import props_url

__all__ = ["ServerProps", "parse_props", "read_props"]

# /props is a small local answer; a server that does not have it must not slow the start.
_PROPS_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ServerProps:
    """A llama.cpp server's slots: how many, and the context size of each, in tokens."""

    total_slots: int | None
    slot_context_tokens: int | None


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def parse_props(body: bytes) -> ServerProps:
    """``total_slots`` and ``default_generation_settings.n_ctx`` of a ``/props`` body.

    llama.cpp reports ``n_ctx`` there per slot already (``-c`` divided by ``-np``). Anything
    missing or malformed is None.
    """
    try:
        data = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return ServerProps(None, None)
    if not isinstance(data, dict):
        return ServerProps(None, None)
    settings = data.get("default_generation_settings")
    n_ctx = _positive(settings.get("n_ctx")) if isinstance(settings, dict) else None
    return ServerProps(_positive(data.get("total_slots")), n_ctx)


def read_props(
    base_url: str, headers: dict[str, str] | None = None, *, timeout_s: float = _PROPS_TIMEOUT_S
) -> ServerProps:
    """Ask the server at ``base_url`` for its ``/props``; a server without them (vLLM, Ollama,
    a hosted API), or one that cannot be reached, gives all None, never an error."""
    try:
        response = httpx.get(props_url(base_url), headers=headers, timeout=timeout_s)
    except httpx.HTTPError:
        return ServerProps(None, None)
    if not response.is_success:
        return ServerProps(None, None)
    return parse_props(response.content)
