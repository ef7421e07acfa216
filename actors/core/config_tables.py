"""The tables of the runtime's own bounds: ``[loop]``, ``[subagents]``, ``[compact]``,
``[port]``, ``[memory]``, ``[runtime]``, ``[sessions]``, ``[store]`` and ``[cluster]``."""

from __future__ import annotations

from typing import Annotated, ClassVar

from msgspec import Meta

from actors.core.config_base import ENV_NAME, ConfigError, Section, check_path_text
from actors.core.listen import parse_listen
from actors.core.output import FINAL_ANSWER
from actors.core.text import redact

__all__ = [
    "DEFAULT_APPROVAL_TIMEOUT_S",
    "DEFAULT_SYSTEM_PROMPT",
    "A2aConfig",
    "ApprovalsConfig",
    "ClusterConfig",
    "CompactConfig",
    "LoopConfig",
    "MemoryConfig",
    "PortConfig",
    "RuntimeConfig",
    "ServeConfig",
    "SessionsConfig",
    "StoreConfig",
    "SubagentsConfig",
    "check_tool_patterns",
]

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful assistant working inside loopd. Use the tools when they help. "
    "The subagent tool runs a task in a fresh child session and returns its summary."
)


class LoopConfig(Section, frozen=True):
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
    output_retries: Annotated[int, Meta(ge=0)] = 2
    """Tries a typed session's model gets after its first to call ``final_answer`` with a
    valid answer; when the last fails, the turn fails ``output_invalid``."""
    token_budget: Annotated[int, Meta(ge=1)] | None = None
    """Prompt plus completion tokens one top-level turn may spend, its children's included;
    once spent, no further model request of that family is sent (none: no limit)."""


class SubagentsConfig(Section, frozen=True):
    """``[subagents]``: children that run in the background while their parent goes on."""

    _key: ClassVar[str] = "subagents"

    background: bool = False
    """Offer ``background`` in the ``subagent`` tool: such a call resolves at once and the
    child's outcome reaches the parent later, as a user message named ``subagent``."""
    max_background: Annotated[int, Meta(ge=1)] = 8
    """Background children one top-level session's family may have running at once; one more
    is denied."""


DEFAULT_APPROVAL_TIMEOUT_S = 7 * 24 * 3600.0
"""``approvals.timeout_s`` when unset: seven days."""


def check_tool_patterns(names: tuple[str, ...], key: str) -> None:
    """``ConfigError`` naming ``key`` and the pattern for a name of ``names`` that cannot mean
    what it seems to: an empty one, a ``*`` anywhere but at the end (``**``, ``a*b``, ``*x``:
    a pattern is a name, or a prefix followed by one ``*``), or ``final_answer`` (a typed
    session's answer, not a call a person decides)."""
    for name in names:
        if not name:
            raise ConfigError(f"{key}: an empty tool name")
        if "*" in name[:-1]:
            raise ConfigError(
                f"{key}: {name[:80]!r} is not a tool name or pattern: a '*' may only end a "
                "name, once, as a prefix ('github__*': every tool whose name begins "
                "'github__'; '*' alone: every tool)"
            )
        if name == FINAL_ANSWER:
            raise ConfigError(
                f"{key}: {FINAL_ANSWER!r} never waits for a person (it is a typed session's "
                "answer, checked against its schema, not a call a person decides)"
            )


class ApprovalsConfig(Section, frozen=True):
    """``[approvals]``: the tool calls that wait for a person's yes or no."""

    _key: ClassVar[str] = "approvals"

    tools: tuple[str, ...] = ()
    """Tool names whose calls wait for a person (built-in, port, ``subagent``, MCP); a name
    ending in ``*`` is a prefix (``github__*``: every tool of that MCP server; ``*``: every
    tool). See :func:`check_tool_patterns` for what is refused."""
    timeout_s: Annotated[float, Meta(gt=0)] = DEFAULT_APPROVAL_TIMEOUT_S
    """Seconds a call may wait; past them it is declined (``no decision within ... s``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_tool_patterns(self.tools, "approvals.tools")


class CompactConfig(Section, frozen=True):
    """``[compact]``: when a transcript is summarised, and how long the summary may be."""

    _key: ClassVar[str] = "compact"

    summary_chars: Annotated[int, Meta(ge=1)] = 2_000
    """Cap of a compaction summary and of a subagent's summary to its parent."""
    threshold_chars: Annotated[int, Meta(ge=1)] = 200_000
    """A transcript longer than this (in characters, after the baseline) is compacted."""
    threshold_ratio: Annotated[float, Meta(gt=0, le=1)] = 0.75
    """When the context size is known: compact before a request would fill more than this
    share of it (measured in the tokens the server reports)."""


class PortConfig(Section, frozen=True):
    """``[port]``: the workers that run port tools."""

    _key: ClassVar[str] = "port"

    concurrency: Annotated[int, Meta(ge=1, le=256)] = 8
    """How many port tool calls may run at once (each on its own worker actor)."""
    timeout_s: Annotated[float, Meta(gt=0)] | None = None
    """Seconds one tool call may take; past it the call is answered with an error text and the
    tool is told to stop. None: no limit."""


class MemoryConfig(Section, frozen=True):
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
        check_path_text(self.file, "memory.file")


class RuntimeConfig(Section, frozen=True):
    """``[runtime]``: the threads the session actors and the Context share."""

    threads: Annotated[int, Meta(ge=1, le=256)] | None = None
    """Threads of the dispatcher that runs every session actor and the Context (none: the CPU
    count, at most 4)."""


class SessionsConfig(Section, frozen=True):
    """``[sessions]``: when an idle top-level session's actor is stopped (passivated)."""

    idle_s: Annotated[float, Meta(ge=0)] = 600.0
    """Seconds a top-level session may stay idle before its actor stops (0: never for idleness)."""
    max_live: Annotated[int, Meta(ge=0)] = 10_000
    """Live sessions past which the least recently used idle one is stopped (0: no limit)."""


class StoreConfig(Section, frozen=True):
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


class ClusterConfig(Section, frozen=True):
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


class ServeConfig(Section, frozen=True):
    """``[serve]``: the HTTP service of ``loopd serve --listen`` (see docs/guide.md)."""

    _key: ClassVar[str] = "serve"

    listen: str | None = None
    """``HOST:PORT`` to serve on (``--listen`` wins); none: no HTTP service."""
    token_env: str | None = None
    """The environment variable holding the bearer token every request must send."""
    replay_events: Annotated[int, Meta(ge=0, le=1_000_000)] = 1000
    """How many recent events a reconnecting ``/v1/events`` client can replay."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.listen is not None:
            try:
                parse_listen(self.listen)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        if self.token_env is not None and ENV_NAME.fullmatch(self.token_env) is None:
            raise ConfigError(f"serve.token_env is not a variable name: {self.token_env!r}")


class A2aConfig(Section, frozen=True):
    """``[a2a]``: the A2A endpoint of ``loopd serve --listen`` (see docs/guide.md)."""

    _key: ClassVar[str] = "a2a"

    serve: bool = False
    """Mount an A2A endpoint under ``/a2a/`` on the service (needs ``pip install '.[a2a]'``)."""
    name: str = "loopd"
    """The agent card's ``name``."""
    description: str | None = None
    """The agent card's ``description`` (none: the first line of ``loop.system_prompt``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.name.strip():
            raise ConfigError("a2a.name is empty: the agent card needs a name")
