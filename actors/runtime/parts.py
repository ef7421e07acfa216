"""The parts a runtime is wired from, picked here and nowhere else: the config as resolved
against the model server, the tracer, a cluster engine (by entry point), the MCP service, the
A2A service of remote agents."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
from typing import TYPE_CHECKING, Any

from actors.core.config import Config, ConfigError
from actors.core.dispatch import Registry
from actors.core.text import RedactFilter, redact
from actors.dispatcher.directory import Directory
from actors.models.base import ModelFailure
from actors.models.http import read_total_slots
from actors.models.llama import read_props
from actors.tracing.base import NoTracer, Tracer
from messages.remote import DropRemoteTask, ListRemoteTasks, RemoteTaskRow

if TYPE_CHECKING:
    import pykka

    from actors.services.a2a import A2aService
    from actors.services.mcp import McpService

__all__ = ["ENGINES", "LIBRARY_LOGGERS", "RemoteAgents", "default_tracer", "resolve_config"]

log = logging.getLogger("actors.runtime")

_otel_broken = False
"""Set once OpenTelemetry failed to import: the warning is given once per process."""

LIBRARY_LOGGERS = ("httpx", "httpcore", "aiohttp")
"""The libraries' loggers whose records pass through the runtime's redaction filter."""


def resolve_config(config: Config) -> Config:
    """``config`` with what is only known at start filled in: explicit slot pools (with
    ``slots.total = "auto"``, the server's ``total_slots`` read from ``GET /props``).

    Raises ``ConfigError`` if the slot count cannot be read or a pool names a slot the server
    does not have.
    """
    slots = config.slots
    total = None
    if slots.total == "auto":
        try:
            total = read_total_slots(config.model)
        except ModelFailure as exc:
            scrubbed = redact(str(exc), secrets=config.model.secrets())
            raise ConfigError(f'slots.total = "auto": {scrubbed}') from None
    return config.replace(slots=slots.resolved(total))


def _context_tokens(config: Config, *, own_model: bool) -> int | None:
    """A slot's context size: configured, or read from a llama.cpp server's ``/props``."""
    if config.model.context_tokens is not None or not own_model:
        return config.model.context_tokens
    api_key = config.model.api_key()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    # httpx logs the URL it gets, credentials included: redact it before the runtime's filter
    # is installed.
    scrub = RedactFilter(config.secrets())
    loggers = [logging.getLogger(name) for name in LIBRARY_LOGGERS]
    for logger in loggers:
        logger.addFilter(scrub)
    try:
        return read_props(config.model.base_url, headers).slot_context_tokens
    finally:
        for logger in loggers:
            logger.removeFilter(scrub)


def _mcp_service(config: Config, registry: Registry, directory: Directory) -> McpService | None:
    """The MCP service of ``config``'s ``[mcp.NAME]`` servers (none: None). Imported only
    then: the ``mcp`` SDK is an extra."""
    if not config.mcp:
        return None
    try:
        from actors.services.mcp import McpService
    except ImportError as exc:
        raise ConfigError(
            f"[mcp] servers need the mcp package ({exc}); install loopd with pip install '.[mcp]'"
        ) from None
    keys = [config.model.api_key_env, *(a.api_key_env for a in config.agents.values())]
    return McpService(
        config.mcp,
        registry.mcp_catalog,
        directory,
        result_cap=config.loop.tool_result_cap,
        secret_variables=[key for key in keys if key],
    )


class RemoteAgents:
    """The A2A service of ``config``'s remote agents (``[agents.NAME] a2a_url``), if any, as
    the runtime starts and stops it. The SDK is imported only then: it is an extra."""

    def __init__(self, config: Config | None = None, directory: Directory | None = None) -> None:
        self.service: A2aService | None = None
        self.directory = directory
        remote = {n: a for n, a in (config.agents if config else {}).items() if a.a2a_url}
        if not remote or config is None:
            return
        try:
            from actors.services.a2a import A2aService
        except ImportError as exc:
            raise ConfigError(
                f"agents.{next(iter(remote))}.a2a_url needs the a2a-sdk package ({exc}); "
                "install loopd with pip install '.[a2a]'"
            ) from None
        assert directory is not None
        cap = config.loop.tool_result_cap
        self.service = A2aService(remote, directory, result_cap=cap)

    def start(self, store: pykka.ActorRef[Any]) -> None:
        """Start the service at its address; then the remote children a crash cut off (their
        rows in the store): cancel their remote tasks, a few seconds at most, drop the rows."""
        from actors.dispatcher.directory import A2A

        if self.service is not None and self.directory is not None:
            self.service.start()
            self.directory.register(A2A, self.service)
        asked = store.ask(ListRemoteTasks(), block=True, timeout=30)
        rows: tuple[RemoteTaskRow, ...] = tuple(asked)
        if not rows:
            return
        if self.service is None:
            log.warning(
                "loopd: %d remote tasks a crash left; no remote agent to cancel them", len(rows)
            )
            for row in rows:
                store.tell(DropRemoteTask(row.child, "", 0))
            return
        log.info("loopd: cancelling %d remote tasks a crash left", len(rows))
        self.service.cancel_orphans(rows)

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel the remote tasks still followed and end the service's loop."""
        from actors.dispatcher.directory import A2A

        if self.service is not None and self.directory is not None:
            self.directory.unregister(A2A, self.service)
            self.service.stop(timeout)
            self.service = None


ENGINES = "loopd.engines"
"""The entry-point group where a cluster engine is found by its ``[cluster] engine`` name (the
Ray engine is ``actors.cluster:ClusterRuntime``): this module never imports an engine."""


def _engine(name: str) -> Any:
    """The engine class registered as ``name`` in :data:`ENGINES`; ``ValueError`` if none is."""
    found = importlib.metadata.entry_points(group=ENGINES, name=name)
    for entry in found:
        return entry.load()
    raise ValueError(
        f"[cluster] engine = {name!r}: no engine of that name is installed "
        f"(entry-point group {ENGINES!r}; is loopd installed with pip install '.[ray]'?)"
    )


def default_tracer() -> Tracer:
    """OpenTelemetry's tracer (:class:`~actors.tracing.otel.OtelTracer`, global provider)
    when ``opentelemetry-api`` is installed; otherwise :class:`NoTracer`, importing nothing.

    An OpenTelemetry that is installed but fails to import (a broken or mismatched install)
    means no tracing and one warning, never a failed start."""
    global _otel_broken
    if _otel_broken:
        return NoTracer()
    try:
        if importlib.util.find_spec("opentelemetry") is None:  # looks, imports nothing
            return NoTracer()
        if importlib.util.find_spec("opentelemetry.trace") is None:  # another opentelemetry part
            return NoTracer()
        from actors.tracing.otel import OtelTracer

        return OtelTracer()
    except Exception as exc:  # an optional extra: whatever its import raises, start goes on
        _otel_broken = True
        log.warning(
            "loopd: OpenTelemetry is installed but cannot be loaded (%s: %s); tracing is off",
            type(exc).__name__,
            exc,
        )
        return NoTracer()
