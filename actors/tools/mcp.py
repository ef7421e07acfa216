"""The MCP adapter: what loopd makes of an MCP server's tools and results (the ``mcp`` SDK).

Plain functions over the SDK's types, and one async context manager that connects:

- :func:`listing` turns a server's ``tools/list`` into the tools the registry lists
  (``<server>__<tool>``, the server's description and input schema, an argument check on that
  schema) and the names it leaves out;
- :func:`result_text` turns a ``tools/call`` result into the tool text the model reads;
- :func:`server_env` is a stdio server's environment; :class:`StderrLines` takes its stderr to
  loopd's log, a line at a time, capped;
- :func:`connect` starts or reaches one server and yields its initialised ``ClientSession``.

Only the MCP service (``actors.services.mcp``) drives these; nothing here keeps state between
calls. Needs the extra ``loopd[mcp]``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import jsonschema
import mcp_types as types
import msgspec
from mcp import ClientSession
from mcp.client.session import MessageHandlerFnT
from mcp.client.stdio import get_default_environment
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from actors.core.bounded import OutOfBounds, check_value, decode_json
from actors.core.dispatch import ArgumentError
from actors.core.mcp_config import MAX_SCHEMA_BYTES, MAX_TOOLS, McpServerConfig
from actors.core.mcp_tools import McpTool, joined_name
from actors.core.text import cap_chars
from actors.tools.mcp_stdio import stdio_transport
from messages import ToolSpec

__all__ = [
    "STDERR_LINES_PER_MINUTE",
    "STDERR_LINE_CHARS",
    "HttpRefused",
    "HttpStatus",
    "Listing",
    "ListingStopped",
    "StderrLines",
    "argument_check",
    "connect",
    "decode_arguments",
    "listing",
    "result_text",
    "server_env",
]

log = logging.getLogger("actors.mcp")

STDERR_LINE_CHARS = 1000
"""A line of a server's stderr is logged cut to this many characters."""
STDERR_LINES_PER_MINUTE = 100
"""At most this many stderr lines of one server are logged a minute; the rest are counted."""
_MAX_PAGES = 100  # a tools/list that pages on forever cannot hang a start


# Results.


def _decoded_size(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        return len(data)


def _describe(block: Any) -> str:
    """One content block as text: a text block's text, anything else by type and size."""
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.ImageContent | types.AudioContent):
        return f"[{block.mime_type}, {_decoded_size(block.data)} bytes]"
    if isinstance(block, types.EmbeddedResource):
        resource = block.resource
        kind = resource.mime_type or "resource"
        if isinstance(resource, types.TextResourceContents):
            return f"[{kind}, {len(resource.text.encode())} bytes]"
        return f"[{kind}, {_decoded_size(resource.blob)} bytes]"
    if isinstance(block, types.ResourceLink):
        return f"[resource link {block.uri}]"
    return f"[{getattr(block, 'type', type(block).__name__)}]"


def result_text(result: types.CallToolResult, cap: int) -> str:
    """The tool text of ``result``: the text contents joined with ``\\n``, other content
    described (``[image/png, 12345 bytes]``), the structured content as JSON when there is no
    other; ``Error: <text>`` for an ``isError`` result; at most ``cap`` characters, each lone
    surrogate replaced by ``?``."""
    parts = [_describe(block) for block in result.content]
    if not parts and result.structured_content is not None:
        parts = [msgspec.json.encode(result.structured_content).decode()]
    text = "\n".join(parts)
    if result.is_error:
        text = f"Error: {text or 'the tool failed'}"
    text = cap_chars(text, cap)
    if not text.isascii():  # a lone surrogate (JSON's "\ud800") could be neither stored nor sent
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


# Listing.


def _field_of(error: jsonschema.ValidationError) -> str:
    path = ".".join(str(part) for part in error.absolute_path)
    return f"{path}: {error.message}" if path else error.message


