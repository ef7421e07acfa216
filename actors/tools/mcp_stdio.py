"""loopd's own stdio transport for MCP servers: a bounded reader under the SDK's session.

The SDK's ``stdio_client`` re-splits its whole buffer for every chunk it reads, so a line of
50 MB took longer than a call's deadline and a 100 MB line before the handshake kept a server
from ever coming up; and each line that is not JSON-RPC logged a traceback. This transport
gives the SDK's ``ClientSession`` the same pair of streams (``SessionMessage`` objects in and
out), with its own reader:

- :class:`LineSplitter` cuts the server's stdout into lines in time linear in their length;
  a line longer than ``max_message_bytes`` is dropped as it arrives (only its first bytes are
  kept, to find the request it answers, which then fails naming the cap);
- a line that is not JSON-RPC is counted, and logged capped (:class:`JunkLines`): a few lines
  a minute, then how many more there were;
- a long line is decoded on a worker thread, never on the MCP service's loop;
- the server runs in a process group of its own, and the whole group is ended when the
  connection closes (stdin closed, a short grace, then SIGTERM to the group, then SIGKILL), so
  a server's own children never outlive it, even when the server exits at the end of its input.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
from anyio.abc import Process
from mcp.shared.message import SessionMessage

from actors.core.text import cap_chars

__all__ = [
    "GRACE_S",
    "JUNK_LINES_PER_MINUTE",
    "TOO_LONG",
    "JunkLines",
    "LineSplitter",
    "Oversized",
    "stdio_transport",
]

log = logging.getLogger("actors.mcp")

GRACE_S = 1.0
"""How long a server has to exit after its stdin closes, and its group after SIGTERM."""
JUNK_LINES_PER_MINUTE = 10
"""At most this many lines of a server's stdout that are not JSON-RPC are logged a minute."""
TOO_LONG = -32099
"""The JSON-RPC error code loopd gives a request whose answer it could not take."""
_HEAD_BYTES = 4096  # what is kept of a dropped line: enough to find its id
_THREAD_BYTES = 1 << 20  # a line longer than this is decoded on a worker thread
_CHUNK = 1 << 20
_ID = re.compile(rb'"id"\s*:\s*(-?\d{1,18}|"(?:[^"\\]|\\.){0,256}")')


@dataclass(frozen=True)
class Oversized:
    """A line longer than the cap: its length and its first bytes (the rest never kept)."""

    size: int
    head: bytes


class LineSplitter:
    """Cuts a byte stream into lines of at most ``cap`` bytes, in time linear in the input:
    each chunk is scanned once, and a line is joined once, when it ends."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._parts: list[bytes] = []
        self._size = 0
        self._head: bytes | None = None  # set once the line is over the cap

    def feed(self, chunk: bytes) -> list[bytes | Oversized]:
        """The lines ``chunk`` completes (without their ``\\n``)."""
        out: list[bytes | Oversized] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            self._add(chunk[start:] if end < 0 else chunk[start:end])
            if end < 0:
                return out
            out.append(self._take())
            start = end + 1

    def close(self) -> bytes | Oversized | None:
        """The stream ended: its last line if it had no ``\\n``."""
        if not self._size:
            return None
        return self._take()

    def _add(self, piece: bytes) -> None:
        if not piece:
            return
        self._size += len(piece)
        if self._head is not None:
            return
        if self._size > self.cap:
            self._head = b"".join([*self._parts, piece[:_HEAD_BYTES]])[:_HEAD_BYTES]
            self._parts = []
        else:
            self._parts.append(piece)

    def _take(self) -> bytes | Oversized:
        item: bytes | Oversized
        if self._head is not None:
            item = Oversized(self._size, self._head)
        else:
            item = b"".join(self._parts)
        self._parts, self._size, self._head = [], 0, None
        return item


class JunkLines:
    """Counts the lines of a server's stdout that are not JSON-RPC and logs them capped: at
    most :data:`JUNK_LINES_PER_MINUTE` a minute (each cut to 200 characters), then one record
    saying how many more there were."""

    def __init__(self, server: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.server = server
        self.clock = clock
        self.count = 0
        self._window = clock()
        self._logged = 0
        self._dropped = 0

    def line(self, head: bytes, why: str) -> None:
        """One line that is not JSON-RPC (``head``: its first bytes), and why."""
        self.count += 1
        now = self.clock()
        if now - self._window >= 60:
            self._summary()
            self._window, self._logged = now, 0
        if self._logged >= JUNK_LINES_PER_MINUTE:
            self._dropped += 1
            return
        self._logged += 1
        text = cap_chars(head[:400].decode("utf-8", "replace"), 200)
        log.warning(
            "MCP server %s: a line of its stdout was dropped (%s): %r", self.server, why, text
        )

    def close(self) -> None:
        """The stream ended: say how many lines were not logged."""
        self._summary()

    def _summary(self) -> None:
        if self._dropped:
            log.warning(
                "MCP server %s: %d more lines of its stdout were dropped, not JSON-RPC "
                "(at most %d a minute are logged)",
                self.server,
                self._dropped,
                JUNK_LINES_PER_MINUTE,
            )
            self._dropped = 0


def request_id(head: bytes) -> int | str | None:
    """The ``id`` a line of JSON-RPC names in its first bytes, if it names one there."""
    found = _ID.search(head)
    if found is None:
        return None
    raw = found.group(1)
    if raw.startswith(b'"'):
        try:
            return raw[1:-1].decode("utf-8")
        except UnicodeDecodeError:
            return None
    return int(raw)


def _decode(line: bytes) -> SessionMessage | str:
    """One line as a message, or why it is none (the first line of the decoder's error)."""
    try:
        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError as exc:
        text = str(exc).splitlines()
        return cap_chars(" ".join(text[:3]) or "not JSON-RPC", 300)
    return SessionMessage(message)


def _refusal(ident: int | str, detail: str) -> SessionMessage:
    error = types.ErrorData(code=TOO_LONG, message=detail)
    return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=ident, error=error))


