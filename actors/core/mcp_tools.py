"""The MCP tools a runtime knows now: what the registry lists to new sessions and dispatches.

:class:`McpCatalog` is written by one owner, the MCP service, each time a server lists its
tools, and read by the Context (a new session's baseline) and the sessions (dispatch). It holds
one immutable snapshot, swapped whole, so a reader never sees half an update and needs no lock.
A server that goes down keeps its last list: its calls are answered at once that it is not
running, and the sessions created meanwhile still list its tools for when it is back. A server
that is not running also has its answer here (:meth:`McpCatalog.not_running`), so a call of one
of its tools that was never listed (it was down when the session was created) is told why,
not that there is no such tool.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from actors.core.mcp_config import MCP_SEPARATOR
from messages import DenyReason, ToolSpec, denial_message

__all__ = [
    "TOOL_NAME",
    "McpCatalog",
    "McpTool",
    "joined_name",
    "mcp_server_of",
    "untrusted_denial",
]

TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What a joined name ``<server>__<tool>`` must be to be listed to a model."""


def joined_name(server: str, tool: str) -> str | None:
    """``<server>__<tool>``, or None when that is not a name a model may be offered."""
    name = f"{server}{MCP_SEPARATOR}{tool}"
    return name if TOOL_NAME.fullmatch(name) else None


def mcp_server_of(name: str, servers: Iterable[str]) -> str | None:
    """The server of ``servers`` whose tools ``name`` (or ``<server>__*``) belongs to."""
    server, separator, _ = name.partition(MCP_SEPARATOR)
    return server if separator and server in servers else None


@dataclass(frozen=True)
class McpTool:
    """One tool of one server: its spec as the model sees it (the joined name, the server's
    description and input schema) and the check of a call's arguments (the raw JSON text in,
    the detail of an ``INVALID_ARGUMENTS`` denial out, None when they are valid)."""

    server: str
    tool: str
    spec: ToolSpec
    check: Callable[[str], str | None]
    deny_untrusted: bool = False
    """``[mcp.NAME] deny_untrusted`` names it: an untrusted session's call is denied."""


def untrusted_denial(tool: McpTool | None) -> str | None:
    """The denial of an untrusted session's call of ``tool``, or None if the call may run."""
    if tool is None or not tool.deny_untrusted:
        return None
    detail = f"mcp.{tool.server}.deny_untrusted names {tool.tool}"
    return denial_message(DenyReason.UNTRUSTED, detail)


_EMPTY: Mapping[str, McpTool] = MappingProxyType({})


class McpCatalog:
    """The configured servers (fixed) and the tools they list now (swapped whole)."""

    def __init__(self, servers: Iterable[str]) -> None:
        self.servers = frozenset(servers)
        self._by_server: Mapping[str, tuple[McpTool, ...]] = MappingProxyType({})
        self._state: tuple[int, Mapping[str, McpTool]] = (0, _EMPTY)
        self._down: Mapping[str, str] = MappingProxyType({})

    @property
    def generation(self) -> int:
        """Counts the lists published; a baseline built at another generation may differ."""
        return self._state[0]

    def tools(self) -> Mapping[str, McpTool]:
        """Every tool listed now, by joined name."""
        return self._state[1]

    def get(self, name: str) -> McpTool | None:
        """The tool of joined name ``name``, if a server lists it now."""
        return self._state[1].get(name)

    def server_of(self, name: str) -> str | None:
        """The configured server ``name`` belongs to by its prefix (listed now or not)."""
        return mcp_server_of(name, self.servers)

    def set_down(self, server: str, answer: str | None) -> None:
        """``server`` is not running, and a call of its tools is answered ``answer`` (None: it
        is up again)."""
        down = dict(self._down)
        if answer is None:
            down.pop(server, None)
        else:
            down[server] = answer
        self._down = MappingProxyType(down)

    def not_running(self, name: str) -> str | None:
        """The answer to a call of ``name`` whose configured server is not running (it was
        down or still starting when asked), or None: its server is up, or none is configured."""
        server = self.server_of(name)
        return None if server is None else self._down.get(server)

    def publish(self, server: str, tools: Iterable[McpTool]) -> bool:
        """``server`` lists ``tools`` now (replacing its earlier list); False if nothing
        changed (the same specs), when readers keep the generation they built on."""
        listed = tuple(tools)
        before = self._by_server.get(server, ())
        if [t.spec for t in before] == [t.spec for t in listed]:
            return False
        by_server = {**self._by_server, server: listed}
        merged = {tool.spec.name: tool for group in by_server.values() for tool in group}
        self._by_server = MappingProxyType(by_server)
        self._state = (self._state[0] + 1, MappingProxyType(merged))
        return True
