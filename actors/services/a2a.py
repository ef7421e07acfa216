"""The A2A service: every remote agent's task (``[agents.NAME] a2a_url``), on one asyncio loop.

It stands at the ``a2a`` address of the :class:`~actors.dispatcher.directory.Directory` and
owns every connection to a remote A2A agent (one owner per resource): one loop in one thread of
its own, one task per remote child. ``tell`` hands a message to the loop; nothing blocks the
caller, and no actor ever waits on the network.

- :class:`~messages.remote.RemoteSend`: store the child's :class:`~messages.remote.RemoteTaskRow`
  (and wait for the store's commit), read the agent card, check it speaks A2A 1.0 over
  JSON-RPC, send the task text with the SDK's client (``return_immediately``), tell the child
  :class:`~messages.remote.RemoteTaskStarted` with the task's id (stored in the row too), then
  follow the task with ``GetTask`` until it ends, and tell the child
  :class:`~messages.remote.RemoteTaskEnded`. A remote that asks for input is cancelled and the
  child fails with its question. Any error fails the child at once, naming the URL.
- :class:`~messages.remote.RemoteCancel`: stop following, send ``CancelTask`` (best effort,
  bounded), drop the row.
- :meth:`A2aService.cancel_orphans`: at the start, cancel the remote tasks of rows a crash left.

Every answer of a remote passes the bounded decode at the door (:class:`BoundedTransport`:
size, depth, int64, valid Unicode), before the SDK parses it; ``headers_env`` values are read
from the environment when a request is built and never appear in a log, an event or a reason.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import os
import ssl
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from a2a.client import ClientConfig, ClientFactory
from a2a.client.card_resolver import parse_agent_card
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
)
from google.protobuf.json_format import MessageToDict

from actors.core.bounded import OutOfBounds, decode_json
from actors.core.config import AgentConfig
from actors.core.remote import (
    MAX_CARD_BYTES,
    MAX_TASK_BYTES,
    card_interfaces,
    on_origin,
    parts_text,
    remote_reason,
    task_step,
)
from actors.dispatcher.directory import A2A, STORE, Directory
from messages.remote import (
    DropRemoteTask,
    RemoteCancel,
    RemoteSend,
    RemoteTaskEnded,
    RemoteTaskRow,
    RemoteTaskSaved,
    RemoteTaskStarted,
    SaveRemoteTask,
)

__all__ = ["CARD_PATH", "A2aService", "BoundedTransport", "RemoteRefused"]

log = logging.getLogger(__name__)

CARD_PATH = "/.well-known/agent-card.json"
"""Where a remote agent's card is read, below its ``a2a_url``."""
_POLL_FIRST_S = 0.01
_POLL_MAX_S = 1.0
_CANCEL_S = 5.0  # the longest a CancelTask (or a row's drop) may take


class RemoteRefused(httpx.TransportError):
    """A remote's answer broke a bound of the door (size, depth, int64, Unicode, encoding)."""


