"""Tool dispatch: which route a tool call takes, decided by plain functions (SPEC 4 and 5).

Nothing here does I/O or touches an actor. ``dispatch`` turns a call into one of three routes:
answered here (:class:`Answered`), a child session (:class:`SpawnChild`), or the port
(:class:`ToPort`). The session actor carries the route out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec

from actors.core.bounded import OutOfBounds, decode_json
from actors.core.mcp_config import MCP_SEPARATOR
from actors.core.mcp_tools import McpCatalog, McpTool
from messages import DenyReason, ToolSpec, check_session_id, denial_message

__all__ = [
    "CALL_TOOL",
    "CLOCK",
    "DEFAULT_AGENT",
    "REMEMBER",
    "RUNBOOK_SUBAGENT_ID",
    "SUBAGENT",
    "Answered",
    "ArgumentError",
    "Registry",
    "Remember",
    "Route",
    "SpawnChild",
    "ToPort",
    "child_id",
    "clock_text",
    "depth_of",
    "descends_from",
    "dispatch",
    "parse_json_object",
    "parse_subagent_arguments",
    "parse_subagent_call",
    "subagent_spec",
    "unwrap_call_tool",
]

DEFAULT_AGENT = "default"
CLOCK = "clock"
SUBAGENT = "subagent"
CALL_TOOL = "call_tool"
REMEMBER = "remember"
RUNBOOK_SUBAGENT_ID = "see docs/runbook.md#subagent-id"

_NOT_AN_OBJECT = "arguments must be a JSON object"

CLOCK_SPEC = ToolSpec(
    name=CLOCK,
    description="The current time, RFC 3339 in UTC to the second (2026-11-29T23:59:01Z).",
    parameters={"type": "object", "properties": {}, "additionalProperties": False},
)
SUBAGENT_SPEC = ToolSpec(
    name=SUBAGENT,
    description=(
        "Run a task in a fresh child session that sees none of this conversation. "
        "Returns '<child> completed' and the child's answer, or '<child> failed'."
    ),
    parameters={
        "type": "object",
        "properties": {
            "task": {"type": "string", "description": "Everything the child needs to know."}
        },
        "required": ["task"],
        "additionalProperties": False,
    },
)
CALL_TOOL_SPEC = ToolSpec(
    name=CALL_TOOL,
    description="Call the tool `name` with `arguments`, exactly as if it were called directly.",
    parameters={
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "The tool to call."},
            "arguments": {"type": "object", "description": "That tool's arguments."},
        },
        "required": ["name"],
        "additionalProperties": False,
    },
)


REMEMBER_SPEC = ToolSpec(
    name=REMEMBER,
    description=(
        "Append one line to long-term memory. New sessions see it; this one does not change."
    ),
    parameters={
        "type": "object",
        "properties": {"text": {"type": "string", "description": "The line to remember."}},
        "required": ["text"],
        "additionalProperties": False,
    },
)


class ArgumentError(ValueError):
    """A tool's arguments are not valid; ``detail`` is the text that goes into the denial."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Answered:
    """The call is answered on the spot with ``text``; ``denied`` if it was refused."""

    text: str
    denied: bool = False


@dataclass(frozen=True, slots=True)
class SpawnChild:
    """The call runs ``task`` in a child session of profile ``agent``."""

    task: str
    agent: str = DEFAULT_AGENT
    background: bool = False
    """The call resolves at once; the child's outcome is reported later (``[subagents]``)."""


@dataclass(frozen=True, slots=True)
class ToPort:
    """The call goes to the port tool ``name`` with ``arguments`` (raw JSON text)."""

    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Remember:
    """The call appends ``text`` to memory (if the session may write there)."""

    text: str


Route = Answered | SpawnChild | ToPort | Remember
"""Where one tool call goes."""


