"""The MCP service: every ``[mcp.NAME]`` server's session, as tasks of one asyncio loop.

It stands at the ``mcp`` address of the :class:`~actors.dispatcher.directory.Directory` and
owns every MCP connection of a runtime (one owner per resource): one loop in one thread of its
own, one supervising task per server, one task per call. ``tell`` hands a message to the loop
(``call_soon_threadsafe``); nothing blocks the caller, and a call never takes a port worker.

- :class:`~messages.PortCall` for ``<server>__<tool>`` runs ``tools/call`` and tells a
  :class:`~messages.ToolDone` to ``reply_to`` (untrusted unless the server is ``trusted``).
  A server that is not running answers at once; ``timeout_s`` bounds every call.
- :class:`~messages.CancelPortCall` cancels the call's task: the SDK sends the server MCP's
  ``notifications/cancelled`` for it, and nothing is answered (nobody waits).
- Each server is started, listed (its tools published to the
  :class:`~actors.core.mcp_tools.McpCatalog`, for new sessions), watched, and started again
  with backoff (1 s, doubling, at most 60 s) when it cannot start or stops. Each change is an
  event: :class:`~messages.McpServerUp` or :class:`~messages.McpServerDown`.
- :meth:`McpService.stop` ends every server (a stdio server's process included) and the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.shared.exceptions import MCPError

from actors.core.dispatch import ArgumentError, clock_text
from actors.core.mcp_config import McpServerConfig
from actors.core.mcp_tools import McpCatalog, McpTool
from actors.dispatcher.directory import EVENTS, Directory
from actors.tools.mcp import (
    HttpRefused,
    HttpStatus,
    ListingStopped,
    connect,
    decode_arguments,
    list_all_tools,
    listing,
    result_text,
)
from actors.tools.mcp_stdio import TOO_LONG
from messages import (
    CancelPortCall,
    DataClass,
    McpServerDown,
    McpServerUp,
    PortCall,
    ToolDone,
    ToolProgress,
    ToolResult,
)

__all__ = ["BACKOFF_MAX_S", "BACKOFF_START_S", "McpService", "not_running"]

log = logging.getLogger(__name__)

BACKOFF_START_S = 1.0
"""The wait before a server that could not start or stopped is started again; it doubles."""
BACKOFF_MAX_S = 60.0
"""The longest wait between two starts of one server."""
_SDK_ERROR_RESPONSE = "Server returned an error response"  # the SDK's text for any HTTP error
_PING_S = 5.0  # how long a health check of an HTTP server after a failed call may take


def not_running(server: str, why: str, since: datetime | None = None) -> str:
    """The text a call of a server that is not running gets (``since``: when it stopped)."""
    when = "" if since is None else f" (since {clock_text(since)})"
    return f"Error: MCP server {server} is not running: {why}{when}"


def _why(exc: BaseException, status: HttpStatus | None = None) -> str:
    """An exception as the reason a server is down (an ExceptionGroup by its first leaf);
    ``status``: the last HTTP error status its server answered, named instead of the SDK's
    "Server returned an error response"."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, KeyError):  # a headers_env variable that is not set
        return f"the environment variable {exc.args[0]} is not set (headers_env)"
    if isinstance(exc, HttpRefused):
        return str(exc)
    if isinstance(exc, MCPError) and exc.code == types.CONNECTION_CLOSED:
        return "its connection closed"
    if isinstance(exc, MCPError) and exc.code == TOO_LONG:
        return str(exc.error.message)
    if isinstance(exc, MCPError) and exc.error.message == _SDK_ERROR_RESPONSE and status:
        named = status.why()  # the SDK's stand-in for an HTTP error status: name the status
        if named is not None:
            return named
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass
class _Server:
    """One server's life, as only the loop's thread touches it."""

    name: str
    config: McpServerConfig
    session: Any = None  # the ClientSession while up
    ended: anyio.Event | None = None  # set when the connection ends (or must be restarted)
    why: str = "it is starting"
    scope: anyio.CancelScope | None = None  # made on the loop (anyio needs one running)
    calls: set[Hashable] = field(default_factory=set)
    came_up: bool = False  # this life listed its tools: the next restart waits the least again
    since: datetime | None = None  # when it went down
    status: HttpStatus | None = None  # a url server's last HTTP error status
    relist: bool = False  # a tools/list_changed came: list again (one pending at most)
    lister: asyncio.Task[None] | None = None  # the one list in flight after a change
    listed: tuple[tuple[str, ...], tuple[str, ...]] | None = None  # what its last event said