class BoundedTransport(httpx.AsyncBaseTransport):
    """An httpx transport that reads each answer whole, at most ``max_bytes`` within
    ``deadline_s`` seconds, and passes a JSON answer through
    :func:`~actors.core.bounded.decode_json` before anyone parses it.

    The deadline is for the whole answer: httpx's own timeout is between reads, which a peer
    that sends a byte now and then never meets. ``ssl_context``: the TLS settings to use
    (default: httpx's, made anew, which loads the CA bundle: some 20 ms of CPU;
    :class:`A2aService` makes one and shares it)."""

    def __init__(
        self,
        max_bytes: int = MAX_TASK_BYTES,
        ssl_context: ssl.SSLContext | None = None,
        deadline_s: float = 30.0,
    ) -> None:
        self._inner = httpx.AsyncHTTPTransport(verify=ssl_context or True)
        self.max_bytes = max_bytes
        self.deadline_s = deadline_s

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            async with asyncio.timeout(self.deadline_s):
                return await self._bounded(request)
        except TimeoutError:
            raise httpx.ReadTimeout(
                f"no whole answer within {self.deadline_s:g} s", request=request
            ) from None

    async def _bounded(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        try:
            encoding = response.headers.get("content-encoding", "identity").lower()
            if encoding not in ("", "identity"):
                raise RemoteRefused(f"its answer is {encoding[:20]!r}-encoded; loopd asks for none")
            body = bytearray()
            async for chunk in response.aiter_raw():
                body += chunk
                if len(body) > self.max_bytes:
                    raise RemoteRefused(f"its answer is over {self.max_bytes:,} bytes")
        finally:
            await response.aclose()
        kind = response.headers.get("content-type", "")
        if response.is_success and ("json" in kind or bytes(body[:1]) in (b"{", b"[")):
            try:
                decode_json(bytes(body), max_bytes=self.max_bytes)
            except OutOfBounds as exc:
                raise RemoteRefused(f"its answer: {exc.detail}") from None
        headers = [(k, v) for k, v in response.headers.raw if k.lower() != b"content-length"]
        return httpx.Response(
            response.status_code, headers=headers, content=bytes(body), request=request
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


def _what(exc: BaseException) -> str:
    """An exception as what went wrong, its cause's words included (the SDK wraps them)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, RemoteRefused | httpx.ConnectError | httpx.TimeoutException):
        exc = cause
    if isinstance(exc, RemoteRefused):
        return str(exc)
    if isinstance(exc, httpx.ConnectError):
        return f"it cannot be reached ({exc})"
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return "it did not answer in time"
    if isinstance(exc, OutOfBounds):
        return exc.detail
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}"[:500] if text else type(exc).__name__


@dataclass
class _Follow:
    """One remote child's task as the loop follows it."""

    msg: RemoteSend
    job: asyncio.Task[None] | None = None
    task_id: str = ""
    cancelled: bool = False
    sending: asyncio.Future[Any] | None = None  # the SendMessage, shielded from a cancel


class A2aService:
    """Every remote agent of a runtime, on one asyncio loop in one thread.

    ``agents`` are the profiles with ``a2a_url`` (their ``headers_env``); ``result_cap`` caps a
    remote answer's text (``loop.tool_result_cap``); ``timeout_s`` bounds each HTTP request.
    """

    def __init__(
        self,
        agents: Mapping[str, AgentConfig],
        directory: Directory,
        *,
        result_cap: int,
        timeout_s: float = 30.0,
        name: str = "loopd-a2a",
    ) -> None:
        self.agents = dict(agents)
        self.directory = directory
        self.result_cap = result_cap
        self.timeout_s = timeout_s
        self._follows: dict[str, _Follow] = {}
        self._ssl: ssl.SSLContext | None = None  # made at the first request, then shared
        self._saves: dict[int, asyncio.Future[str]] = {}
        self._ids = itertools.count(1)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)

    # The outside: any thread.

    def start(self) -> None:
        """Start the loop's thread."""
        self._thread.start()

    def tell(self, message: Any) -> None:
        """Hand ``message`` to the loop; never blocks."""
        try:
            self._loop.call_soon_threadsafe(self._receive, message)
        except RuntimeError:  # the loop is closed: the runtime stops, nobody waits
            if isinstance(message, RemoteSend):
                ended = RemoteTaskEnded(message.session, False, detail="the runtime is stopping")
                self.directory.tell(message.reply_to, ended)

    def cancel_orphans(self, rows: Iterable[RemoteTaskRow], timeout: float = _CANCEL_S) -> None:
        """Cancel the remote tasks of ``rows`` (children a crash cut off) and drop the rows,
        waiting at most ``timeout`` seconds for all; what is not done by then is logged."""
        rows = tuple(rows)
        if not rows:
            return
        future = asyncio.run_coroutine_threadsafe(self._orphans(rows), self._loop)
        try:
            future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            log.warning("a2a: cancelling %d remote tasks a crash left took too long", len(rows))

    def stop(self, timeout: float = 10.0) -> bool:
        """Cancel every remote task followed (``CancelTask``, bounded) and end the loop."""
        if self._loop.is_closed() or not self._thread.is_alive():
            return True
        future = asyncio.run_coroutine_threadsafe(self._stop_all(), self._loop)
        try:
            future.result(timeout)
        except Exception:
            log.warning("a2a: the remote tasks were not all cancelled at the stop")
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._loop.close()
        return not self._thread.is_alive()

    # The loop's thread.

    def _receive(self, message: Any) -> None:
        if isinstance(message, RemoteSend):
            follow = _Follow(message)
            old = self._follows.get(message.session)
            if old is not None and old.job is not None:
                old.job.cancel()
            self._follows[message.session] = follow
            follow.job = self._loop.create_task(self._follow(follow))
        elif isinstance(message, RemoteCancel):
            running = self._follows.get(message.session)
            if running is not None and running.job is not None and not running.cancelled:
                running.cancelled = True
                running.job.cancel()
        elif isinstance(message, RemoteTaskSaved):
            waiter = self._saves.pop(message.request_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(message.error)
        else:
            log.warning("a2a: unexpected message %s", type(message).__name__)

    async def _stop_all(self) -> None:
        follows = [f for f in self._follows.values() if f.job is not None]
        for follow in follows:
            follow.cancelled = True
            assert follow.job is not None
            follow.job.cancel()
        await asyncio.gather(*(f.job for f in follows if f.job), return_exceptions=True)

    def _headers(self, url: str, agent: str | None = None) -> dict[str, str]:
        """The headers of requests to ``url`` (profile ``agent``'s, else the profile with that
        url): each ``headers_env`` value read now. ``KeyError`` names an unset variable."""
        profile = self.agents.get(agent or "")
        if profile is None:
            profile = next((p for p in self.agents.values() if p.a2a_url == url), None)
        headers = {"Accept-Encoding": "identity"}
        for header, variable in (profile.headers_env if profile else {}).items():
            value = os.environ.get(variable)
            if value is None:
                raise KeyError(variable)
            headers[header] = value
        return headers

    def _http(self, headers: Mapping[str, str], max_bytes: int) -> httpx.AsyncClient:
        if self._ssl is None:
            # Once: loading the CA bundle costs some 20 ms of CPU, twice a call if each client
            # made its own (httpx's default), as much as the rest of a remote call.
            self._ssl = httpx.create_ssl_context()
        return httpx.AsyncClient(
            transport=BoundedTransport(max_bytes, self._ssl, self.timeout_s),
            headers=dict(headers),
            timeout=self.timeout_s,
            follow_redirects=False,
        )

    async def _client(self, url: str, headers: Mapping[str, str], http: httpx.AsyncClient) -> Any:
        """The SDK's client for the agent at ``url``: its card read (bounded, apart), checked
        for an A2A 1.x JSON-RPC interface, and only that interface kept."""
        async with self._http(headers, MAX_CARD_BYTES) as card_http:
            response = await card_http.get(url.rstrip("/") + CARD_PATH)
        if not response.is_success:
            raise RemoteRefused(f"its agent card: HTTP {response.status_code}")
        try:
            card = decode_json(response.content, max_bytes=MAX_CARD_BYTES)
        except OutOfBounds as exc:
            raise RemoteRefused(f"its agent card: {exc.detail}") from None
        interfaces = card_interfaces(card)
        if not isinstance(interfaces, str) and set(headers) - {"Accept-Encoding"}:
            interfaces = on_origin(interfaces, url)  # a secret goes nowhere the card says
        if isinstance(interfaces, str):
            raise RemoteRefused(interfaces)
        try:
            parsed = parse_agent_card({**card, "supportedInterfaces": interfaces})
        except Exception as exc:
            raise RemoteRefused(f"its agent card is not an A2A card: {_what(exc)}") from None
        config = ClientConfig(streaming=False, polling=True, httpx_client=http)
        return ClientFactory(config).create(parsed)

    async def _save(self, row: RemoteTaskRow) -> None:
        """Store ``row`` and wait for the store's commit; ``RemoteRefused`` if it failed."""
        request = next(self._ids)
        waiter: asyncio.Future[str] = self._loop.create_future()
        self._saves[request] = waiter
        self.directory.tell(STORE, SaveRemoteTask(row.child, row, A2A, request))
        try:
            error = await asyncio.wait_for(waiter, 30.0)
        finally:
            self._saves.pop(request, None)
        if error:
            raise RemoteRefused(f"its task could not be stored before it was sent: {error}")

    def _drop(self, child: str) -> None:
        self.directory.tell(STORE, DropRemoteTask(child, A2A, next(self._ids)))

    async def _follow(self, follow: _Follow) -> None:
        """Run one remote child's task to its end, and tell the child how it ended."""
        msg = follow.msg
        ended: RemoteTaskEnded | None = None
        try:
            headers = self._headers(msg.url, msg.agent)
            async with self._http(headers, MAX_TASK_BYTES) as http:
                client = await self._client(msg.url, headers, http)
                try:
                    await self._save(
                        RemoteTaskRow(msg.session, msg.parent, msg.url, msg.context_id)
                    )
                    ended, cancel = await self._run(follow, client)
                except asyncio.CancelledError:
                    await self._cancel_remote(client, await self._late_id(follow), msg.url)
                    raise
                if cancel:  # it asked for input: nobody will give it
                    await self._cancel_remote(client, follow.task_id, msg.url)
        except asyncio.CancelledError:
            ended = None  # nobody waits: the child was cancelled (or the runtime stops)
        except KeyError as exc:
            what = f"the environment variable {exc.args[0]} is not set (headers_env)"
            ended = RemoteTaskEnded(msg.session, False, detail=remote_reason(msg.url, what))
        except Exception as exc:
            ended = RemoteTaskEnded(msg.session, False, detail=remote_reason(msg.url, _what(exc)))
        finally:
            if self._follows.get(msg.session) is follow:
                del self._follows[msg.session]
            self._drop(msg.session)
        if ended is not None and not follow.cancelled:
            self.directory.tell(msg.reply_to, ended)

    async def _run(self, follow: _Follow, client: Any) -> tuple[RemoteTaskEnded, bool]:
        """Send the task and poll it until it ends; returns how it ended and whether the
        remote task must be cancelled (it waits for input)."""
        msg = follow.msg
        message = Message(
            message_id=str(uuid.uuid4()),
            context_id=msg.context_id,
            role=Role.ROLE_USER,
            parts=[Part(text=msg.text)],
        )
        request = SendMessageRequest(
            message=message, configuration=SendMessageConfiguration(return_immediately=True)
        )
        # Shielded: a cancel during the send lets it finish (see _late_id), or the remote
        # task it starts would run on with nobody to cancel it.
        follow.sending = asyncio.ensure_future(self._send(client, request))
        first = await asyncio.shield(follow.sending)
        if first is None or first.HasField("message"):
            # A plain message answers at once: no task to follow.
            parts = MessageToDict(first.message).get("parts") if first is not None else None
            text = parts_text(parts)[: self.result_cap]
            return RemoteTaskEnded(msg.session, True, text=text), False
        task = first.task
        if not task.id:
            raise RemoteRefused("it answered a task without an id")
        follow.task_id = task.id
        self.directory.tell(msg.reply_to, RemoteTaskStarted(msg.session, task.id))
        await self._save(RemoteTaskRow(msg.session, msg.parent, msg.url, msg.context_id, task.id))
        wait = _POLL_FIRST_S
        while True:
            step = task_step(MessageToDict(task), self.result_cap)
            if step.done:
                if step.completed:
                    return RemoteTaskEnded(msg.session, True, text=step.text), False
                detail = remote_reason(msg.url, f"task {task.id[:80]} {step.what}")
                return RemoteTaskEnded(msg.session, False, detail=detail), step.cancel
            await asyncio.sleep(wait)
            wait = min(wait * 2, _POLL_MAX_S)
            task = await client.get_task(GetTaskRequest(id=follow.task_id))
            if task.id != follow.task_id:
                raise RemoteRefused(f"GetTask {follow.task_id[:80]} answered another task")

    @staticmethod
    async def _send(client: Any, request: SendMessageRequest) -> Any:
        """The first answer to ``request`` (the task, or a message), or None."""
        stream = client.send_message(request)
        try:
            async for event in stream:
                return event
            return None
        finally:
            await stream.aclose()

    @staticmethod
    async def _late_id(follow: _Follow) -> str:
        """The remote task's id, for its cancel. A cancel that came while the task was being
        sent waits for the send's answer (at most a few seconds): the remote may have started
        the task already, and only that answer names it."""
        if follow.task_id or follow.sending is None:
            return follow.task_id
        try:
            first = await asyncio.wait_for(follow.sending, _CANCEL_S)
        except Exception:  # it failed or took too long: no task to name
            return ""
        if first is not None and first.HasField("task"):
            return str(first.task.id)
        return ""

    async def _cancel_remote(self, client: Any, task_id: str, url: str) -> None:
        """``CancelTask`` for ``task_id`` (none: nothing), best effort, at most a few seconds."""
        if not task_id:
            return
        try:
            await asyncio.wait_for(client.cancel_task(CancelTaskRequest(id=task_id)), _CANCEL_S)
        except Exception as exc:
            log.info("a2a: cancelling task %s at %s: %s", task_id[:80], url, _what(exc))

    async def _orphans(self, rows: tuple[RemoteTaskRow, ...]) -> None:
        await asyncio.gather(*(self._orphan(row) for row in rows), return_exceptions=True)

    async def _orphan(self, row: RemoteTaskRow) -> None:
        """Cancel one cut-off child's remote task (by id, else every open task of its
        context) and drop its row."""
        try:
            headers = self._headers(row.url)
            async with self._http(headers, MAX_TASK_BYTES) as http:
                client = await self._client(row.url, headers, http)
                ids = [row.task_id] if row.task_id else []
                if not ids:
                    page = await client.list_tasks(ListTasksRequest(context_id=row.context_id))
                    ids = [t.id for t in page.tasks if t.context_id == row.context_id]
                for task_id in ids:
                    await self._cancel_remote(client, task_id, row.url)
        except Exception as exc:
            log.warning(
                "a2a: the remote task of %s (cut off by a crash) at %s was not cancelled: %s",
                row.child,
                row.url,
                _what(exc),
            )
        finally:
            self._drop(row.child)
