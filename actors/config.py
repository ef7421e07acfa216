"""Configuration: one msgspec Struct tree, loadable from TOML, strict about keys and types."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import msgspec
from croniter import croniter
from msgspec import Meta, field

from messages import check_session_id

__all__ = [
    "CompactConfig",
    "Config",
    "ConfigError",
    "CronJob",
    "HeartbeatConfig",
    "LoopConfig",
    "MemoryConfig",
    "ModelConfig",
    "PortConfig",
    "SlotsConfig",
]

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful assistant working inside loopd. Use the tools when they help. "
    "The subagent tool runs a task in a fresh child session and returns its summary."
)


class ConfigError(ValueError):
    """A configuration file or value is wrong; the message names the key."""


class _Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pass


class ModelConfig(_Section, frozen=True):
    """``[model]``: the OpenAI-compatible chat-completions endpoint."""

    base_url: str = "http://127.0.0.1:8080/v1"
    """Everything before ``/chat/completions``."""
    name: str = "local"
    """The ``model`` field of every request."""
    api_key_env: str | None = None
    """Name of an environment variable holding a bearer token; none is sent when unset."""
    timeout_s: Annotated[float, Meta(gt=0)] = 600.0
    """Seconds one request may take, connect to last byte."""
    concurrency: Annotated[int, Meta(ge=1, le=256)] = 8
    """How many model requests may be in flight at once (each on its own worker actor)."""
    retries: Annotated[int, Meta(ge=0, le=10)] = 2
    """Extra attempts after a failure a retry can help (no connection, 429, 5xx, timeout)."""
    retry_backoff_s: Annotated[float, Meta(ge=0)] = 0.5
    """The first retry's wait; each further retry waits twice as long."""
    retry_max_wait_s: Annotated[float, Meta(ge=0)] = 30.0
    """The longest wait before a retry, a server's Retry-After included."""

    def api_key(self) -> str | None:
        """The bearer token from ``api_key_env``, or None."""
        return os.environ.get(self.api_key_env) if self.api_key_env else None


class SlotsConfig(_Section, frozen=True):
    """``[slots]``: llama.cpp server slots (``id_slot``) for top-level sessions and children."""

    main: Annotated[int, Meta(ge=0)] = 0
    background: Annotated[int, Meta(ge=0)] = 1


class LoopConfig(_Section, frozen=True):
    """``[loop]``: the bounds of one turn."""

    max_steps: Annotated[int, Meta(ge=1)] = 16
    """Model requests per turn; a model still calling tools at the limit ends with TURN_LIMIT."""
    tool_result_cap: Annotated[int, Meta(ge=1)] = 16_000
    """Characters of one tool result (and of a subagent's task) kept."""
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    """The system prompt every new session's baseline starts with."""
    max_depth: Annotated[int, Meta(ge=0)] = 4
    """How deep children may nest: a top-level session is depth 0, its child depth 1."""
    max_children: Annotated[int, Meta(ge=1)] = 8
    """Children one session may have running at once; more calls are denied."""
    max_children_total: Annotated[int, Meta(ge=1)] = 64
    """Children the whole runtime may have running at once; more calls are denied."""
    child_timeout_s: Annotated[float, Meta(gt=0)] | None = None
    """Seconds a child's turn may take before its parent is answered failed (none: no limit)."""


class CompactConfig(_Section, frozen=True):
    """``[compact]``: when a transcript is summarised, and how long the summary may be."""

    summary_chars: Annotated[int, Meta(ge=1)] = 2_000
    """Cap of a compaction summary and of a subagent's summary to its parent."""
    threshold_chars: Annotated[int, Meta(ge=1)] = 200_000
    """A transcript longer than this (in characters, after the baseline) is compacted."""


class PortConfig(_Section, frozen=True):
    """``[port]``: the workers that run port tools."""

    concurrency: Annotated[int, Meta(ge=1, le=256)] = 8
    """How many port tool calls may run at once (each on its own worker actor)."""


class MemoryConfig(_Section, frozen=True):
    """``[memory]``: the file every new baseline reads, and who may write to it."""

    file: str = "MEMORY.md"
    """The memory file, relative to ``home`` (or absolute)."""
    allow_untrusted_writes: bool = False
    """Whether an untrusted session may use the ``remember`` tool."""


class CronJob(_Section, frozen=True):
    """One ``[[cron]]`` entry: a turn on ``session`` with ``prompt`` at each ``schedule`` time."""

    session: str
    """The session the turn runs in."""
    schedule: str
    """A five-field cron expression, evaluated in UTC (``0 7 * * 1-5``)."""
    prompt: str
    """The turn's text, after the ``It is <now>.`` line."""

    def __post_init__(self) -> None:
        check_session_id(self.session)
        if len(self.schedule.split()) != 5 or not croniter.is_valid(self.schedule):
            raise ValueError(f"not a five-field cron expression: {self.schedule!r}")


class HeartbeatConfig(_Section, frozen=True):
    """``[heartbeat]``: a turn on ``session`` every ``every_s`` seconds, prompted by ``file``."""

    session: str
    """The session the turn runs in."""
    every_s: Annotated[float, Meta(gt=0)]
    """Seconds between two heartbeats."""
    file: str = "HEARTBEAT.md"
    """The prompt file, relative to ``home``; read afresh at each heartbeat."""

    def __post_init__(self) -> None:
        check_session_id(self.session)


def _default_home() -> str:
    return str(Path("~/.loopd").expanduser())


class Config(_Section, frozen=True):
    """All of loopd's settings. ``Config.load(path)`` reads them from TOML."""

    home: str = field(default_factory=_default_home)
    """The folder that holds the session store and ``MEMORY.md``."""
    model: ModelConfig = field(default_factory=ModelConfig)
    slots: SlotsConfig = field(default_factory=SlotsConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)
    compact: CompactConfig = field(default_factory=CompactConfig)
    port: PortConfig = field(default_factory=PortConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    cron: tuple[CronJob, ...] = ()
    """``[[cron]]`` jobs."""
    heartbeat: HeartbeatConfig | None = None
    """``[heartbeat]``, if any."""

    def __post_init__(self) -> None:
        # Accept a Path (or any os.PathLike) for convenience; keep a plain expanded string.
        home = self.home
        if not isinstance(home, str | os.PathLike):
            raise ConfigError(f"home must be a path, not {type(home).__name__}")
        msgspec.structs.force_setattr(self, "home", str(Path(home).expanduser()))

    @property
    def home_path(self) -> Path:
        """``home`` as a Path."""
        return Path(self.home)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Config:
        """Read a TOML file; a missing key takes its default, an unknown or mistyped one fails.

        Raises ``ConfigError`` naming the file and the key (``$.loop.max_steps``, say).
        """
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read config file {os.fspath(path)}: {exc}") from exc
        return cls.from_toml(data, source=os.fspath(path))

    @classmethod
    def from_toml(cls, data: bytes | str, *, source: str = "<toml>") -> Config:
        """Parse TOML text into a Config (see :meth:`load`)."""
        try:
            return msgspec.toml.decode(data, type=cls)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"{source}: {exc}") from exc
        except msgspec.DecodeError as exc:
            raise ConfigError(f"{source}: not valid TOML: {exc}") from exc

    def replace(self, **changes: Any) -> Config:
        """A copy with ``changes`` applied (top-level fields)."""
        return msgspec.structs.replace(self, **changes)
