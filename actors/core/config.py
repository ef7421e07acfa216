"""Configuration: one msgspec Struct tree, loadable from TOML, strict about keys and types.

This module holds the root, :class:`Config`, and its loading (``Config.load``, ``from_toml``).
It is also the door to every table: the structs live by concept beside it and are named here
too, so ``from actors.core.config import ModelConfig`` is the one import a caller needs.

- ``config_base``: ``ConfigError``, the value checks and the ``Section`` base of every table;
- ``config_model``: ``[model]``, ``[slots]`` and the ``[agents.NAME]`` profiles;
- ``config_tables``: ``[loop]``, ``[compact]``, ``[port]``, ``[memory]``, ``[runtime]``,
  ``[sessions]``, ``[store]`` and ``[cluster]``;
- ``config_jobs``: the scheduled jobs, ``[[cron]]`` and ``[heartbeat]``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec
from msgspec import field

from actors.core.config_base import (
    BACKENDS,
    MAX_CONFIG_BYTES,
    MAX_SECONDS,
    ConfigError,
    Section,
    check_backend,
    check_base_url,
    check_path_text,
    check_wait,
)
from actors.core.config_jobs import CronJob, HeartbeatConfig
from actors.core.config_model import (
    DEFAULT_AGENT,
    RESERVED_BODY_KEYS,
    AgentConfig,
    ModelConfig,
    SlotsConfig,
)
from actors.core.config_tables import (
    A2aConfig,
    ApprovalsConfig,
    ClusterConfig,
    CompactConfig,
    LoopConfig,
    MemoryConfig,
    PortConfig,
    RuntimeConfig,
    ServeConfig,
    SessionsConfig,
    StoreConfig,
    SubagentsConfig,
)
from actors.core.files import read_regular_file
from actors.core.mcp_config import McpServerConfig
from messages import SlotPool

__all__ = [
    "BACKENDS",
    "DEFAULT_AGENT",
    "MAX_CONFIG_BYTES",
    "MAX_SECONDS",
    "RESERVED_BODY_KEYS",
    "A2aConfig",
    "AgentConfig",
    "ApprovalsConfig",
    "ClusterConfig",
    "CompactConfig",
    "Config",
    "ConfigError",
    "CronJob",
    "HeartbeatConfig",
    "LoopConfig",
    "MemoryConfig",
    "ModelConfig",
    "PortConfig",
    "RuntimeConfig",
    "ServeConfig",
    "SessionsConfig",
    "SlotPool",
    "SlotsConfig",
    "StoreConfig",
    "SubagentsConfig",
    "check_backend",
    "check_base_url",
    "check_wait",
]


def _default_home() -> str:
    return str(Path("~/.loopd").expanduser())


class Config(Section, frozen=True):
    """All of loopd's settings. ``Config.load(path)`` reads them from TOML."""

    home: str = field(default_factory=_default_home)
    """The folder that holds the session store and ``MEMORY.md``."""
    model: ModelConfig = field(default_factory=ModelConfig)
    slots: SlotsConfig = field(default_factory=SlotsConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)
    subagents: SubagentsConfig = field(default_factory=SubagentsConfig)
    compact: CompactConfig = field(default_factory=CompactConfig)
    port: PortConfig = field(default_factory=PortConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    sessions: SessionsConfig = field(default_factory=SessionsConfig)
    cron: tuple[CronJob, ...] = ()
    """``[[cron]]`` jobs."""
    heartbeat: HeartbeatConfig | None = None
    """``[heartbeat]``, if any."""
    store: StoreConfig = field(default_factory=StoreConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    a2a: A2aConfig = field(default_factory=A2aConfig)
    """``[a2a]``: the service's A2A endpoint."""
    agents: dict[str, AgentConfig] = field(default_factory=dict)
    """``[agents.NAME]`` profiles, by name."""
    mcp: dict[str, McpServerConfig] = field(default_factory=dict)
    """``[mcp.NAME]`` servers, by name (see :class:`~actors.core.mcp_config.McpServerConfig`)."""
    approvals: ApprovalsConfig = field(default_factory=ApprovalsConfig)
    """``[approvals]``: the calls a person decides."""

    def __post_init__(self) -> None:
        # Accept a Path (or any os.PathLike) for convenience; keep a plain expanded string.
        home = self.home
        if not isinstance(home, str | os.PathLike):
            raise ConfigError(f"home must be a path, not {type(home).__name__}")
        home = os.fspath(home)
        if not isinstance(home, str):
            raise ConfigError(f"home must be a text path, not {type(home).__name__}")
        check_path_text(home, "home")  # '' would silently mean the current folder
        try:
            expanded = Path(home).expanduser()
        except RuntimeError as exc:  # ``~nosuchuser``
            raise ConfigError(f"home {home!r}: {exc}") from None
        msgspec.structs.force_setattr(self, "home", str(expanded))
        super().__post_init__()
        if self.cluster.engine != "none" and self.store.url is None:
            raise ConfigError(
                "cluster.engine needs a shared store: set store.url to a PostgreSQL url"
            )
        for name, profile in self.agents.items():
            profile.check(name)
        for index, job in enumerate(self.cron):
            if job.agent is not None and job.agent not in self.agent_names():
                raise ConfigError(
                    f"cron[{index}].agent (the job on {job.session}): no agent profile is named "
                    f"{job.agent!r} (the config has: {', '.join(self.agent_names())})"
                )
        keys = [self.model.api_key_env, *(a.api_key_env for a in self.agents.values())]
        for name, server in self.mcp.items():
            problem = server.check(name) or server.secret_leak(name, filter(None, keys))
            if problem is not None:
                raise ConfigError(problem)

    def agent(self, name: str) -> AgentConfig:
        """The profile ``name``; ``default`` is an empty profile when not configured.
        ``KeyError`` for any other name that is not configured."""
        found = self.agents.get(name)
        if found is not None:
            return found
        if name == DEFAULT_AGENT:
            return AgentConfig()
        raise KeyError(name)

    def endpoint(self, name: str) -> ModelConfig:
        """The ``[model]`` table profile ``name``'s requests go out with: its own ``base_url``
        and ``api_key_env`` when it sets either (a profile that sets only ``base_url`` sends no
        key: ``model.api_key_env``'s key is not sent to another server)."""
        profile = self.agent(name)
        if profile.base_url is None and profile.api_key_env is None:
            return self.model
        return msgspec.structs.replace(
            self.model,
            base_url=profile.base_url or self.model.base_url,
            api_key_env=profile.api_key_env,
        )

    def secrets(self) -> tuple[str, ...]:
        """Every secret of every endpoint (see :meth:`ModelConfig.secrets`)."""
        found = list(self.model.secrets())
        for name in self.agents:
            found += [s for s in self.endpoint(name).secrets() if s not in found]
        return tuple(found)

    def agent_names(self) -> tuple[str, ...]:
        """Every profile a session may run: ``default`` first, then the configured ones."""
        return (DEFAULT_AGENT, *sorted(n for n in self.agents if n != DEFAULT_AGENT))

    @property
    def home_path(self) -> Path:
        """``home`` as a Path."""
        return Path(self.home)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Config:
        """Read a TOML file; a missing key takes its default, an unknown or mistyped one fails.

        Raises ``ConfigError`` naming the file and the key (``$.loop.max_steps``, say). Only a
        regular file of at most :data:`MAX_CONFIG_BYTES` is read (not a FIFO or ``/dev/zero``).
        """
        try:
            data = read_regular_file(path, MAX_CONFIG_BYTES)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {os.fspath(path)}: {exc}") from exc
        return cls.from_toml(data, source=os.fspath(path))

    @classmethod
    def from_toml(cls, data: bytes | str, *, source: str = "<toml>") -> Config:
        """Parse TOML text into a Config (see :meth:`load`)."""
        if isinstance(data, bytes):
            data = data.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 BOM, as some editors write
        else:
            data = data.removeprefix("\ufeff")
        try:
            return msgspec.toml.decode(data, type=cls)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"{source}: {exc}") from exc
        except msgspec.DecodeError as exc:
            raise ConfigError(f"{source}: not valid TOML: {exc}") from exc

    def replace(self, **changes: Any) -> Config:
        """A copy with ``changes`` applied (top-level fields)."""
        return msgspec.structs.replace(self, **changes)