def argument_check(schema: Mapping[str, Any]) -> Callable[[str], str | None]:
    """The check of a call's raw arguments against ``schema``: the denial's detail (naming
    the field: ``path: 3 is not of type 'string'``), or None. ``SchemaError`` if ``schema`` is
    no valid JSON schema. The arguments pass the bounded decode first (nesting, size, int64,
    valid Unicode), so no hostile value reaches the validator."""
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    validator = cls(schema)

    def check(arguments: str) -> str | None:
        try:
            value = decode_arguments(arguments)
        except ArgumentError as exc:
            return exc.detail
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
        return None if error is None else _field_of(error)

    return check


def decode_arguments(arguments: str) -> dict[str, Any]:
    """A call's raw arguments as the object they must be, through the bounded decode;
    :class:`ArgumentError` naming what is wrong (a bound, or that it is no object)."""
    if not arguments.strip():
        return {}
    try:
        value = decode_json(arguments)
    except OutOfBounds as exc:
        raise ArgumentError(exc.detail) from None
    if not isinstance(value, dict):
        raise ArgumentError("arguments must be a JSON object")
    return value


@dataclass(frozen=True)
class Listing:
    """What one ``tools/list`` gives: the tools listed to models, and the names left out."""

    tools: tuple[McpTool, ...]
    skipped: tuple[str, ...]


class ListingStopped(Exception):
    """The service stops: a listing on a worker thread ends between two tools."""


_NAMED_PAST_MAX = 100  # tools past max_tools named one by one in skipped; the rest counted


def _shown(name: str) -> str:
    return cap_chars(name, 100) if name else '""'


def _schema_problem(schema: Mapping[str, Any], max_bytes: int) -> str | None:
    """Why ``schema`` is not checked at all: too deep, or longer than ``max_bytes`` as JSON."""
    try:
        check_value(dict(schema))
    except OutOfBounds as exc:
        return f"its input schema is {exc.detail}"
    size = len(msgspec.json.encode(schema))
    if size > max_bytes:
        return f"its input schema is {size:,} bytes, over max_schema_bytes ({max_bytes:,})"
    return None


def listing(
    server: str,
    tools: Iterable[types.Tool],
    allowed: Iterable[str] | None,
    deny_untrusted: Iterable[str] = (),
    *,
    max_tools: int = MAX_TOOLS,
    max_schema_bytes: int = MAX_SCHEMA_BYTES,
    deadline: float | None = None,
    stopped: Callable[[], bool] = lambda: False,
) -> Listing:
    """The tools of ``server`` loopd lists: those in ``allowed`` (the config's ``tools``; None:
    all), whose joined name is a valid tool name and whose input schema is a valid JSON
    schema. The others of ``allowed`` are named in ``skipped`` (and logged). Those in
    ``deny_untrusted`` are marked so (denied to untrusted sessions).

    Bounded, since it may take long (a schema check is pure Python): the first ``max_tools``
    are listed (the rest named in ``skipped``, the first hundred one by one); a schema over
    ``max_schema_bytes`` or nested past the bounded decode's depth is never checked (the tool
    is named with the reason); a tool not reached by ``deadline`` (``time.monotonic()``) is
    named as not checked in time; ``stopped()`` true ends it with :class:`ListingStopped`. A
    tool without a name is left out, and a name listed twice is listed once (the first).
    Meant for a worker thread: it touches nothing shared."""
    allow = None if allowed is None else set(allowed)
    denied = set(deny_untrusted)
    kept: list[McpTool] = []
    skipped: list[str] = []
    seen: set[str] = set()
    past_max = 0
    for tool in tools:
        if stopped():
            raise ListingStopped
        if allow is not None and tool.name not in allow:
            continue
        if tool.name in seen:
            log.warning("MCP server %s: tool %s is listed twice: the first kept", server, tool.name)
            continue
        seen.add(tool.name)
        if len(kept) >= max_tools:
            past_max += 1
            if past_max <= _NAMED_PAST_MAX:
                skipped.append(f"{_shown(tool.name)} (past max_tools, {max_tools:,})")
            continue
        name = joined_name(server, tool.name) if tool.name else None
        if name is None:
            log.warning(
                "MCP server %s: tool %r left out: %s__%s is no valid tool name "
                "(letters, digits, _ and -, at most 64)",
                server,
                cap_chars(tool.name, 100),
                server,
                cap_chars(tool.name, 100),
            )
            skipped.append(_shown(tool.name) if not tool.name else tool.name)
            continue
        if deadline is not None and time.monotonic() > deadline:
            problem: str | None = "its input schema was not checked within timeout_s"
        else:
            problem = _schema_problem(tool.input_schema, max_schema_bytes)
        if problem is not None:
            log.warning("MCP server %s: tool %s left out: %s", server, tool.name, problem)
            skipped.append(f"{tool.name} ({problem})")
            continue
        try:
            check = argument_check(tool.input_schema)
        except jsonschema.SchemaError as exc:
            log.warning(
                "MCP server %s: tool %s left out: its input schema is not valid: %s",
                server,
                tool.name,
                cap_chars(str(exc.message), 300),
            )
            skipped.append(tool.name)
            continue
        spec = ToolSpec(name, tool.description or "", dict(tool.input_schema))
        kept.append(McpTool(server, tool.name, spec, check, tool.name in denied))
    if past_max > _NAMED_PAST_MAX:
        skipped.append(f"{past_max - _NAMED_PAST_MAX:,} more tools past max_tools ({max_tools:,})")
    if past_max:
        log.warning(
            "MCP server %s: %d tools past max_tools (%d) left out", server, past_max, max_tools
        )
    return Listing(tuple(kept), tuple(skipped))


