"""What the HTTP service runs with, checked before the runtime starts.

This module imports no web library: ``loopd serve`` refuses a bad address or token setting
with a clear message even where the ``serve`` extra is not installed.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass

from actors.core.config import Config, ConfigError
from actors.core.listen import format_listen, is_loopback, parse_listen

__all__ = [
    "CLIENT_QUEUE",
    "MAX_BODY_BYTES",
    "RUNBOOK_NO_TOKEN",
    "RUNBOOK_OPEN_ADDRESS",
    "ServiceSettings",
    "check_a2a",
    "service_settings",
]

MAX_BODY_BYTES = 1 << 20
"""The largest request body the service reads (1 MiB); a larger one is answered 413."""

CLIENT_QUEUE = 1024
"""Events one ``/v1/events`` client may have waiting to be sent; one more and it is dropped."""

RUNBOOK_NO_TOKEN = "see docs/runbook.md#serve-token-unset"
RUNBOOK_OPEN_ADDRESS = "see docs/runbook.md#serve-open-address"


@dataclass(frozen=True)
class ServiceSettings:
    """The service's settings: where it listens, its token (None: no token), its buffers."""

    host: str
    port: int
    token: str | None = None
    replay_events: int = 1000
    client_queue: int = CLIENT_QUEUE
    max_body_bytes: int = MAX_BODY_BYTES

    def __repr__(self) -> str:  # the token never reaches a log or a traceback
        shown = "set" if self.token else "none"
        return f"ServiceSettings(listen={format_listen(self.host, self.port)!r}, token={shown})"

    @property
    def address(self) -> str:
        """``host:port`` as given."""
        return format_listen(self.host, self.port)


def service_settings(
    config: Config, listen: str | None = None, environ: Mapping[str, str] | None = None
) -> ServiceSettings | None:
    """The service's settings from ``[serve]`` and ``--listen`` (which wins), or None when
    neither gives an address (no HTTP service).

    Raises :class:`ConfigError` for a bad address, for a ``token_env`` whose variable is unset,
    empty, only whitespace or has whitespace at either end (HTTP strips it, so no request
    could carry that token), and for an address that is not loopback without a token.
    """
    environ = os.environ if environ is None else environ
    text = listen if listen is not None else config.serve.listen
    if text is None:
        if config.a2a.serve:
            raise ConfigError(
                "a2a.serve is true but nothing is served: the A2A endpoint is mounted on the "
                "HTTP service, so give --listen HOST:PORT (or [serve] listen)"
            )
        return None
    check_a2a(config)
    try:
        host, port = parse_listen(text, "--listen" if listen is not None else "serve.listen")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    token: str | None = None
    name = config.serve.token_env
    if name is not None:
        token = environ.get(name, "")
        if not token.strip():
            raise ConfigError(
                f"serve.token_env names {name}, which is unset or empty (or only whitespace): "
                "set it to the token clients must send, or remove serve.token_env; "
                f"{RUNBOOK_NO_TOKEN}"
            )
        if token != token.strip():
            # HTTP strips a header value's spaces: such a token could never be sent whole.
            raise ConfigError(
                f"serve.token_env names {name}, whose token begins or ends with whitespace, "
                "which HTTP strips from the Authorization header, so no request could match "
                f"it: remove the whitespace; {RUNBOOK_NO_TOKEN}"
            )
    if token is None and not is_loopback(host):
        raise ConfigError(
            f"refusing to serve on {format_listen(host, port)} without a token: it is not a "
            "loopback address, so anyone who can reach it could run turns; set serve.token_env "
            f"(and the variable it names) or listen on 127.0.0.1; {RUNBOOK_OPEN_ADDRESS}"
        )
    return ServiceSettings(host, port, token, config.serve.replay_events)


def check_a2a(config: Config) -> None:
    """:class:`ConfigError` naming the extra when ``[a2a] serve`` is on and the A2A SDK is
    not installed (looked for, not imported: this module imports no web library)."""
    if config.a2a.serve and (
        importlib.util.find_spec("a2a") is None
        or importlib.util.find_spec("a2a.server") is None
        or importlib.util.find_spec("sse_starlette") is None
    ):
        raise ConfigError(
            "a2a.serve is true but the A2A SDK (a2a-sdk with its http-server extra) is not "
            "installed: install loopd with its a2a extra, pip install '.[a2a]'"
        )
