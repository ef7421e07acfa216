"""``[mcp.NAME]``: one MCP server whose tools loopd lists to its models.

A server is started over stdio (``command``) or reached over streamable HTTP (``url``). The
struct checks itself the way every config table does: unknown keys and wrong types are refused
naming the key (``mcp.files.timeout_s: ...``), in TOML and in Python alike. The rules that need
the rest of the config (an ``env`` key that names loopd's own API key variable) are checked by
the :class:`~actors.core.config.Config` that holds it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

import msgspec

__all__ = [
    "MAX_MESSAGE_BYTES",
    "MAX_SCHEMA_BYTES",
    "MAX_TOOLS",
    "MCP_SEPARATOR",
    "McpServerConfig",
    "check_server_name",
]

MCP_SEPARATOR = "__"
"""Between a server's name and its tool's: ``files__read``."""

_SERVER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_MAX_TIMEOUT_S = 365 * 24 * 3600

MAX_TOOLS = 1000
"""The default ``max_tools``: the most tools of one server loopd lists."""
MAX_SCHEMA_BYTES = 64 * 1024
"""The default ``max_schema_bytes``: the largest input schema (as JSON) loopd checks and lists."""
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""The default ``max_message_bytes``: the longest line a stdio server may write (one message)."""


def check_server_name(name: str) -> str | None:
    """Why ``name`` cannot name an MCP server, or None. A name is 1 to 32 letters, digits,
    ``_`` and ``-``, starting with a letter or digit, without ``__`` (which joins it to its
    tools' names) and not ending in ``_``."""
    if not isinstance(name, str) or not _SERVER_NAME.fullmatch(name):
        return (
            f"mcp.{name}: a server name is 1 to 32 letters, digits, _ and -, starting with a "
            "letter or digit"
        )
    if MCP_SEPARATOR in name or name.endswith("_"):
        return f"mcp.{name}: a server name may not hold __ or end in _ (__ joins it to its tools)"
    return None


class McpServerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """``[mcp.NAME]``: one MCP server. Set ``command`` (stdio) or ``url`` (streamable HTTP)."""

    command: tuple[str, ...] | None = None
    """The program and its arguments, started as a child process speaking MCP on stdio."""
    url: str | None = None
    """The server's streamable HTTP endpoint (``http://127.0.0.1:9000/mcp``)."""
    env: dict[str, str] = msgspec.field(default_factory=dict)
    """stdio only: variables added to the SDK's default environment (``PATH``, ``HOME``...)."""
    headers_env: dict[str, str] = msgspec.field(default_factory=dict)
    """HTTP only: header name -> the environment variable holding its value."""
    tools: tuple[str, ...] | None = None
    """The server's tools to list (its own names, ``read``); None: every tool it lists."""
    trusted: bool = False
    """False: every result marks the calling session untrusted."""
    timeout_s: float = 60.0
    """How long the start waits for the server's tool list, and a call for its answer."""
    deny_untrusted: tuple[str, ...] = ()
    """The server's tools (its own names, ``write``) denied to a session that has read
    untrusted data, as ``remember`` is: the server cannot know the session's flag."""
    max_tools: int = MAX_TOOLS
    """The most tools of this server listed; those past it are left out and named."""
    max_schema_bytes: int = MAX_SCHEMA_BYTES
    """A tool whose input schema is longer than this as JSON is left out (never checked)."""
    max_message_bytes: int = MAX_MESSAGE_BYTES
    """stdio only: a line of the server's stdout longer than this is dropped unread (a call
    it answered fails, naming the cap)."""

    def check(self, name: str) -> str | None:
        """Why this table cannot be ``[mcp.<name>]``, naming the key; None if it can. Values of
        the right kind are normalised in place (a list becomes a tuple, an int a float)."""
        problem = check_server_name(name)
        if problem is not None:
            return problem
        key = f"mcp.{name}"
        for field in msgspec.structs.fields(type(self)):
            value = getattr(self, field.name)
            try:
                checked = msgspec.convert(value, type=field.type, strict=True)
            except msgspec.ValidationError as exc:
                return f"{key}.{field.name}: {exc}"
            if checked is not value:
                msgspec.structs.force_setattr(self, field.name, checked)
        return self._rules(key)

    def _rules(self, key: str) -> str | None:
        if (self.command is None) == (self.url is None):
            return f"{key}: set command (stdio) or url (streamable HTTP), exactly one of them"
        if self.command is not None:
            if not self.command or not self.command[0]:
                return f"{key}.command must name a program"
            if any("\x00" in part for part in self.command):
                return f"{key}.command must not hold a NUL character"
            if self.headers_env:
                return f"{key}.headers_env is for a url server; a command server gets env"
        if self.url is not None:
            if not self.url.startswith(("http://", "https://")) or any(
                c.isspace() or not c.isprintable() for c in self.url
            ):
                return f"{key}.url {self.url[:80]!r} is not an http:// or https:// URL"
            if self.env:
                return f"{key}.env is for a command server; a url server gets headers_env"
        for variable in self.env:
            if not _ENV_NAME.fullmatch(variable):
                return f"{key}.env: {variable!r} is not an environment variable name"
        for header, variable in self.headers_env.items():
            if not _HEADER_NAME.fullmatch(header):
                return f"{key}.headers_env: {header!r} is not an HTTP header name"
            if not _ENV_NAME.fullmatch(variable):
                return f"{key}.headers_env.{header}: {variable!r} is not a variable name"
        if self.tools is not None and len(set(self.tools)) != len(self.tools):
            return f"{key}.tools names a tool twice"
        if len(set(self.deny_untrusted)) != len(self.deny_untrusted):
            return f"{key}.deny_untrusted names a tool twice"
        listed = set(self.deny_untrusted if self.tools is None else self.tools)
        left_out = sorted(set(self.deny_untrusted) - listed)
        if left_out:
            return f"{key}.deny_untrusted names {', '.join(left_out)}, which tools leaves out"
        if not math.isfinite(self.timeout_s) or not 0 < self.timeout_s <= _MAX_TIMEOUT_S:
            return (
                f"{key}.timeout_s must be a finite number of seconds above 0 and at most "
                f"{_MAX_TIMEOUT_S} (365 days), not {self.timeout_s!r}"
            )
        for limit in ("max_tools", "max_schema_bytes", "max_message_bytes"):
            value = getattr(self, limit)
            if not 0 < value <= 2**40:
                return f"{key}.{limit} must be a whole number above 0, not {value!r}"
        return None

    def secret_leak(self, name: str, secret_variables: Iterable[str]) -> str | None:
        """Why ``env`` may not be passed on: it names a variable holding one of loopd's API
        keys (``secret_variables``), which no MCP server ever gets; None if it does not."""
        secrets = set(secret_variables)
        for variable in self.env:
            if variable in secrets:
                return (
                    f"mcp.{name}.env.{variable}: that variable holds one of loopd's API keys, "
                    "which is never passed to an MCP server"
                )
        return None
