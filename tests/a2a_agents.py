"""Real A2A agents for the calling-out tests, built with the SDK, served by a real uvicorn.

One server on a free port of 127.0.0.1 serves each agent under its own prefix (its card at
``/<name>/.well-known/agent-card.json``, its JSON-RPC interface at ``/<name>/``):

- ``echo`` completes with the artifact ``echo: <text>``;
- ``slow`` works until cancelled (or ``SLOW_S``), and records the id of each task cancelled;
- ``fail`` fails with the status ``it broke``;
- ``ask`` asks for input (``which one?``);
- ``late`` is ``slow``, but answers ``SendMessage`` only ``LATE_S`` after its task started
  (its first event comes late): a cancel can come before the caller knows the task's id;
- ``data`` completes with a data part ``{"n": 3, "ok": true}``;
- ``secret`` is ``echo`` behind a required header ``X-Key: sekret`` (401 without it);
- ``hostile`` serves whatever ``HOSTILE`` holds as raw bytes: a card at ``/hostile/card`` and
  a JSON-RPC answer at ``/hostile/rpc`` (a plain HTTP server: no SDK in it), or drips, floods
  or never answers there.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Any

import uvicorn
from a2a.helpers.proto_helpers import new_data_part, new_task, new_text_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Role,
    TaskState,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route

SLOW_S = 60.0
"""How long the slow agent works when nobody cancels it."""

LATE_S = 1.0
"""How long the late agent holds its first event (the answer to ``SendMessage``)."""

AGENTS = ("echo", "slow", "late", "fail", "ask", "data", "secret")


class Recorder:
    """What the agents saw: tasks started and cancelled, headers of the secret agent."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        """Held to change or read the lists; notified at every change."""
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.texts: list[str] = []

    def wait_cancelled(self, task_id: str | None = None, timeout: float = 20.0) -> str:
        with self.lock:
            hits: list[str] = []

            def seen() -> bool:
                hits[:] = [t for t in self.cancelled if task_id is None or t == task_id]
                return bool(hits)

            if not self.lock.wait_for(seen, timeout):
                raise AssertionError(f"no cancel of {task_id or 'any task'} within {timeout} s")
            return hits[0]

    def wait_started(self, timeout: float = 20.0, after: int = 0) -> str:
        """The id of the task started after the first ``after`` ones."""
        with self.lock:
            if not self.lock.wait_for(lambda: len(self.started) > after, timeout):
                raise AssertionError(f"no task started within {timeout} s")
            return self.started[after]


class Agent(AgentExecutor):
    """One of the test agents, by ``kind``."""

    def __init__(self, kind: str, recorder: Recorder) -> None:
        self.kind = kind
        self.recorder = recorder
        self.stops: dict[str, asyncio.Event] = {}

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id, context_id = context.task_id or "", context.context_id or ""
        text = context.get_user_input()
        message = context.message
        history = [message] if message is not None else []
        if self.kind == "late":
            with self.recorder.lock:
                self.recorder.started.append(task_id)
                self.recorder.lock.notify_all()
            await asyncio.sleep(LATE_S)
        task = new_task(task_id, context_id, TaskState.TASK_STATE_SUBMITTED, history=history)
        await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task_id, context_id)
        with self.recorder.lock:
            if self.kind != "late":
                self.recorder.started.append(task_id)
            self.recorder.texts.append(text)
            self.recorder.lock.notify_all()
        await updater.start_work()
        kind = self.kind
        if kind in ("echo", "secret"):
            await updater.add_artifact([new_text_part(f"echo: {text}")])
            await updater.complete()
        elif kind == "data":
            await updater.add_artifact([new_data_part({"n": 3, "ok": True})])
            await updater.complete()
        elif kind == "fail":
            await updater.failed(self._said("it broke", task_id, context_id))
        elif kind == "ask":
            await updater.requires_input(self._said("which one?", task_id, context_id))
        elif kind in ("slow", "late"):
            stop = self.stops.setdefault(task_id, asyncio.Event())
            try:
                await asyncio.wait_for(stop.wait(), SLOW_S)
            except TimeoutError:
                await updater.complete()

    @staticmethod
    def _said(text: str, task_id: str, context_id: str) -> Any:
        return new_text_message(text, context_id=context_id, task_id=task_id, role=Role.ROLE_AGENT)

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id = context.task_id or ""
        with self.recorder.lock:
            self.recorder.cancelled.append(task_id)
            self.recorder.lock.notify_all()
        self.stops.setdefault(task_id, asyncio.Event()).set()
        updater = TaskUpdater(event_queue, task_id, context.context_id or "")
        await updater.cancel()


def card(base: str, name: str) -> AgentCard:
    """The 1.0 card of agent ``name`` served at ``base``."""
    interface = AgentInterface(
        url=f"{base}/{name}/", protocol_binding="JSONRPC", protocol_version="1.0"
    )
    return AgentCard(
        name=name,
        description=f"the {name} agent",
        version="1.0.0",
        supported_interfaces=[interface],
        capabilities=AgentCapabilities(streaming=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id=name, name=name, description=f"the {name} agent", tags=["test"])],
    )


class Hostile:
    """What the hostile prefix serves: raw bytes for its card and for every JSON-RPC call, or
    a peer's misbehaviour for either (``card_peer``, ``rpc_peer``): ``"drip"`` (a JSON answer
    one byte every 0.2 s, never ending), ``"flood"`` (50 MB of it, as fast as it goes, with no
    length) or ``"never"`` (no answer at all, until the caller goes)."""

    def __init__(self) -> None:
        self.card: bytes = b"{}"
        self.rpc: bytes = b"{}"
        self.card_peer: str | None = None
        self.rpc_peer: str | None = None


FLOOD_BYTES = 50 * 1024 * 1024
"""How much a flooding peer sends."""


async def misbehave(request: Request, peer: str) -> Response:
    """The answer of a peer that drips, floods or never answers."""
    if peer == "never":
        deadline = time.monotonic() + SLOW_S
        while time.monotonic() < deadline and not await request.is_disconnected():
            await asyncio.sleep(0.05)
        return Response(b"{}", media_type="application/json")

    async def drip() -> Any:
        yield b'{"jsonrpc": "2.0", "result": "'
        while True:
            await asyncio.sleep(0.2)
            yield b"x"

    async def flood() -> Any:
        chunk = b" " * (1024 * 1024)
        yield b'{"jsonrpc": "2.0", "result": "'
        for _ in range(FLOOD_BYTES // len(chunk)):
            yield chunk
        yield b'"}'

    body = drip() if peer == "drip" else flood()
    return StreamingResponse(body, media_type="application/json")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class A2aAgents:
    """The server of every test agent; ``url(name)`` is an agent's ``a2a_url``."""

    def __init__(self) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.recorder = Recorder()
        self.hostile = Hostile()
        self.headers_seen: list[str | None] = []
        routes: list[Any] = []
        for name in AGENTS:
            agent_card = card(self.base, name)
            handler = DefaultRequestHandler(
                Agent(name, self.recorder), InMemoryTaskStore(), agent_card
            )
            inner = [
                *create_agent_card_routes(agent_card),
                *create_jsonrpc_routes(handler, rpc_url="/"),
            ]
            app = Starlette(routes=inner)
            routes.append(Mount(f"/{name}", app=self._guard(app) if name == "secret" else app))
        routes += [
            Route("/hostile/.well-known/agent-card.json", self._card),
            Route("/hostile/", self._rpc, methods=["POST"]),
            Route("/junk/.well-known/agent-card.json", self._junk),
            Route("/old/.well-known/agent-card.json", self._old),
        ]
        self.app = Starlette(routes=routes)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the A2A test server did not start")
            time.sleep(0.01)

    def url(self, name: str) -> str:
        return f"{self.base}/{name}"

    def _guard(self, app: Any) -> Any:
        seen = self.headers_seen

        async def guarded(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                headers = dict(scope["headers"])
                key = headers.get(b"x-key")
                seen.append(key.decode() if key is not None else None)
                if key != b"sekret":
                    await Response("no key", status_code=401)(scope, receive, send)
                    return
            await app(scope, receive, send)

        return guarded

    async def _card(self, request: Request) -> Response:
        if self.hostile.card_peer is not None:
            return await misbehave(request, self.hostile.card_peer)
        return Response(self.hostile.card, media_type="application/json")

    async def _rpc(self, request: Request) -> Response:
        if self.hostile.rpc_peer is not None:
            return await misbehave(request, self.hostile.rpc_peer)
        body = await request.json()
        raw = self.hostile.rpc.replace(b'"$ID"', json.dumps(body.get("id")).encode())
        return Response(raw, media_type="application/json")

    async def _junk(self, request: Request) -> Response:
        return Response(b"<html>not a card</html>", media_type="text/html")

    async def _old(self, request: Request) -> Response:
        old = {
            "name": "old",
            "url": f"{self.base}/old/",
            "protocolVersion": "0.3.0",
            "preferredTransport": "JSONRPC",
            "capabilities": {},
            "skills": [],
        }
        return JSONResponse(old)

    def hostile_card(self) -> bytes:
        """A valid 1.0 card of the hostile prefix (its RPC answers what ``hostile.rpc`` is)."""
        return json.dumps(
            {
                "name": "hostile",
                "description": "hostile",
                "version": "1",
                "supportedInterfaces": [
                    {
                        "url": f"{self.base}/hostile/",
                        "protocolBinding": "JSONRPC",
                        "protocolVersion": "1.0",
                    }
                ],
                "capabilities": {},
                "defaultInputModes": ["text/plain"],
                "defaultOutputModes": ["text/plain"],
                "skills": [],
            }
        ).encode()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