BACKGROUND_PROPERTY = {
    "type": "boolean",
    "description": (
        "true: return at once and let the child work in the background; its outcome arrives "
        "later as a message named subagent (default: false, wait for the child)."
    ),
}
"""The ``background`` argument of ``subagent``, offered with ``[subagents] background``."""


def subagent_spec(agents: Mapping[str, str], background: bool = False) -> ToolSpec:
    """The ``subagent`` tool as the model sees it. With no ``agents`` (no profile but
    ``default``) and no ``background`` it is SPEC's: ``task`` alone. Otherwise ``agent`` is
    offered too: an ``enum`` of the profile names, described one per line; with
    ``background`` (``[subagents] background``), the boolean ``background``."""
    if background:
        spec = subagent_spec(agents)
        parameters = dict(spec.parameters)
        parameters["properties"] = {
            **spec.parameters["properties"],
            "background": BACKGROUND_PROPERTY,
        }
        return ToolSpec(SUBAGENT, spec.description, parameters)
    if not agents:
        return SUBAGENT_SPEC
    lines = [f"- {name}: {text}" if text else f"- {name}" for name, text in agents.items()]
    agent = {
        "type": "string",
        "enum": list(agents),
        "description": (
            f"The agent that runs the task (default: {DEFAULT_AGENT}):\n" + "\n".join(lines)
        ),
    }
    parameters = dict(SUBAGENT_SPEC.parameters)
    parameters["properties"] = {**SUBAGENT_SPEC.parameters["properties"], "agent": agent}
    return ToolSpec(SUBAGENT, SUBAGENT_SPEC.description, parameters)