@dataclass
class _Call:
    """A call in flight: its task, and once it runs, the anyio scope that cancels it (so the
    SDK sends the server its cancellation)."""

    task: asyncio.Task[None] | None = None
    scope: anyio.CancelScope | None = None

    def cancel(self) -> None:
        if self.scope is not None:
            self.scope.cancel()
        elif self.task is not None:  # not started yet: it never reaches the server
            self.task.cancel()


class McpService:
    """Every MCP server of a runtime, on one asyncio loop in one thread.

    ``servers`` are the config's ``[mcp.NAME]`` tables; ``catalog`` gets each server's tool
    list; ``result_cap`` is ``loop.tool_result_cap``; ``secret_variables`` are the variables
    holding loopd's API keys (never passed to a stdio server). ``backoff`` is (first wait,
    longest wait) in seconds.
    """

    def __init__(
        self,
        servers: Mapping[str, McpServerConfig],
        catalog: McpCatalog,
        directory: Directory,
        *,
        result_cap: int,
        secret_variables: Iterable[str] = (),
        backoff: tuple[float, float] = (BACKOFF_START_S, BACKOFF_MAX_S),
        name: str = "loopd-mcp",
    ) -> None:
        self.catalog = catalog
        self.directory = directory
        self.result_cap = result_cap
        self.secret_variables = tuple(secret_variables)
        self.backoff = backoff
        self._servers = {n: _Server(n, c) for n, c in servers.items()}
        for server in servers:  # a call of a tool never listed is told why, not "no tool"
            catalog.set_down(server, not_running(server, "it is starting"))
        self._ready = {n: threading.Event() for n in servers}
        self._last: dict[str, McpServerUp | McpServerDown] = {}
        self._calls: dict[Hashable, _Call] = {}
        self._stopping = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._supervisors: concurrent.futures.Future[Any] | None = None
        self._started_at = 0.0  # the loop's time at start()
        self._first: dict[str, bool] = {}

    # The outside: any thread.

    def start(self) -> None:
        """Start the loop's thread and every server (in the background)."""
        self._started_at = self._loop.time()
        self._thread.start()
        self._supervisors = asyncio.run_coroutine_threadsafe(self._supervise_all(), self._loop)

    def wait_ready(self, timeout: float) -> tuple[str, ...]:
        """Wait at most ``timeout`` seconds, for all servers at once, until each has come up
        or failed once; returns the names still starting (they join later)."""
        # A server's own start ends at its timeout_s; its event may take a moment more.
        deadline = self._started_at + timeout + 0.25
        for ready in self._ready.values():
            ready.wait(max(0.0, deadline - self._loop.time()))
        return tuple(name for name, ready in self._ready.items() if not ready.is_set())

    def servers(self) -> dict[str, McpServerUp | McpServerDown]:
        """Each server's last ``McpServerUp`` or ``McpServerDown`` (none yet: still starting)."""
        return dict(self._last)

    def tell(self, message: Any) -> None:
        """Hand ``message`` (a PortCall or CancelPortCall) to the loop; never blocks."""
        try:
            self._loop.call_soon_threadsafe(self._receive, message)
        except RuntimeError:  # the loop is closed: the runtime stops, nobody waits
            if isinstance(message, PortCall):
                self._answer(message, "Error: the runtime is stopping")

    def stop(self, timeout: float = 10.0) -> bool:
        """End every server (each stdio process too) and the loop's thread within
        ``timeout`` seconds; False if something did not end in time."""
        if self._loop.is_closed() or not self._thread.is_alive():
            return True
        self._loop.call_soon_threadsafe(self._stop_all)
        done = True
        if self._supervisors is not None:
            try:
                self._supervisors.result(timeout)
            except concurrent.futures.TimeoutError:
                log.warning("MCP servers did not all stop within %s s", timeout)
                done = False
            except Exception:
                log.exception("stopping the MCP servers failed")
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._loop.close()
        return done and not self._thread.is_alive()

    # The loop's thread.

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def _stop_all(self) -> None:
        self._stopping = True  # a listing on a worker thread ends at its next tool
        for server in self._servers.values():
            if server.lister is not None:
                server.lister.cancel()
            if server.scope is not None:
                server.scope.cancel()
        for running in list(self._calls.values()):
            running.cancel()

    async def _supervise_all(self) -> None:
        async with anyio.create_task_group() as group:
            for server in self._servers.values():
                group.start_soon(self._supervise, server)

    async def _supervise(self, server: _Server) -> None:
        delay, longest = self.backoff
        server.scope = anyio.CancelScope()
        if self._stopping:
            return
        first = delay
        with server.scope:
            while not self._stopping:
                server.came_up = False
                why = await self._life(server)
                if self._stopping:
                    return
                if why is not None:
                    self._down(server, why)
                if server.came_up:  # it was up: a crash now and then waits 1 s, not 60
                    delay = first
                log.warning("MCP server %s: starting it again in %g s", server.name, delay)
                await anyio.sleep(delay)
                delay = min(delay * 2, longest)

    def _down(self, server: _Server, why: str) -> None:
        server.why = why
        server.since = datetime.now(UTC)
        server.listed = None
        self.catalog.set_down(server.name, not_running(server.name, why, server.since))
        self._event(McpServerDown(server=server.name, detail=why))
        log.warning("MCP server %s is down: %s", server.name, why)

    async def _life(self, server: _Server) -> str | None:
        """Start ``server``, list it, serve its calls until its connection ends; returns why
        it ended (None: said already). The start and the first list have ``timeout_s``; when
        it passes the server is reported down at once, and the start is cut off."""
        timeout = server.config.timeout_s
        # The first start counts from the service's start, as Runtime.start's wait does.
        first, self._first[server.name] = self._first.get(server.name, True), False
        due = (self._started_at if first else self._loop.time()) + timeout
        cut = anyio.CancelScope()
        expired: list[bool] = []

        def expire() -> None:
            expired.append(True)
            self._down(server, f"it gave no answer within {timeout:g} s")
            cut.cancel()

        timer = self._loop.call_at(due, expire)
        try:
            with cut:
                async with connect(
                    server.name,
                    server.config,
                    secret_variables=self.secret_variables,
                    on_message=lambda message: self._notified(server, message),
                ) as (session, ended, status):
                    server.status = status
                    await self._list(server, session, due)
                    timer.cancel()
                    server.session, server.ended = session, ended
                    await ended.wait()
                    server.session = None
                    if server.why:  # set by a call that found it gone
                        return server.why
                    return "its process exited" if server.config.command else "it closed its stream"
            return None  # cut off at its deadline: reported by expire
        except Exception as exc:
            if expired:
                return None
            if server.ended is not None:  # it was up: its connection failed under it
                return server.why or f"it stopped answering: {_why(exc, server.status)}"
            why = _why(exc, server.status)
            if why == "its connection closed" and server.config.command is not None:
                return "its process exited before it was up"
            return why
        finally:
            timer.cancel()
            server.session = None
            server.ended = None

    async def _list(self, server: _Server, session: Any, due: float) -> None:
        """List ``server``'s tools, publish them, and say it is up (again only if what it
        lists changed). The tools' schemas are checked on a worker thread, never on this
        loop, and only until ``due`` (the loop's time): a tool not checked by then is left
        out and named."""
        config = server.config
        tools = await list_all_tools(session, config.max_tools)
        check = functools.partial(
            listing,
            server.name,
            tools,
            config.tools,
            config.deny_untrusted,
            max_tools=config.max_tools,
            max_schema_bytes=config.max_schema_bytes,
            # The loop's clock is time.monotonic; a margin to publish before the start's cut.
            deadline=due - min(1.0, config.timeout_s / 10),
            stopped=lambda: self._stopping,
        )
        found = await anyio.to_thread.run_sync(check, abandon_on_cancel=True)
        self.catalog.publish(server.name, found.tools)
        self.catalog.set_down(server.name, None)
        names = tuple(sorted(tool.spec.name for tool in found.tools))
        server.why = ""
        server.since = None
        server.came_up = True
        if server.listed == (names, found.skipped):
            return  # listed again after a change, and nothing changed: no event
        server.listed = (names, found.skipped)
        self._event(McpServerUp(server=server.name, tools=names, skipped=found.skipped))
        log.info("MCP server %s is up: %s", server.name, ", ".join(names) or "no tools")

    async def _notified(self, server: _Server, message: Any) -> None:
        """A ``tools/list_changed`` asks for one more list: at most one is in flight and one
        waits, however many changes come (a storm of them costs two lists, not one each)."""
        if isinstance(message, types.ToolListChangedNotification) and not self._stopping:
            server.relist = True
            if server.lister is None or server.lister.done():
                server.lister = self._loop.create_task(self._relist(server))

    async def _relist(self, server: _Server) -> None:
        while server.relist and not self._stopping:
            server.relist = False
            session = server.session
            if session is None:
                return
            try:
                await self._list(server, session, self._loop.time() + server.config.timeout_s)
            except (ListingStopped, asyncio.CancelledError):
                return
            except Exception as exc:
                log.warning(
                    "MCP server %s: listing its changed tools failed: %s",
                    server.name,
                    _why(exc, server.status),
                )

    def _event(self, event: McpServerUp | McpServerDown) -> None:
        self._last = {**self._last, event.server: event}  # swapped whole: read by any thread
        ready = self._ready.get(event.server)
        if ready is not None:
            ready.set()
        self.directory.tell(EVENTS, event)

    def _receive(self, message: Any) -> None:
        if isinstance(message, PortCall):
            self._call(message)
        elif isinstance(message, CancelPortCall):
            found = self._calls.get((message.session, message.call_id))
            if found is not None:
                found.cancel()
        else:
            log.warning("mcp: unexpected message %r", message)

    def _call(self, call: PortCall) -> None:
        tool = self.catalog.get(call.name)
        server = self._servers.get(tool.server if tool else self.catalog.server_of(call.name) or "")
        if server is None or tool is None:  # dispatch found it listed: it went meanwhile
            self._answer(call, f"Error: no MCP server lists the tool {call.name}", trusted=True)
            return
        gone = server.ended is not None and server.ended.is_set()  # not cleaned up yet
        if server.session is None or gone or self._stopping:
            why = "the runtime is stopping" if self._stopping else server.why
            if gone and not why:
                why = "its connection ended"
            since = None if self._stopping else server.since
            self._answer(call, not_running(server.name, why, since), server.config.trusted)
            return
        key = (call.session, call.call_id)
        running = self._calls[key] = _Call()
        coro = self._run_call(server, server.session, tool, call, key, running)
        running.task = self._loop.create_task(coro)

    async def _run_call(
        self,
        server: _Server,
        session: Any,
        tool: McpTool,
        call: PortCall,
        key: Hashable,
        running: _Call,
    ) -> None:
        ended = server.ended
        text: str | None = None
        timeout = server.config.timeout_s
        scope = running.scope = anyio.CancelScope()
        try:
            with scope:
                arguments = decode_arguments(call.arguments)  # bounded: never deep or huge
                with anyio.fail_after(timeout):
                    result = await session.call_tool(
                        tool.tool, arguments, progress_callback=self._progress(call)
                    )
                text = result_text(result, self.result_cap)
        except TimeoutError:
            text = f"Error: {call.name} gave no answer within {timeout:g} s"
        except ArgumentError as exc:
            text = f"Error: the arguments are not valid: {exc.detail}"
        except Exception as exc:
            text = await self._failed(server, ended, exc)
        finally:
            self._calls.pop(key, None)
        if scope.cancel_called and text is None:
            return  # cancelled: the turn no longer waits
        if text is not None:
            self._answer(call, text, server.config.trusted)

    def _progress(self, call: PortCall) -> Any:
        """The SDK's progress callback of ``call``: each ``notifications/progress`` becomes a
        ``ToolProgress`` event of the calling session."""

        async def progress(done: float, total: float | None, message: str | None) -> None:
            event = ToolProgress(
                session=call.session,
                call_id=call.call_id,
                name=call.name,
                progress=done,
                total=total,
                message=message,
            )
            self.directory.tell(EVENTS, event)

        return progress

    async def _failed(self, server: _Server, ended: anyio.Event | None, exc: Exception) -> str:
        """The text of a call that raised; a connection that is gone ends the server's life
        (an HTTP server is asked for a ping first: one failed request is not a dead server)."""
        if ended is not None and not ended.is_set() and server.config.url is not None:
            try:
                with anyio.fail_after(min(_PING_S, server.config.timeout_s)):
                    await server.session.send_ping()
            except Exception:
                server.why = f"it stopped answering: {_why(exc, server.status)}"
                ended.set()
        if ended is not None and ended.is_set():
            why = _why(exc, server.status)
            return f"Error: MCP server {server.name} stopped during the call: {why}"
        return f"Error: {_why(exc, server.status)}"

    def _answer(self, call: PortCall, text: str, trusted: bool = False) -> None:
        result = ToolResult(call.call_id, text, DataClass.PUBLIC, untrusted=not trusted)
        self.directory.tell(call.reply_to, ToolDone(call.session, result))
