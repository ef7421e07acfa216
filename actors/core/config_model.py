"""The ``[model]`` endpoint, its llama.cpp ``[slots]``, and the ``[agents.NAME]`` profiles."""

from __future__ import annotations

import contextlib
import os
import re
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta, field

from actors.core.config_base import (
    ENV_NAME,
    ConfigError,
    Section,
    check_backend,
    check_base_url,
    check_path_text,
)
from actors.core.config_tables import check_tool_patterns
from actors.core.output import SchemaError, final_answer_spec, schema_of
from messages import SlotPool, check_session_id

HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
"""An HTTP header name (RFC 9110's token)."""

__all__ = [
    "DEFAULT_AGENT",
    "HEADER_NAME",
    "RESERVED_BODY_KEYS",
    "AgentConfig",
    "ModelConfig",
    "SlotsConfig",
]


class ModelConfig(Section, frozen=True):
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
        if self.api_key_env is not None and not ENV_NAME.fullmatch(self.api_key_env):
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


class SlotsConfig(Section, frozen=True):
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
        if name == "main":  # asked on every turn: no copy of a large pool for its first id
            return self.main if isinstance(self.main, int) else self.main[0]
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


DEFAULT_AGENT = "default"
"""The profile top-level sessions, and children called without ``agent``, run."""

RESERVED_BODY_KEYS = frozenset(
    {"model", "messages", "tools", "stream", "stream_options", "id_slot", "cache_prompt"}
)
"""Request fields loopd sets itself; ``extra_body`` may not name them."""


class AgentConfig(Section, frozen=True):
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
    output_schema: dict[str, Any] | None = None
    """A JSON schema: this agent's sessions end each turn by calling ``final_answer`` with a
    value it validates (a typed result)."""
    output_schema_file: str | None = None
    """A JSON file holding ``output_schema``, relative to ``home``; read when the runtime
    starts."""
    output: Any = None
    """Python only: a type (a msgspec Struct) whose ``msgspec.json.schema`` is the output
    schema; answers are validated and decoded by msgspec."""
    approve: tuple[str, ...] = ()
    """More tool names whose calls wait for a person in this profile's sessions (added to
    ``approvals.tools``)."""
    a2a_url: str | None = None
    """A remote A2A agent's base URL: this profile's children are proxies of one remote task
    each (its card at ``<a2a_url>/.well-known/agent-card.json``); nothing runs locally."""
    headers_env: dict[str, str] = field(default_factory=dict)
    """With ``a2a_url``: header name -> the environment variable holding its value, sent with
    every request to the remote agent."""
    trusted: bool = False
    """With ``a2a_url``: False marks the parent untrusted with every remote result."""

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
            check_path_text(self.system_file, f"{key}.system_file")
        if self.backend is not None:
            check_backend(self.backend, f"{key}.backend")
        if self.base_url is not None:
            check_base_url(self.base_url, f"{key}.base_url")
        if self.api_key_env is not None and not ENV_NAME.fullmatch(self.api_key_env):
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
        check_tool_patterns(self.approve, f"{key}.approve")
        self._check_output(key)
        self._check_remote(key)

    def _check_remote(self, key: str) -> None:
        """``a2a_url`` an http(s) URL; ``headers_env`` and ``trusted`` only with it, each header
        a header name and each variable a variable name (as ``[mcp.NAME] headers_env``)."""
        if self.a2a_url is None:
            for name in ("headers_env", "trusted"):
                if getattr(self, name):
                    raise ConfigError(f"{key}.{name} is for a remote agent: set a2a_url too")
            return
        check_base_url(self.a2a_url, f"{key}.a2a_url")
        typed = [n for n in ("output", "output_schema", "output_schema_file") if getattr(self, n)]
        if typed:
            raise ConfigError(f"{key}.{typed[0]}: a remote agent (a2a_url) answers text")
        for header, variable in self.headers_env.items():
            if not HEADER_NAME.fullmatch(header):
                raise ConfigError(f"{key}.headers_env: {header!r} is not an HTTP header name")
            if not ENV_NAME.fullmatch(variable):
                raise ConfigError(
                    f"{key}.headers_env.{header}: {variable!r} is not an environment variable name"
                )

    def _check_output(self, key: str) -> None:
        """At most one of ``output``, ``output_schema`` and ``output_schema_file``; a schema
        loopd can use (the file is read when the runtime starts)."""
        given = [
            name
            for name in ("output", "output_schema", "output_schema_file")
            if getattr(self, name) is not None
        ]
        if len(given) > 1:
            raise ConfigError(f"{key}: set one of {', '.join(given)}, not several")
        if self.output_schema_file is not None:
            check_path_text(self.output_schema_file, f"{key}.output_schema_file")
        try:
            if self.output_schema is not None:
                final_answer_spec(self.output_schema)
            if self.output is not None:
                if not isinstance(self.output, type) and not hasattr(self.output, "__origin__"):
                    raise SchemaError(
                        "it is a Python type (a msgspec Struct); in TOML use output_schema "
                        "or output_schema_file"
                    )
                final_answer_spec(schema_of(self.output))
        except SchemaError as exc:
            field_name = "output_schema" if self.output_schema is not None else "output"
            raise ConfigError(f"{key}.{field_name}: {exc}") from None