class Registry:
    """The tools a session's model is offered: loopd's own, then the port's, then the MCP
    servers' (``<server>__<tool>``, as ``mcp`` lists them now), by name.

    :meth:`for_agent` gives the view one agent profile has: only the tools it ``allowed``
    (a tool it may not use is neither listed nor run; ``files__*`` allows every tool of the
    server ``files``), and the profiles a ``subagent`` call may name.
    """

    BUILTIN = (CLOCK_SPEC, SUBAGENT_SPEC, CALL_TOOL_SPEC, REMEMBER_SPEC)

    def __init__(self, port_tools: Iterable[ToolSpec] = (), mcp: McpCatalog | None = None) -> None:
        builtin = {spec.name for spec in self.BUILTIN}
        self._mcp = mcp if mcp is not None else McpCatalog(())
        port: dict[str, ToolSpec] = {}
        for spec in port_tools:
            if spec.name in builtin or spec.name in port:
                raise ValueError(f"tool name {spec.name!r} is registered twice")
            if self._mcp.server_of(spec.name) is not None:
                raise ValueError(f"tool name {spec.name!r} is an MCP server's (see [mcp])")
            port[spec.name] = spec
        self._port = port
        self._allowed: frozenset[str] | None = None
        self._prefixes: tuple[str, ...] = ()  # from allowed names "<server>__*"
        self._agents: dict[str, str] = {}
        self._background = False

    def for_agent(
        self,
        allowed: Iterable[str] | None,
        agents: Mapping[str, str] | None = None,
        *,
        background: bool = False,
    ) -> Registry:
        """This registry as one profile sees it: only the tools in ``allowed`` (None: all),
        and ``agents`` (name: description) as what ``subagent``'s ``agent`` may name (none:
        the argument is not offered); ``background`` offers ``subagent``'s ``background``.
        ``ValueError`` for a name that is no tool here."""
        view = Registry.__new__(Registry)
        view._port = self._port
        view._mcp = self._mcp
        view._allowed = None if allowed is None else frozenset(allowed)
        view._prefixes = tuple(
            sorted(n[:-1] for n in view._allowed or () if n.endswith(MCP_SEPARATOR + "*"))
        )
        view._agents = dict(agents or {})
        view._background = background
        # An MCP name is taken at its word: its server may list the tool later.
        unknown = sorted(
            name
            for name in (view._allowed or frozenset()) - set(self.names())
            if self._mcp.server_of(name) is None
        )
        if unknown:
            raise ValueError(f"no such tool: {', '.join(unknown)}")
        return view

    def names(self) -> tuple[str, ...]:
        """Every tool name registered, whether this view allows it or not."""
        return tuple(spec.name for spec in self.BUILTIN) + tuple(sorted(self._port))

    @property
    def agents(self) -> Mapping[str, str]:
        """The profiles a ``subagent`` call may name, with their descriptions (maybe none)."""
        return self._agents

    @property
    def background(self) -> bool:
        """Whether ``subagent`` takes ``background`` (``[subagents] background``)."""
        return self._background

    def allows(self, name: str) -> bool:
        """True if this view may list and run ``name`` (a registered tool or not)."""
        if self._allowed is None or name in self._allowed:
            return True
        return any(name.startswith(prefix) for prefix in self._prefixes)

    _specs: tuple[int, tuple[ToolSpec, ...]] | None = None

    def specs(self) -> tuple[ToolSpec, ...]:
        """Every allowed tool, in a stable order, as it goes into a baseline (built once per
        generation of the MCP tools: the rest of a registry and its views never changes)."""
        generation = self._mcp.generation
        if self._specs is not None and self._specs[0] == generation:
            return self._specs[1]
        builtin = tuple(
            subagent_spec(self._agents, self._background) if spec.name == SUBAGENT else spec
            for spec in self.BUILTIN
        )
        every = builtin + tuple(self._port[name] for name in sorted(self._port))
        mcp = self._mcp.tools()
        every += tuple(mcp[name].spec for name in sorted(mcp))
        specs = tuple(spec for spec in every if self.allows(spec.name))
        self._specs = (generation, specs)
        return specs

    @property
    def generation(self) -> int:
        """Changes when the MCP tools listed to new sessions change (see :meth:`specs`)."""
        return self._mcp.generation

    def is_port(self, name: str) -> bool:
        """True if ``name`` is a port tool, or an MCP tool listed now (both run elsewhere)."""
        return name in self._port or self._mcp.get(name) is not None

    def is_mcp(self, name: str) -> bool:
        """True if ``name`` belongs to a configured MCP server (listed now or not): its calls
        go to the MCP service, not the port."""
        return bool(self._mcp.servers) and self._mcp.server_of(name) is not None

    @property
    def mcp_catalog(self) -> McpCatalog:
        """The MCP tools this registry lists (shared by all its views)."""
        return self._mcp

    @property
    def has_mcp(self) -> bool:
        """True if any MCP server is configured."""
        return bool(self._mcp.servers)

    def mcp_tool(self, name: str) -> McpTool | None:
        """The MCP tool ``name``, if a server lists it now."""
        return self._mcp.get(name)


def _refusal(exc: OutOfBounds) -> str:
    """The denial detail of arguments the bounded decode refused: a bound broken, or text that
    is not valid Unicode (a lone surrogate: arguments are text, never bytes), is named; text
    that is simply not JSON is "not a JSON object"."""
    detail = exc.detail
    named = "surrogate" in detail
    return _NOT_AN_OBJECT if detail.startswith("not valid JSON: ") and not named else detail


def parse_json_object(arguments: str) -> dict[str, Any]:
    """Parse a tool's raw arguments through the bounded decode; anything but a JSON object is
    an :class:`ArgumentError`: ``arguments must be a JSON object``, or, for a value refused by
    a bound (nesting, size, an integer outside int64, a number not finite, a lone surrogate),
    the bound named (``JSON nested deeper than 64 levels``)."""
    try:
        value = decode_json(arguments)
    except OutOfBounds as exc:
        raise ArgumentError(_refusal(exc)) from None
    if not isinstance(value, dict):
        raise ArgumentError(_NOT_AN_OBJECT)
    return value