async def list_all_tools(session: ClientSession, max_tools: int = MAX_TOOLS) -> list[types.Tool]:
    """Every tool the server lists, following its pages (no further once more than
    ``max_tools`` are in: those past it are left out anyway)."""
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        params = None if cursor is None else types.PaginatedRequestParams(cursor=cursor)
        page = await session.list_tools(params=params)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor or len(tools) > max_tools:
            break
    return tools


# The environment and stderr of a stdio server.


def server_env(config: McpServerConfig, secret_variables: Iterable[str]) -> dict[str, str]:
    """A stdio server's environment: the SDK's default one plus ``env``, without any of
    ``secret_variables`` (the variables holding loopd's API keys)."""
    env = get_default_environment() | dict(config.env)
    for name in secret_variables:
        env.pop(name, None)
    return env


class StderrLines:
    """Takes a server's stderr to loopd's log (``actors.mcp``, INFO), one record a line: a
    line cut to :data:`STDERR_LINE_CHARS`, at most :data:`STDERR_LINES_PER_MINUTE` lines a
    minute (then one record saying how many were dropped). The pipe is always drained, so a
    server that floods its stderr never blocks on it."""

    def __init__(self, server: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.server = server
        self.clock = clock
        self._window = clock()
        self._logged = 0
        self._dropped = 0
        self._partial = b""

    def feed(self, data: bytes) -> None:
        """A chunk of stderr; whole lines are logged, the rest kept for the next chunk."""
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > STDERR_LINE_CHARS * 4:  # a line without end: log it cut
            lines.append(self._partial)
            self._partial = b""
        for line in lines:
            self.line(line.decode("utf-8", "replace").rstrip("\r"))

    def line(self, text: str) -> None:
        """Log one line (if this minute's share is not spent)."""
        now = self.clock()
        if now - self._window >= 60:
            if self._dropped:
                log.warning(
                    "MCP server %s: %d stderr lines not logged (more than %d a minute)",
                    self.server,
                    self._dropped,
                    STDERR_LINES_PER_MINUTE,
                )
            self._window, self._logged, self._dropped = now, 0, 0
        if self._logged >= STDERR_LINES_PER_MINUTE:
            self._dropped += 1
            return
        self._logged += 1
        log.info("MCP server %s: %s", self.server, cap_chars(text, STDERR_LINE_CHARS))

    def close(self) -> None:
        """The pipe ended: log what is left."""
        if self._partial:
            self.line(self._partial.decode("utf-8", "replace"))
            self._partial = b""
        if self._dropped:
            log.warning(
                "MCP server %s: %d stderr lines not logged (more than %d a minute)",
                self.server,
                self._dropped,
                STDERR_LINES_PER_MINUTE,
            )
            self._dropped = 0


async def _pump_stderr(fd: int, lines: StderrLines) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
    )
    try:
        while chunk := await reader.read(65536):
            lines.feed(chunk)
    finally:
        lines.close()
        transport.close()


