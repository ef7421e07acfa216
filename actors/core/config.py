"""Configuration: one msgspec Struct tree, loadable from TOML, strict about keys and types."""

from __future__ import annotations

import contextlib
import math
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

import httpx
import msgspec
from croniter import CroniterError, croniter
from msgspec import Meta, field

from actors.core.files import read_regular_file
from actors.core.mcp_config import McpServerConfig
from actors.core.text import redact
from messages import SlotPool, check_session_id, check_top_level_session

__all__ = [
    "BACKENDS",
    "DEFAULT_AGENT",
    "RESERVED_BODY_KEYS",
    "AgentConfig",
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
    "SessionsConfig",
    "SlotPool",
    "SlotsConfig",
    "StoreConfig",
    "check_backend",
    "check_base_url",
    "check_wait",
]

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful assistant working inside loopd. Use the tools when they help. "
    "The subagent tool runs a task in a fresh child session and returns its summary."
)


MAX_SECONDS = 365 * 24 * 3600
"""The longest time any ``*_s`` key (and ``--timeout``) may say: 365 days."""

MAX_CONFIG_BYTES = 1 << 20
"""The largest config file ``Config.load`` reads (1 MiB)."""

_MAX_INT = 2**63 - 1
_MAX_URL_CHARS = 2048
_MAX_HOST_CHARS = 253
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ConfigError(ValueError):
    """A configuration file or value is wrong; the message names the key."""