def _one_string(arguments: str, name: str) -> str:
    """The one string field ``name`` of a tool's arguments, checked in the order SPEC 5 gives:
    an object, no other key (the first in order is named), present, a string."""
    value = parse_json_object(arguments)
    for key in value:
        if key != name:
            raise ArgumentError(f"unknown field: {key}")
    if name not in value:
        raise ArgumentError(f"{name} is required")
    text = value[name]
    if not isinstance(text, str):
        raise ArgumentError(f"{name} must be a string")
    return text


def parse_subagent_arguments(
    arguments: str, agents: Mapping[str, str] | None = None
) -> tuple[str, str]:
    """The ``(task, agent)`` of a ``subagent`` call, checked in the order SPEC 5 gives.

    With no ``agents`` an ``agent`` key is an unknown field, as SPEC 5 says. With some, it is
    checked after ``task``: a string (``agent must be a string``), one of them (``unknown
    agent: <name>``). A call without it runs ``default``.
    """
    if not agents:
        return _one_string(arguments, "task"), DEFAULT_AGENT
    value = parse_json_object(arguments)
    for key in value:
        if key not in ("task", "agent"):
            raise ArgumentError(f"unknown field: {key}")
    if "task" not in value:
        raise ArgumentError("task is required")
    task = value["task"]
    if not isinstance(task, str):
        raise ArgumentError("task must be a string")
    agent = value.get("agent", DEFAULT_AGENT)
    if not isinstance(agent, str):
        raise ArgumentError("agent must be a string")
    if agent not in agents:
        raise ArgumentError(f"unknown agent: {agent}")
    return task, agent


def parse_subagent_call(
    arguments: str, agents: Mapping[str, str] | None = None, *, background: bool = False
) -> SpawnChild:
    """A ``subagent`` call's route, its arguments checked in the order SPEC 5 gives.

    Without ``background`` it is :func:`parse_subagent_arguments`'s. With it, the key
    ``background`` is known too and checked after ``task``: ``background must be a boolean``.
    """
    if not background:
        return SpawnChild(*parse_subagent_arguments(arguments, agents))
    value = parse_json_object(arguments)
    known = ("task", "background", "agent") if agents else ("task", "background")
    for key in value:
        if key not in known:
            raise ArgumentError(f"unknown field: {key}")
    if "task" not in value:
        raise ArgumentError("task is required")
    task = value["task"]
    if not isinstance(task, str):
        raise ArgumentError("task must be a string")
    in_background = value.get("background", False)
    if not isinstance(in_background, bool):
        raise ArgumentError("background must be a boolean")
    if not agents:
        return SpawnChild(task, DEFAULT_AGENT, in_background)
    without = {k: v for k, v in value.items() if k != "background"}
    _task, agent = parse_subagent_arguments(msgspec.json.encode(without).decode(), agents)
    return SpawnChild(task, agent, in_background)


def unwrap_call_tool(arguments: str) -> tuple[str, str]:
    """The inner ``(name, arguments)`` of a ``call_tool`` call.

    The inner arguments come back as JSON text, as a direct call would carry them. A model that
    sends them already encoded as a string is taken at its word; absent arguments are ``{}``.
    """
    value = parse_json_object(arguments)
    for key in value:
        if key not in ("name", "arguments"):
            raise ArgumentError(f"unknown field: {key}")
    if "name" not in value:
        raise ArgumentError("name is required")
    name = value["name"]
    if not isinstance(name, str):
        raise ArgumentError("name must be a string")
    if name == CALL_TOOL:
        raise ArgumentError("call_tool cannot call call_tool")
    inner = value.get("arguments", {})
    text = inner if isinstance(inner, str) else msgspec.json.encode(inner).decode()
    return name, text


_last_clock_text: tuple[float, str] = (float("nan"), "")