# Connecting.


class HttpStatus:
    """The last error status (400 and up) a streamable-HTTP server answered, so a failure the
    SDK reports only as "an error response" can name it."""

    def __init__(self) -> None:
        self.code = 0
        self.reason = ""

    async def seen(self, response: Any) -> None:
        """The HTTP client's response hook."""
        if response.status_code >= 400:
            self.code, self.reason = response.status_code, response.reason_phrase or ""

    def why(self) -> str | None:
        """The last error status as a reason (credentials for 401 and 403), or None."""
        if not self.code:
            return None
        status = f"HTTP {self.code} {self.reason}".rstrip()
        if self.code in (401, 403):
            return f"the server refused its credentials ({status}; see headers_env)"
        return f"the server answered {status}"


class HttpRefused(Exception):
    """A streamable-HTTP server answered the handshake with an error status."""


@contextlib.asynccontextmanager
async def connect(
    server: str,
    config: McpServerConfig,
    *,
    secret_variables: Iterable[str] = (),
    on_message: MessageHandlerFnT | None = None,
) -> AsyncIterator[tuple[ClientSession, anyio.Event, HttpStatus]]:
    """Start (``command``) or reach (``url``) ``server`` and yield its initialised session, an
    event set when its connection ends (the process exited, the stream closed), and the last
    HTTP error status it answered (a url server). Leaving the context ends the session and,
    for a stdio server, its whole process group (:mod:`actors.tools.mcp_stdio`).

    Raises ``OSError`` if the program cannot be started, ``KeyError`` naming the variable of a
    ``headers_env`` header that is not set, :class:`HttpRefused` naming the status a url server
    answered the handshake with, and what the SDK raises if the handshake fails otherwise.
    """
    status = HttpStatus()
    async with contextlib.AsyncExitStack() as stack:
        if config.command is not None:
            read_fd, write_fd = os.pipe()
            # The pump reads the server's stderr from the start; it is settled after the
            # process has ended (the exit stack unwinds in reverse), when the pipe is at its end.
            pump = asyncio.get_running_loop().create_task(
                _pump_stderr(read_fd, StderrLines(server))
            )
            stack.push_async_callback(_settle, pump)
            try:
                streams = await stack.enter_async_context(
                    stdio_transport(
                        server,
                        list(config.command),
                        server_env(config, secret_variables),
                        write_fd,
                        config.max_message_bytes,
                    )
                )
            finally:
                os.close(write_fd)  # the child keeps its own copy
        else:
            assert config.url is not None
            headers = {header: os.environ[var] for header, var in config.headers_env.items()}
            client = await stack.enter_async_context(create_mcp_http_client(headers=headers))
            client.event_hooks["response"].append(status.seen)
            streams = await stack.enter_async_context(
                streamable_http_client(config.url, http_client=client)
            )
        read, write = streams
        ended = anyio.Event()
        # The session reads through this pair, so the end of the server's stream is seen
        # even while no call is waiting.
        into, out = anyio.create_memory_object_stream[Any](0)

        async def forward() -> None:
            try:
                async with into:
                    async for item in read:
                        await into.send(item)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass
            finally:
                ended.set()

        group = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(group.cancel_scope.cancel)
        group.start_soon(forward)
        session = await stack.enter_async_context(
            ClientSession(out, write, message_handler=on_message)
        )
        try:
            await session.initialize()
        except MCPError:
            refused = status.why()
            if refused is not None:
                raise HttpRefused(refused) from None
            raise
        yield session, ended, status


async def _settle(task: asyncio.Task[None]) -> None:
    """Let the stderr pump read to the end (the process is gone by now), briefly."""
    with contextlib.suppress(asyncio.CancelledError, TimeoutError, OSError):
        await asyncio.wait_for(asyncio.shield(task), 1.0)
    task.cancel()
