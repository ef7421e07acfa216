"""The A2A endpoint on the service: the agent card, the JSON-RPC route, and the checks a
message passes before the executor runs.

Mounted under ``/a2a`` (:func:`mount_a2a`): ``GET /a2a/.well-known/agent-card.json`` (public:
the gate lets it through without the token) and ``POST /a2a/`` (JSON-RPC, the token's). Every
POST body passes the bounded decode (:class:`BoundedDoor`) before the SDK parses it. The
request's builder (:class:`_Checks`) refuses what must never start or change a task, with the
SDK's invalid-params error naming it: a ``contextId`` that is no session of a top-level turn, an
unknown ``metadata.skill``, a busy session, and in ``INPUT_REQUIRED`` anything but a decision on
a call that is due (refused there, the task stays waiting: an error inside the executor would
fail it).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import msgspec
from a2a.server.agent_execution import RequestContext, SimpleRequestContextBuilder
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import create_jsonrpc_routes
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    CancelTaskRequest,
    SendMessageRequest,
    Task,
    TaskState,
)
from a2a.utils.errors import InvalidParamsError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route, Router

from actors.core.bounded import OutOfBounds, decode_json
from actors.core.config import Config
from actors.core.dispatch import descends_from
from actors.shells.service.a2a.executor import (
    LoopdExecutor,
    data_of,
    metadata_of,
    text_of,
)
from actors.shells.service.a2a.mapping import (
    INPUT_REQUIRED,
    TERMINAL,
    Refused,
    context_number,
    context_session,
    decision_of,
    skill_of,
)
from actors.shells.service.a2a.store import LoopdTaskStore
from messages import check_text

__all__ = ["CARD_PATH", "PREFIX", "BoundedDoor", "agent_card", "mount_a2a"]

PREFIX = "/a2a"
CARD_PATH = "/.well-known/agent-card.json"


def _version() -> str:
    try:
        return version("loopd")
    except PackageNotFoundError:  # a checkout on PYTHONPATH, not installed
        return "0"


def agent_card(config: Config, url: str) -> AgentCard:
    """The card: ``[a2a] name`` / ``description`` (default: the system prompt's first line),
    one skill per agent profile (``default`` for the plain agent), streaming, and one JSON-RPC
    interface at ``url``."""
    description = config.a2a.description
    if description is None:
        description = (
            config.loop.system_prompt.strip().splitlines()[0]
            if (config.loop.system_prompt.strip())
            else "a loopd agent"
        )
    skills = []
    for name in config.agent_names():
        profile = config.agent(name)
        skills.append(
            AgentSkill(
                id=name,
                name=name,
                description=profile.description
                or ("the plain agent" if name == "default" else f"the agent profile {name}"),
                tags=["loopd"],
            )
        )
    return AgentCard(
        name=config.a2a.name,
        description=description,
        version=_version(),
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["text/plain", "application/json"],
        skills=skills,
    )


def _rpc_error(code: int, text: str, status: int = 200) -> Response:
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": text}}
    return Response(msgspec.json.encode(body), status, media_type="application/json")


class BoundedDoor:
    """ASGI: a POST body is read (at most ``cap`` bytes: 413 past it) and passes the bounded
    decode (size, depth, int64, valid Unicode) before the SDK sees it; a refusal is a JSON-RPC
    error naming what was wrong (-32700 for text that is not JSON, -32600 for a bound)."""

    def __init__(self, app: Any, cap: int) -> None:
        self.app = app
        self.cap = cap

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body = b""
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = bool(message.get("more_body", False))
            if len(body) > self.cap:
                text = f"the request is over the cap of {self.cap} bytes"
                await _rpc_error(-32600, text, 413)(scope, receive, send)
                return
        try:
            decode_json(body, max_bytes=self.cap)
        except OutOfBounds as exc:
            detail = exc.detail.removeprefix("not valid JSON: ")
            if detail is not exc.detail:
                response = _rpc_error(-32700, f"the request is not valid JSON: {detail}")
            else:
                response = _rpc_error(-32600, f"the request is out of bounds: {exc.detail}")
            await response(scope, receive, send)
            return
        sent = False

        async def replay() -> Any:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class _Checks(SimpleRequestContextBuilder):
    """The request's builder: the refusals of the module's docstring, and the session a new
    context gets (``a2a-<n>``)."""

    def __init__(
        self, config: Config, executor: LoopdExecutor, store: LoopdTaskStore, state: Any, n: int
    ) -> None:
        super().__init__()
        self.config = config
        self.executor = executor
        self.store = store
        self.state = state
        self._numbers = itertools.count(n + 1)

    async def build(
        self,
        context: ServerCallContext,
        params: SendMessageRequest | None = None,
        task_id: str | None = None,
        context_id: str | None = None,
        task: Task | None = None,
    ) -> RequestContext:
        """The SDK's context, once the message has passed the checks."""
        if params is not None:
            try:
                context_id = await self._check(context, params, task_id, context_id)
            except Refused as exc:
                raise InvalidParamsError(message=str(exc)) from None
        return await super().build(context, params, task_id, context_id, task)

    async def _check(
        self,
        context: ServerCallContext,
        params: SendMessageRequest,
        task_id: str | None,
        context_id: str | None,
    ) -> str | None:
        message = params.message
        if task_id:
            stored = await self.store.get(task_id, context)
            if stored is None:
                return context_id  # the SDK answers: no such task
            state = TaskState.Name(stored.status.state)
            if state == INPUT_REQUIRED:
                due = await self.executor.due(task_id, stored.context_id)
                decision_of(data_of(message), due)
            elif state not in TERMINAL:
                raise Refused(
                    f"task {task_id} is working: it takes a message only while it waits for "
                    "input (INPUT_REQUIRED); send a new message in its context for a new turn"
                )
            return stored.context_id
        session = context_session(context_id, 0 if context_id else next(self._numbers))
        skill_of(metadata_of(message), self.config.agent_names())
        try:
            check_text(text_of(message), "the message's text")
        except (TypeError, ValueError) as exc:
            raise Refused(str(exc)) from None
        if not text_of(message).strip():
            raise Refused("the message has no text part: a turn starts with a text")
        running = self.executor.busy(session)
        if running is not None:
            raise Refused(f"session {session} is busy: task {running} is running its turn")
        status = await asyncio.to_thread(self.state.status)
        if status is not None and session in status.held:
            raise Refused(
                f"session {session} is busy: a turn not started over A2A is running on it"
            )
        return session


class _Handler(DefaultRequestHandler):
    """The SDK's handler; ``CancelTask`` of a task no executor runs here (one that waits for
    input since before a restart) also cancels its session's family."""

    def __init__(
        self,
        executor: LoopdExecutor,
        store: LoopdTaskStore,
        card: AgentCard,
        runtime: Any,
        checks: _Checks,
    ) -> None:
        super().__init__(executor, store, card, request_context_builder=checks)
        self._runtime = runtime
        self._store = store

    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Any:
        """Cancel the task (the SDK's way), and the turn of its session."""
        stored = await self._store.get(params.id, context)
        result = await super().on_cancel_task(params, context)
        if stored is not None and TaskState.Name(stored.status.state) not in TERMINAL:
            with contextlib.suppress(RuntimeError, ValueError):
                await self._runtime.cancel(stored.context_id)
        return result


def _answer_of(state: Any) -> Callable[[str], str]:
    def answer(session: str) -> str:
        store = state.store()
        try:
            history = store.history(session)
        finally:
            store.close()
        for stored in reversed(history):
            if stored.message.role == "assistant" and stored.message.content:
                return str(stored.message.content)
        return ""

    return answer


def mount_a2a(app: Starlette, state: Any) -> Callable[[], Awaitable[None]]:
    """Mount the endpoint under ``/a2a`` on ``app`` (the service's, over ``state``); returns
    the coroutine function that closes it (on the service's loop, as it stops)."""
    runtime = state.runtime
    config: Config = runtime.runtime.config
    store = LoopdTaskStore(config)
    pending = runtime.runtime.pending_approvals()  # at start: no actor waits on this thread

    def waiting(session: str) -> bool:
        return any(r.session == session or descends_from(r.session, session) for r in pending)

    store.sweep(waiting)
    listing = state.store()
    try:
        sessions = [info.id for info in listing.list_sessions()]
    finally:
        listing.close()
    contexts = [row.context for row in store.rows()]
    executor = LoopdExecutor(runtime, _answer_of(state))
    card = agent_card(config, "http://localhost/a2a/")
    checks = _Checks(config, executor, store, state, context_number(sessions + contexts))
    handler = _Handler(executor, store, card, runtime, checks)

    async def get_card(request: Request) -> Response:
        host = request.headers.get("host", "localhost")
        url = f"{request.url.scheme}://{host}{PREFIX}/"
        return JSONResponse(agent_card_to_dict(agent_card(config, url)))

    routes = [
        Route(CARD_PATH, get_card, methods=["GET"]),
        *create_jsonrpc_routes(handler, "/"),
    ]
    door = BoundedDoor(Router(routes=routes), state.settings.max_body_bytes)
    app.router.routes.append(Mount(PREFIX, app=door))

    async def close() -> None:
        await handler.aclose()
        await asyncio.to_thread(store.close)

    return close
