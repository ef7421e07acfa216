"""Starting the HTTP service, found only when asked for: ``loopd serve`` imports no Starlette
until ``--listen`` (or ``[serve] listen``) says to serve."""

from __future__ import annotations

from typing import Any

from actors.core.config import ConfigError
from actors.shells.service.settings import ServiceSettings

__all__ = ["start_service"]


def start_service(runtime: Any, settings: ServiceSettings) -> Any:
    """Start the HTTP service (``actors.shells.service.server.Service``) over ``runtime``.

    Raises :class:`ConfigError` when Starlette or uvicorn is not installed (the ``serve``
    extra), and ``OSError`` naming the address when it cannot be bound.
    """
    try:
        from actors.shells.service.server import Service
    except ImportError as exc:
        raise ConfigError(
            f"serving over HTTP needs Starlette and uvicorn ({exc.name} is missing): install "
            "loopd with its serve extra, pip install '.[serve]'"
        ) from None
    return Service.start(runtime, settings)