def check_wait(value: object, what: str) -> float | None:
    """``value`` as seconds to wait: None (no limit) or a finite number above 0 and at most
    :data:`MAX_SECONDS`; ``ValueError`` naming ``what`` otherwise (``inf``, ``nan``, ``-1``, ``0``,
    ``1e308``, a bool or a text)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value) or not 0 < value <= MAX_SECONDS:
        raise ValueError(
            f"{what} must be a finite number of seconds above 0 and at most "
            f"{MAX_SECONDS} (365 days), not {value!r}"
        )
    return float(value)


def check_base_url(url: str, key: str = "model.base_url") -> str:
    """Return ``url`` if it can be the base of every model request; ``ConfigError`` naming
    ``key`` otherwise.

    It must be ``http://`` or ``https://`` with a host, at most 2,048 characters, with no
    whitespace or control character, no query or fragment, a valid port, and a host of at most
    253 characters. Credentials in it are redacted from the error text.
    """
    shown = repr(redact(url)[:80] + ("…" if len(url) > 80 else ""))

    def refuse(why: str) -> ConfigError:
        return ConfigError(f"{key} {shown} is not a usable URL: {why}")

    if len(url) > _MAX_URL_CHARS:
        raise refuse(f"it is longer than {_MAX_URL_CHARS} characters")
    if any(c.isspace() or not c.isprintable() for c in url):
        raise refuse("it holds whitespace or a control character")
    try:
        parts = urlsplit(url)
        port = parts.port  # a port out of range or not a number raises here
        host = parts.hostname
    except ValueError as exc:
        raise refuse(str(exc)) from None
    if parts.scheme not in ("http", "https"):
        raise refuse("it must start with http:// or https://")
    if not host:
        raise refuse("it has no host")
    if len(host) > _MAX_HOST_CHARS:
        raise refuse(f"its host is longer than {_MAX_HOST_CHARS} characters")
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise refuse("it must not have a query or a fragment")
    if port == 0:
        raise refuse("port 0 is not a port a server listens on")
    try:
        httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as exc:
        raise refuse(str(exc)) from None
    return url


BACKENDS = ("llama.cpp", "openai")
"""The values of ``model.backend`` (and a profile's ``backend``)."""


def check_backend(value: str, key: str) -> None:
    """``ConfigError`` naming ``key`` unless ``value`` is one of :data:`BACKENDS`."""
    if value not in BACKENDS:
        raise ConfigError(f"{key} must be one of {', '.join(BACKENDS)}, not {value!r}")


def _check_path_text(value: str, key: str) -> None:
    if not value:
        raise ConfigError(f"{key} must not be empty")
    if "\x00" in value:
        raise ConfigError(f"{key} must not hold a NUL character")


def _check_value(key: str, value: Any) -> None:
    """The rules msgspec's constraints do not state: finite floats, bounded ints and seconds,
    text that is valid Unicode."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key} must be a finite number, not {value!r}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if key.endswith("_s") and value > MAX_SECONDS:
            raise ConfigError(
                f"{key} must be at most {MAX_SECONDS} seconds (365 days), not {value!r}"
            )
        if abs(value) > _MAX_INT:
            raise ConfigError(f"{key} is too large: {value!r}")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError(f"{key} is not valid Unicode text (index {exc.start})") from None


class _Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A config table. Every value is checked when the table is built, from TOML or in Python
    alike: msgspec's constraints (which it enforces only when decoding) and the rules of
    :func:`_check_value`. A value of the right kind is normalised (an int given for a float
    becomes a float, a list for a tuple a tuple)."""

    _key: ClassVar[str] = ""
    """The table's name in TOML (``model``), for the key names of errors."""

    def __post_init__(self) -> None:
        prefix = f"{self._key}." if self._key else ""
        for name, kind in _field_types(type(self)):
            key = prefix + name
            value = getattr(self, name)
            try:
                checked = msgspec.convert(value, type=kind, strict=True)
            except msgspec.ValidationError as exc:
                raise ConfigError(f"{key}: {exc}") from None
            _check_value(key, checked)
            if checked is not value:
                msgspec.structs.force_setattr(self, name, checked)


_FIELD_TYPES: dict[type, tuple[tuple[str, Any], ...]] = {}


def _field_types(cls: type[_Section]) -> tuple[tuple[str, Any], ...]:
    """``(name, type)`` of each field of ``cls``; computed once per class (msgspec evaluates
    the annotations afresh on every ``fields`` call, which would make each Config cost ms)."""
    found = _FIELD_TYPES.get(cls)
    if found is None:
        found = tuple((f.name, f.type) for f in msgspec.structs.fields(cls))
        _FIELD_TYPES[cls] = found
    return found


class ModelConfig(_Section, frozen=True):
    """``[model]``: the OpenAI-compatible chat-completions endpoint."""

    _key: ClassVar[str] = "model"

    base_url: str = "http://127.0.0.1:8080/v1"
    """Everything before ``/chat/completions``."""
    name: str = "local"
    """The ``model`` field of every request."""
    api_key_env: str | None = None
    """Name of an environment variable holding a bearer token; none is sent when unset."""
    timeout_s: Annotated[float, Meta(gt=0)] = 600.0
    """Seconds one attempt may take, connect to last byte, whatever the server's pace.

    A wait for a free slot does not count."""
    concurrency: Annotated[int, Meta(ge=1, le=65_536)] = 64
    """How many model requests may be in flight at once: tasks of one event loop, not threads.

    Never fewer than ``loop.max_children`` (the runtime raises it to that)."""
    max_answer_bytes: Annotated[int, Meta(ge=1)] = 8 * 1024 * 1024
    """The largest answer body read; a larger one fails the request with ``model_error``."""
    disconnect_grace_s: Annotated[float, Meta(ge=0)] = 3.0
    """Seconds a server may take to notice a closed connection and stop generating.

    A slot whose request was cut off (cancelled, timed out, too large) gets no new request,
    a retry included, before this has passed."""
    retries: Annotated[int, Meta(ge=0, le=10)] = 2
    """Extra attempts after a failure a retry can help (no connection, 429, 5xx, timeout)."""
    retry_backoff_s: Annotated[float, Meta(ge=0)] = 0.5
    """The first retry's wait; each further retry waits twice as long."""
    retry_max_wait_s: Annotated[float, Meta(ge=0)] = 30.0
    """The longest wait before a retry, a server's Retry-After included."""
    backend: str = "llama.cpp"
    """What the server speaks: ``llama.cpp`` (``id_slot`` and ``cache_prompt`` are sent) or
    ``openai`` (the plain chat-completions request, nothing else)."""
    stream: bool = False
    """Ask for server-sent events: the answer's text is shown as it is written."""
    max_tokens: Annotated[int, Meta(ge=1)] = 2048
    """The longest answer, in tokens, sent as ``max_tokens`` with every request."""
    on_length: str = "fail"
    """A final answer cut off at ``max_tokens``: ``"fail"`` the turn, or ``"keep"`` it marked
    truncated."""
    context_tokens: Annotated[int, Meta(ge=1)] | None = None
    """A slot's context size in tokens; none: read from llama.cpp's ``GET /props`` at start."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_backend(self.backend, "model.backend")
        check_base_url(self.base_url)
        if self.on_length not in ("fail", "keep"):
            raise ConfigError(f'model.on_length must be "fail" or "keep", not {self.on_length!r}')
        if self.api_key_env is not None and not _ENV_NAME.fullmatch(self.api_key_env):
            raise ConfigError(
                f"model.api_key_env {self.api_key_env!r} is not an environment variable name "
                "(letters, digits and _, not starting with a digit)"
            )

    def api_key(self) -> str | None:
        """The bearer token from ``api_key_env`` without surrounding whitespace, or None.

        None when ``api_key_env`` is unset, the variable is not set, or it is blank. A key
        holding any other control or non-ASCII character cannot go into an HTTP header: that
        is a :class:`ConfigError` naming the variable, never its value.
        """
        if not self.api_key_env:
            return None
        key = os.environ.get(self.api_key_env, "").strip()
        for position, char in enumerate(key, start=1):
            if not (char.isascii() and char.isprintable()):
                kind = "non-ASCII" if not char.isascii() else "control"
                raise ConfigError(
                    f"the API key in the environment variable {self.api_key_env} "
                    f"(model.api_key_env) has a {kind} character at position {position}; "
                    "an HTTP header cannot carry it: set the variable to the key alone"
                )
        return key or None

    def secrets(self) -> tuple[str, ...]:
        """Every text that must never appear in what loopd writes: the API key (as set, and
        stripped) and the password of ``base_url``; for :func:`actors.core.text.redact`."""
        found: list[str] = []
        if self.api_key_env:
            raw = os.environ.get(self.api_key_env, "")
            found += [raw, raw.strip()]
        with contextlib.suppress(ValueError):
            found.append(urlsplit(self.base_url).password or "")
        return tuple(s for s in found if s)


SlotId = Annotated[int, Meta(ge=0)]
"""A llama.cpp slot number (``id_slot``)."""
SlotIds = SlotId | Annotated[tuple[SlotId, ...], Meta(min_length=1)]
"""One slot, or a pool of them."""


def _pool_ids(value: int | tuple[int, ...]) -> tuple[int, ...]:
    ids = (value,) if isinstance(value, int) else tuple(value)
    return tuple(dict.fromkeys(ids))  # order kept, duplicates dropped


class SlotsConfig(_Section, frozen=True):
    """``[slots]``: llama.cpp server slots (``id_slot``) for top-level sessions and children.

    Each pool is a slot id or a list of them. A request takes a free slot of its pool, never
    one that has a request in flight; see :class:`actors.core.slots.SlotTable`.
    """

    _key: ClassVar[str] = "slots"

    main: SlotIds = 0
    """The pool of top-level sessions."""
    background: SlotIds | None = None
    """The pool of children; none: slot 1, or with ``total`` every slot but the main ones."""
    total: Annotated[int, Meta(ge=1)] | Literal["auto"] | None = None
    """How many slots the server has; ``"auto"`` reads ``total_slots`` from its ``/props``."""

    def pool(self, name: SlotPool) -> tuple[int, ...]:
        """The slot ids of pool ``name`` (an unset background is resolved as documented)."""
        main = _pool_ids(self.main)
        if name == "main":
            return main
        if self.background is not None:
            return _pool_ids(self.background)
        if isinstance(self.total, int):
            rest = tuple(s for s in range(self.total) if s not in main)
            return rest or main  # a server with only the main slots: children share them
        return (1,)

    def home_slot(self, name: SlotPool) -> int:
        """The slot a new session of pool ``name`` is created on: the pool's first."""
        return self.pool(name)[0]

    def resolved(self, total: int | None = None) -> SlotsConfig:
        """Explicit pools (``total`` from the server for ``"auto"``); raises ``ConfigError`` if
        a slot id is not below the server's slot count. A pool of one slot stays an int."""
        known = total if total is not None else self.total
        if known == "auto":
            raise ConfigError('slots.total is "auto": read total_slots from the server first')
        this = msgspec.structs.replace(self, total=known)
        pools = {name: this.pool(name) for name in ("main", "background")}
        if isinstance(known, int):
            for name, ids in pools.items():
                wrong = [s for s in ids if s >= known]
                if wrong:
                    raise ConfigError(
                        f"slots.{name} names slot {wrong[0]}, but the server has {known} slots "
                        f"(0 to {known - 1})"
                    )

        def compact(ids: tuple[int, ...]) -> int | tuple[int, ...]:
            return ids[0] if len(ids) == 1 else ids

        return SlotsConfig(
            main=compact(pools["main"]), background=compact(pools["background"]), total=known
        )


class LoopConfig(_Section, frozen=True):
    """``[loop]``: the bounds of one turn."""

    _key: ClassVar[str] = "loop"

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
    token_budget: Annotated[int, Meta(ge=1)] | None = None
    """Prompt plus completion tokens one top-level turn may spend, its children's included;
    once spent, no further model request of that family is sent (none: no limit)."""


DEFAULT_AGENT = "default"
"""The profile top-level sessions, and children called without ``agent``, run."""

RESERVED_BODY_KEYS = frozenset(
    {"model", "messages", "tools", "stream", "stream_options", "id_slot", "cache_prompt"}
)
"""Request fields loopd sets itself; ``extra_body`` may not name them."""


class AgentConfig(_Section, frozen=True):
    """``[agents.NAME]``: one agent profile. Every key is optional; an unset one takes what
    the rest of the config says (``loop.system_prompt``, ``model.name``, every tool)."""

    _key: ClassVar[str] = "agents.NAME"

    description: str = ""
    """One line about this agent, shown to a parent model in the ``subagent`` tool's schema."""
    system: str | None = None
    """The system prompt of this agent's sessions (default ``loop.system_prompt``)."""
    system_file: str | None = None
    """A file holding the system prompt, relative to ``home``; read when a baseline is built."""
    model: str | None = None
    """The ``model`` field of this agent's requests (default ``model.name``)."""
    base_url: str | None = None
    """Another endpoint for this agent's requests (default ``model.base_url``)."""
    api_key_env: str | None = None
    """The environment variable of this endpoint's bearer token (default ``model.api_key_env``
    when ``base_url`` is unset too, else none)."""
    backend: str | None = None
    """What this agent's server speaks (default ``model.backend``); see :class:`ModelConfig`."""
    stream: bool | None = None
    """Stream this agent's answers (default ``model.stream``)."""
    tools: tuple[str, ...] | None = None
    """The tools this agent may see and call, built-in and port alike (default: all)."""
    temperature: Annotated[float, Meta(ge=0)] | None = None
    """The request's ``temperature``."""
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    """The request's ``top_p``."""
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    """The request's ``max_tokens``: the most tokens one answer may have."""
    stop: tuple[str, ...] | None = None
    """The request's ``stop`` texts."""
    seed: int | None = None
    """The request's ``seed``."""
    extra_body: dict[str, Any] = field(default_factory=dict)
    """Fields merged into the request body (``top_k``, ``response_format``, ``grammar``...);
    the fields loopd sets itself (``model``, ``messages``, ``tools``...) are refused."""

    def check(self, name: str) -> None:
        """The rules between keys, checked by the :class:`Config` that holds this profile as
        ``name`` (so an error names the profile); ``ConfigError`` naming the key."""
        key = f"agents.{name}"
        try:
            check_session_id(name)
        except ValueError as exc:
            raise ConfigError(f"{key}: not a valid profile name: {exc}") from None
        if self.system is not None and self.system_file is not None:
            raise ConfigError(f"{key}: set system or system_file, not both")
        if self.system_file is not None:
            _check_path_text(self.system_file, f"{key}.system_file")
        if self.backend is not None:
            check_backend(self.backend, f"{key}.backend")
        if self.base_url is not None:
            check_base_url(self.base_url, f"{key}.base_url")
        if self.api_key_env is not None and not _ENV_NAME.fullmatch(self.api_key_env):
            raise ConfigError(
                f"{key}.api_key_env {self.api_key_env!r} is not an environment variable name "
                "(letters, digits and _, not starting with a digit)"
            )
        if "\n" in self.description or "\r" in self.description:
            raise ConfigError(f"{key}.description must be one line")
        reserved = sorted(RESERVED_BODY_KEYS & self.extra_body.keys())
        if reserved:
            raise ConfigError(f"{key}.extra_body may not set {', '.join(reserved)}: loopd sets it")
        if self.tools is not None and len(set(self.tools)) != len(self.tools):
            raise ConfigError(f"{key}.tools names a tool twice")


class CompactConfig(_Section, frozen=True):
    """``[compact]``: when a transcript is summarised, and how long the summary may be."""

    _key: ClassVar[str] = "compact"

    summary_chars: Annotated[int, Meta(ge=1)] = 2_000
    """Cap of a compaction summary and of a subagent's summary to its parent."""
    threshold_chars: Annotated[int, Meta(ge=1)] = 200_000
    """A transcript longer than this (in characters, after the baseline) is compacted."""
    threshold_ratio: Annotated[float, Meta(gt=0, le=1)] = 0.75
    """When the context size is known: compact before a request would fill more than this
    share of it (measured in the tokens the server reports)."""


class PortConfig(_Section, frozen=True):
    """``[port]``: the workers that run port tools."""

    _key: ClassVar[str] = "port"

    concurrency: Annotated[int, Meta(ge=1, le=256)] = 8
    """How many port tool calls may run at once (each on its own worker actor)."""
    timeout_s: Annotated[float, Meta(gt=0)] | None = None
    """Seconds one tool call may take; past it the call is answered with an error text and the
    tool is told to stop. None: no limit."""


class MemoryConfig(_Section, frozen=True):
    """``[memory]``: the file every new baseline reads, and who may write to it."""

    _key: ClassVar[str] = "memory"

    file: str = "MEMORY.md"
    """The memory file, relative to ``home`` (or absolute)."""
    allow_untrusted_writes: bool = False
    """Whether an untrusted session may use the ``remember`` tool."""
    max_chars: Annotated[int, Meta(ge=1)] = 64_000
    """Characters of the memory file a new baseline copies; the rest is left out, with a note."""
    max_entry_chars: Annotated[int, Meta(ge=1)] = 2_000
    """Characters one ``remember`` entry may have; a longer one is denied."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_path_text(self.file, "memory.file")


class RuntimeConfig(_Section, frozen=True):
    """``[runtime]``: the threads the session actors and the Context share."""

    threads: Annotated[int, Meta(ge=1, le=256)] | None = None
    """Threads of the dispatcher that runs every session actor and the Context (none: the CPU
    count, at most 4)."""


class SessionsConfig(_Section, frozen=True):
    """``[sessions]``: when an idle top-level session's actor is stopped (passivated)."""

    idle_s: Annotated[float, Meta(ge=0)] = 600.0
    """Seconds a top-level session may stay idle before its actor stops (0: never for idleness)."""
    max_live: Annotated[int, Meta(ge=0)] = 10_000
    """Live sessions past which the least recently used idle one is stopped (0: no limit)."""


class CronJob(_Section, frozen=True):
    """One ``[[cron]]`` entry: a turn on ``session`` with ``prompt`` at each ``schedule`` time."""

    _key: ClassVar[str] = "cron"

    session: str
    """The session the turn runs in."""
    schedule: str
    """A five-field cron expression, evaluated in UTC (``0 7 * * 1-5``)."""
    prompt: str
    """The turn's text, after the ``It is <now>.`` line."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_top_level(self.session, "cron.session")
        if len(self.schedule.split()) != 5 or not croniter.is_valid(self.schedule):
            raise ConfigError(f"cron.schedule: not a five-field cron expression: {self.schedule!r}")
        try:
            croniter(self.schedule, datetime(2000, 1, 1, tzinfo=UTC)).get_next(datetime)
        except (CroniterError, ValueError):
            raise ConfigError(
                f"cron.schedule {self.schedule!r} can never fire (no such date: 31 February, say)"
            ) from None


class HeartbeatConfig(_Section, frozen=True):
    """``[heartbeat]``: a turn on ``session`` every ``every_s`` seconds, prompted by ``file``."""

    _key: ClassVar[str] = "heartbeat"

    session: str
    """The session the turn runs in."""
    every_s: Annotated[float, Meta(gt=0)]
    """Seconds between two heartbeats."""
    file: str = "HEARTBEAT.md"
    """The prompt file, relative to ``home``; read afresh at each heartbeat."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_top_level(self.session, "heartbeat.session")
        _check_path_text(self.file, "heartbeat.file")


def _check_top_level(session: str, key: str) -> None:
    try:
        check_top_level_session(session)
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}") from None