async def _read(process: Process, server: str, cap: int, sink: Any, junk: JunkLines) -> None:
    """Read the server's stdout into ``sink`` a message at a time, until it ends."""
    splitter = LineSplitter(cap)
    assert process.stdout is not None

    async def deliver(item: bytes | Oversized) -> None:
        if isinstance(item, Oversized):
            detail = (
                f"the server's answer is {item.size:,} bytes, over mcp.{server}.max_message_bytes "
                f"({cap:,}); it was dropped unread"
            )
            ident = request_id(item.head)
            junk.line(item.head, f"{item.size:,} bytes, over max_message_bytes")
            if ident is not None:
                await sink.send(_refusal(ident, detail))
            return
        if not item.strip():
            return
        if len(item) > _THREAD_BYTES:
            decoded = await anyio.to_thread.run_sync(_decode, item, abandon_on_cancel=True)
        else:
            decoded = _decode(item)
        if isinstance(decoded, str):
            junk.line(item, decoded)
            ident = request_id(item[:_HEAD_BYTES])
            if ident is not None and b'"method"' not in item[:_HEAD_BYTES]:
                await sink.send(_refusal(ident, f"the server's answer is not JSON-RPC: {decoded}"))
            return
        await sink.send(decoded)

    try:
        async with sink:
            while True:
                try:
                    chunk = await process.stdout.receive(_CHUNK)
                except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                    break
                for item in splitter.feed(chunk):
                    await deliver(item)
            last = splitter.close()
            if last is not None:
                await deliver(last)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        pass  # the session is gone, or the pipe under it
    finally:
        junk.close()


async def _write(process: Process, source: Any, sink: Any) -> None:
    """Write each message of ``source`` to the server's stdin, a line each."""
    assert process.stdin is not None
    try:
        async with source:
            async for message in source:
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                await process.stdin.send(data.encode() + b"\n")
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        # The server cannot be written to: the session sees its connection end.
        with contextlib.suppress(Exception):
            await sink.aclose()


async def _exited(process: Process, within: float) -> bool:
    deadline = anyio.current_time() + within
    while process.returncode is None:
        if anyio.current_time() >= deadline:
            return False
        await anyio.sleep(0.01)
    return True


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


async def end_group(process: Process) -> None:
    """End the server and its process group: stdin closed, :data:`GRACE_S` to exit, then
    SIGTERM to the group (its children too, even when the server itself exited), up to
    :data:`GRACE_S` more, then SIGKILL. Every wait is bounded."""
    group = process.pid  # the leader of its own session: its pid is the group's id
    with contextlib.suppress(Exception):
        if process.stdin is not None:
            await process.stdin.aclose()
    await _exited(process, GRACE_S)
    try:
        os.killpg(group, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = anyio.current_time() + GRACE_S
    while _group_alive(group) and anyio.current_time() < deadline:
        _ = process.returncode  # lets the loop reap the leader
        await anyio.sleep(0.01)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)
    await _exited(process, GRACE_S)


@contextlib.asynccontextmanager
async def stdio_transport(
    server: str,
    command: list[str],
    env: dict[str, str],
    errlog: int,
    max_message_bytes: int,
) -> AsyncIterator[tuple[Any, Any]]:
    """Start ``command`` in a process group of its own (stderr to the file descriptor
    ``errlog``) and yield the (read, write) streams of ``SessionMessage`` the SDK's
    ``ClientSession`` takes. Leaving ends the whole group (:func:`end_group`), shielded from
    cancellation and bounded. ``OSError`` if the program cannot be started."""
    process = await anyio.open_process(command, env=env, stderr=errlog, start_new_session=True)
    read_in, read_out = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_in, write_out = anyio.create_memory_object_stream[SessionMessage](0)
    junk = JunkLines(server)
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(_read, process, server, max_message_bytes, read_in, junk)
            group.start_soon(_write, process, write_out, read_in)
            try:
                yield read_out, write_in
            finally:
                with anyio.CancelScope(shield=True):
                    write_in.close()
                    read_out.close()
                    await end_group(process)
                    with contextlib.suppress(Exception):
                        assert process.stdout is not None
                        await process.stdout.aclose()
                group.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                await end_group(process)
            with contextlib.suppress(Exception), anyio.move_on_after(GRACE_S):
                await process.aclose()