def clock_text(now: datetime) -> str:
    """``now`` as the clock tool gives it: RFC 3339, UTC, whole seconds, ``Z``."""
    # Every child's first message and every clock call say the time: the text of the last
    # second is kept (one tuple, swapped whole, so threads may share it).
    global _last_clock_text
    second = now.timestamp() // 1
    last = _last_clock_text
    if last[0] == second:
        return last[1]
    text = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    _last_clock_text = (second, text)
    return text


def _check_clock_arguments(arguments: str) -> None:
    if arguments.strip():
        for key in parse_json_object(arguments):
            raise ArgumentError(f"unknown field: {key}")


def dispatch(registry: Registry, name: str, arguments: str, now: datetime) -> Route:
    """Decide the route of one tool call (SPEC 4); ``call_tool`` unwraps to the same rules.

    A tool the registry's profile may not use is an ``UNKNOWN_TOOL`` denial, as if it were not
    registered (``call_tool`` included, and the tool it unwraps to).
    """
    try:
        if name == CALL_TOOL and registry.allows(CALL_TOOL):
            name, arguments = unwrap_call_tool(arguments)
        if not registry.allows(name):
            return Answered(denial_message(DenyReason.UNKNOWN_TOOL, name), denied=True)
        if name == CLOCK:
            _check_clock_arguments(arguments)
            return Answered(clock_text(now))
        if name == SUBAGENT:
            return parse_subagent_call(arguments, registry.agents, background=registry.background)
        if name == REMEMBER:
            return Remember(_one_string(arguments, "text"))
    except ArgumentError as exc:
        return Answered(denial_message(DenyReason.INVALID_ARGUMENTS, exc.detail), denied=True)
    mcp = registry.mcp_tool(name)
    if mcp is not None:  # checked against its input schema before it is sent
        problem = mcp.check(arguments)
        if problem is not None:
            return Answered(denial_message(DenyReason.INVALID_ARGUMENTS, problem), denied=True)
    if registry.is_port(name):
        return ToPort(name, arguments)
    down = registry.mcp_catalog.not_running(name)  # never listed: its server is not running
    if down is not None:
        return Answered(down)
    return Answered(denial_message(DenyReason.UNKNOWN_TOOL, name), denied=True)


def child_id(parent: str, call_id: int) -> str:
    """The child session id ``sub-<parent>-<call_id>``.

    Raises :class:`ArgumentError` with the operator-facing detail when that text is not a valid
    session id (too long, in practice); nothing is held or requested then.
    """
    raw = f"sub-{parent}-{call_id}"
    try:
        return check_session_id(raw)
    except ValueError:
        raise ArgumentError(
            f"child session id `{raw}` would not fit; {RUNBOOK_SUBAGENT_ID}"
        ) from None


def depth_of(session: str) -> int:
    """How many ``sub-`` levels down ``session`` sits: ``sub-sub-x-1-2`` is 2, ``x`` is 0."""
    n = 0
    while session.startswith("sub-"):
        session, n = session[4:], n + 1
    return n


def descends_from(candidate: str, session: str) -> bool:
    """True if ``candidate`` is a child, grandchild, ... of ``session`` by the id rule.

    A descendant k levels down is ``sub-`` k times, then ``session``, then k call numbers:
    ``sub-sub-s-1-2`` descends from ``s``; ``sub-s-2-1`` (child 1 of ``s-2``) does not.
    """
    levels = depth_of(candidate) - depth_of(session)
    if levels < 1:
        return False
    rest = candidate[4 * levels :]
    if not rest.startswith(session + "-"):
        return False
    numbers = rest[len(session) + 1 :].split("-")
    return len(numbers) == levels and all(n.isdigit() and n.isascii() for n in numbers)


def is_json_object(text: str) -> bool:
    """True if ``text`` passes the bounded decode as a JSON object: what a server accepts as
    tool-call arguments, and what may be stored and sent back as written."""
    try:
        return isinstance(decode_json(text), dict)
    except OutOfBounds:
        return False