class StoreConfig(_Section, frozen=True):
    """``[store]``: where sessions are stored; none: the SQLite file ``<home>/loopd.db``."""

    _key: ClassVar[str] = "store"

    url: str | None = None
    """A PostgreSQL url (``postgresql://user@host/db``) shared by every process; none: SQLite."""
    connect_timeout_s: Annotated[float, Meta(gt=0)] = 5.0
    """Seconds a (re)connect to PostgreSQL may take before the request fails ``store_error``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.url is not None and not self.url.startswith(("postgresql://", "postgres://")):
            shown = redact(self.url)[:40]
            raise ConfigError(f"store.url must start with postgresql:// (got {shown!r})")

    @property
    def locks_sessions(self) -> bool:
        """Whether the store holds a lock per session that the runtime must give back
        (``ReleaseSession``) when a session's actor stops: PostgreSQL's advisory locks. A
        SQLite store has none (the home lock covers every session)."""
        return self.url is not None


class ClusterConfig(_Section, frozen=True):
    """``[cluster]``: run sessions on shard actors of a Ray cluster (needs ``[store] url``)."""

    _key: ClassVar[str] = "cluster"

    engine: str = "none"
    """``"ray"``: host the runtime on Ray shard actors; ``"none"``: this process alone."""
    address: str = "local"
    """The Ray address to join (``ray://host:10001``, ``auto``), or ``"local"`` to start one."""
    shards: Annotated[int, Meta(ge=1, le=1024)] = 2
    """How many shard actors host sessions; a session family lives on one, by its top id."""
    max_restarts: Annotated[int, Meta(ge=-1)] = 16
    """How many times Ray restarts a shard whose process died (-1: without limit)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.engine not in ("none", "ray"):
            raise ConfigError(f"cluster.engine must be 'none' or 'ray', not {self.engine!r}")


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
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    sessions: SessionsConfig = field(default_factory=SessionsConfig)
    cron: tuple[CronJob, ...] = ()
    """``[[cron]]`` jobs."""
    heartbeat: HeartbeatConfig | None = None
    """``[heartbeat]``, if any."""
    store: StoreConfig = field(default_factory=StoreConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    agents: dict[str, AgentConfig] = field(default_factory=dict)
    """``[agents.NAME]`` profiles, by name."""
    mcp: dict[str, McpServerConfig] = field(default_factory=dict)
    """``[mcp.NAME]`` servers, by name (see :class:`~actors.core.mcp_config.McpServerConfig`)."""

    def __post_init__(self) -> None:
        # Accept a Path (or any os.PathLike) for convenience; keep a plain expanded string.
        home = self.home
        if not isinstance(home, str | os.PathLike):
            raise ConfigError(f"home must be a path, not {type(home).__name__}")
        home = os.fspath(home)
        if not isinstance(home, str):
            raise ConfigError(f"home must be a text path, not {type(home).__name__}")
        _check_path_text(home, "home")  # '' would silently mean the current folder
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
