"""The service's HTTP API: a Starlette app over a running :class:`~actors.aio.AsyncRuntime`.

JSON in and out. Outcomes and events are the ``messages`` Structs' own JSON; an error is
``{"error": text}`` with the text the Python API would raise (400 for a bad id, text or body,
404 for an unknown session, 409 for a decision on a call that is not waiting, 413 for a body
over the cap, 503 while the service stops). Nothing
here blocks the loop: the few calls that wait for an actor or read the store run in a worker
thread, and a turn's outcome comes back through a mailbox that resolves a future on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from actors.aio import AsyncRuntime
from actors.core.approvals import decision_text
from actors.core.bounded import OutOfBounds, decode_json
from actors.core.listen import is_loopback
from actors.core.usage import total_usage
from actors.shells.service.auth import Gate
from actors.shells.service.events import EventHub, Subscriber
from actors.shells.service.openapi import openapi_document
from actors.shells.service.settings import ServiceSettings
from actors.shells.views import (
    session_backend,
    session_listing,
    stored_state,
    turn_outputs,
    turn_usage,
    typed_wrapped,
)
from actors.stores.base import SessionNotFound, StoreBackend, StoreError
from actors.stores.open import open_store
from actors.stores.reader import StoreReader
from actors.stores.sqlite import DB_NAME
from messages import (
    ApprovalSettled,
    ContextStatus,
    FailReason,
    Inspect,
    TurnFailed,
    TurnOutcome,
    check_session_id,
    check_text,
    check_top_level_session,
)

__all__ = ["KEEPALIVE_S", "DecisionBody", "ServiceState", "TurnBody", "create_app"]

KEEPALIVE_S = 15.0
"""Seconds of silence after which an event stream sends a comment line (proxies keep it open,
and a client that went away is noticed)."""

WRITE_S = 10.0
"""How long one write to an event client may wait for it to take data (past the socket's
buffers) before its stream is cut: a stalled client holds nothing up, not even a stop."""


class TurnBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The body of ``POST /v1/sessions/{id}/turns``."""

    text: str
    speaker: str | None = None
    agent: str | None = None
    wait: bool = True
    cancel_on_disconnect: bool = False
    """With ``wait``: a client that goes away before the answer cancels the turn (and its
    children); without, the turn goes on and is stored."""
    output_schema: dict[str, Any] | None = None
    """A JSON schema: the turn is typed (as ``run_turn(output=...)``), its outcome's ``output``
    the validated value. A stored session keeps the schema it was created with."""


class DecisionBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The body of ``POST /v1/approvals/{session}/{call_id}``: yes (with an optional ``note``
    kept with the decision) or no (with the ``reason`` the model reads)."""

    approve: bool
    note: str | None = None
    reason: str | None = None


class _Refused(Exception):
    """An answer other than 200: ``status`` and the error's text."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


def _json(value: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(value), status, media_type="application/json")


def _error(status: int, text: str) -> Response:
    return _json({"error": text}, status)


class ServiceState:
    """What the app's handlers share: the runtime, the settings, the event hub, and the turns
    waited on (answered ``CANCELLED`` by :meth:`finish` if the runtime never answers them)."""

    def __init__(self, runtime: AsyncRuntime, settings: ServiceSettings) -> None:
        self.runtime = runtime
        self.settings = settings
        self.hub = EventHub(settings.replay_events, settings.client_queue)
        self.waiting: dict[asyncio.Future[Any], str] = {}
        self.stopping = False
        self.closers: list[Callable[[], Awaitable[None]]] = []
        """What the app's lifespan awaits as it ends (a mounted endpoint's close)."""

    def finish(self) -> None:
        """On the loop, when the runtime has stopped: every event stream ends, and a turn the
        runtime left unanswered is answered ``TurnFailed(CANCELLED)``."""
        self.stopping = True
        self.hub.close()
        for future, session in list(self.waiting.items()):
            if not future.done():
                future.set_result(
                    TurnFailed(
                        session, FailReason.CANCELLED, "the service stopped before the turn ended"
                    )
                )

    def store(self) -> StoreBackend:
        """A store to read from (in a worker thread): read-only for SQLite."""
        config = self.runtime.runtime.config
        if config.store.url is not None:
            return open_store(config)
        return StoreReader(config.home_path / DB_NAME)

    def status(self) -> ContextStatus | None:
        """The Context's held and live ids (in a worker thread); None once it has stopped."""
        try:
            answer: ContextStatus = self.runtime.context.ask(Inspect(), block=True, timeout=5)
        except Exception:  # stopped or stopping: no session is running any more
            return None
        return answer


BODY_DEADLINE_S = 30.0
"""Seconds a request body may take to arrive whole: a client that drips one holds its
connection, never the loop, and is answered 408 past this."""


async def _body(request: Request, cap: int) -> bytes:
    """The request body, at most ``cap`` bytes (413 past that, before reading it all), whole
    within :data:`BODY_DEADLINE_S` (408 past that)."""
    try:
        async with asyncio.timeout(BODY_DEADLINE_S):
            return await _read_body(request, cap)
    except TimeoutError:
        raise _Refused(408, f"the body did not arrive within {BODY_DEADLINE_S:g} s") from None


async def _read_body(request: Request, cap: int) -> bytes:
    """Read from the ASGI ``receive`` itself, not ``request.stream()``: its async generator and
    the copy of the headers that ``request.headers`` makes were a good part of a turn's
    handler."""
    length = _header(request.scope, b"content-length")
    if length is not None:
        if not (length.isascii() and length.isdigit()):
            raise _Refused(400, f"the Content-Length header is not a number: {length[:40]!r}")
        if int(length) > cap:
            raise _Refused(413, f"the body is over the cap of {cap} bytes")
    data = b""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk: bytes = message.get("body", b"")
        data += chunk
        if len(data) > cap:
            raise _Refused(413, f"the body is over the cap of {cap} bytes")
        if not message.get("more_body", False):
            return data


def _header(scope: Any, name: bytes) -> str | None:
    """The first value of the request header ``name`` (lower case), or None."""
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def _json_object(data: bytes, *, empty_ok: bool = False) -> dict[str, Any]:
    """A request body through the bounded decode (the body cap was kept while reading it):
    400 naming what is wrong (a bound, a lone surrogate, the JSON error), or the object."""
    if empty_ok and not data.strip():
        return {}
    try:
        value = decode_json(data, max_bytes=max(len(data), 1))
    except OutOfBounds as exc:
        detail = exc.detail.removeprefix("not valid JSON: ")
        if detail is exc.detail:
            raise _Refused(400, f"the body is out of bounds: {detail}") from None
        raise _Refused(400, f"the body is not valid JSON: {detail}") from None
    if not isinstance(value, dict):
        raise _Refused(400, f"the body must be a JSON object, not {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def _session(request: Request, *, top_level: bool = False) -> str:
    raw = request.path_params["id"]
    try:
        return check_top_level_session(raw) if top_level else check_session_id(raw)
    except ValueError as exc:
        raise _Refused(400, str(exc)) from None


def _state(request: Request) -> ServiceState:
    state: ServiceState = request.app.state.service
    return state


def _turn_body(data: bytes) -> TurnBody:
    """The body of a turn: through the bounded decode as every body (a fault named, 400),
    then checked as a :class:`TurnBody` (a field named, 400)."""
    try:
        return msgspec.convert(_json_object(data), TurnBody)
    except msgspec.ValidationError as exc:
        raise _Refused(400, f"the body: {exc}") from None


_REFUSED_TURNS = (FailReason.WRONG_AGENT, FailReason.WRONG_OUTPUT)
"""A turn's outcomes that answer 400: another agent, or another output schema, than the stored
session's."""


async def post_turn(request: Request) -> Response:
    """``POST /v1/sessions/{id}/turns``: run (or start) a turn."""
    state = _state(request)
    data = await _body(request, state.settings.max_body_bytes)
    session = _session(request, top_level=True)
    body = _turn_body(data)
    try:
        check_text(body.text, "the turn text")
        check_text(body.speaker, "the speaker", optional=True)
        check_text(body.agent, "the agent", optional=True)
    except (TypeError, ValueError) as exc:
        raise _Refused(400, str(exc)) from None
    if state.stopping:
        raise _Refused(503, "the service is stopping: no new turns")
    runtime = state.runtime.runtime
    if not body.wait:
        _send(state, session, body, None)
        return _json({"session": session}, 202)
    loop = asyncio.get_running_loop()
    future: asyncio.Future[TurnOutcome] = loop.create_future()
    mailbox = state.runtime.future_mailbox(future)
    address = runtime.directory.unique("http")
    runtime.directory.register(address, mailbox)
    state.waiting[future] = session
    try:
        _send(state, session, body, address)
        if body.cancel_on_disconnect:
            outcome = await _unless_gone(request, state, session, future)
        else:  # a client that goes away does not cancel the turn: it goes on, and is stored
            outcome = await future
    finally:
        state.waiting.pop(future, None)
        runtime.directory.unregister(address, mailbox)
    if isinstance(outcome, TurnFailed) and outcome.reason in _REFUSED_TURNS:
        raise _Refused(400, outcome.detail)  # what Runtime.run_turn raises as ValueError
    return Response(msgspec.json.encode(outcome), 200, media_type="application/json")


async def _unless_gone(
    request: Request, state: ServiceState, session: str, future: asyncio.Future[TurnOutcome]
) -> TurnOutcome:
    """The turn's outcome; if the client goes away first, the turn is cancelled (its outcome,
    ``CANCELLED``, is then what nobody reads)."""

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.create_task(gone())
    either: set[asyncio.Future[Any]] = {future, watcher}
    try:
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not future.done():
        with contextlib.suppress(RuntimeError):  # the runtime stopped meanwhile
            await state.runtime.cancel(session)
        return await future
    return future.result()


def _send(state: ServiceState, session: str, body: TurnBody, reply_to: str | None) -> None:
    try:
        state.runtime.runtime.send_turn(
            session,
            body.text,
            speaker=body.speaker,
            reply_to=reply_to,
            agent=body.agent,
            output=body.output_schema,
        )
    except (TypeError, ValueError) as exc:
        raise _Refused(400, str(exc)) from None
    except RuntimeError as exc:  # the runtime stopped under the request
        raise _Refused(503, f"the service is stopping: {exc}") from None


async def post_cancel(request: Request) -> Response:
    """``POST /v1/sessions/{id}/cancel``: cancel the session's turn and its descendants'."""
    state = _state(request)
    _json_object(await _body(request, state.settings.max_body_bytes), empty_ok=True)
    session = _session(request)
    try:
        cancelled = await state.runtime.cancel(session)
    except RuntimeError as exc:
        raise _Refused(503, f"the service is stopping: {exc}") from None
    return _json({"cancelled": list(cancelled)})


def _list_sessions(state: ServiceState, known: dict[str, tuple[str, bool]]) -> dict[str, Any]:
    status = state.status()
    running = frozenset(status.held) if status is not None else frozenset()
    store = state.store()
    try:
        rows = session_listing(store, state.runtime.runtime.config, running=running, known=known)
    finally:
        store.close()
    stored = {r["session"] for r in rows}
    if status is not None:  # a session being opened is held before the store has it
        for session in sorted((set(status.held) | set(status.live)) - stored):
            shown, background = known.get(session, ("running", False))
            rows.append({"session": session, "state": shown, "background": background})
    return {"sessions": rows}


async def get_sessions(request: Request) -> Response:
    """``GET /v1/sessions``: every stored session, and each one's state."""
    state = _state(request)
    known = state.hub.states.known()  # read on the loop, where the events update it
    return _json(await asyncio.to_thread(_list_sessions, state, known))


def _show_session(
    state: ServiceState, session: str, known: tuple[str, bool] | None
) -> dict[str, Any]:
    config = state.runtime.runtime.config
    store = state.store()
    try:
        record = store.open(session)
        children = store.children(session)
        turns = turn_usage(store, session)
        history = store.history(session)
        waiting = any(
            a.request.session == session and a.approved is None for a in store.approvals()
        )
    finally:
        store.close()
    outputs = turn_outputs(history, typed_wrapped(record))
    if known is None:
        status = state.status()
        held = status is not None and session in status.held
        shown = "waiting" if waiting else "running" if held else None
        known = (shown or stored_state(record.turns, history), False)
    return {
        "session": record.id,
        "agent": record.agent,
        "parent": record.parent,
        "state": known[0],
        "background": known[1],
        "slot": record.slot,
        "backend": session_backend(record.agent, config),
        "turns": record.turns,
        "untrusted": record.untrusted,
        "next_call_id": record.next_call_id,
        "children": children,
        "usage": total_usage(own for own, _ in turns),
        "usage_with_children": total_usage(every for _, every in turns),
        "turn_usage": [
            {"usage": own, "usage_with_children": every, "output": output}
            for (own, every), output in zip(turns, outputs, strict=False)
        ],
        # The latest turn's validated output (a typed session's), null for a text turn.
        "output": outputs[-1] if outputs else None,
        "tools": [{"name": t.name, "description": t.description} for t in record.baseline.tools],
        "transcript": record.transcript,
        # Every stored message, those a compaction replaced included (marked), numbered.
        "history": history,
    }


async def get_session(request: Request) -> Response:
    """``GET /v1/sessions/{id}``: one stored session, its children and its transcript."""
    session = _session(request)
    state = _state(request)
    known = state.hub.states.of(session)
    try:
        shown = await asyncio.to_thread(_show_session, state, session, known)
    except SessionNotFound as exc:
        raise _Refused(404, str(exc)) from None
    return _json(shown)


async def get_approvals(request: Request) -> Response:
    """``GET /v1/approvals``: the calls waiting for a person, oldest ``at`` first."""
    try:
        waiting = await _state(request).runtime.pending_approvals()
    except (RuntimeError, TimeoutError) as exc:  # stopped, or the Context did not answer
        raise _Refused(503, f"the service is stopping: {str(exc) or 'no answer in time'}") from None
    return _json({"approvals": waiting})


def _call_id(raw: str) -> int:
    """The path's call id: a whole number from 1 (400 naming it otherwise)."""
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 18 and int(raw) >= 1):
        raise _Refused(400, f"invalid call id {raw[:40]!r}: it must be a whole number from 1")
    return int(raw)


def _decision(data: bytes) -> DecisionBody:
    """The body of a decision, checked: ``approve`` a boolean, a decline with a reason."""
    try:
        body = msgspec.convert(_json_object(data), DecisionBody)
    except msgspec.ValidationError as exc:
        raise _Refused(400, f"the body: {exc}") from None
    try:  # the checks of Runtime.approve / deny: valid Unicode, at most MAX_DECISION_CHARS
        if body.note is not None:
            decision_text(body.note, "the note")
        reason = "" if body.reason is None else decision_text(body.reason, "the reason")
    except (TypeError, ValueError) as exc:
        raise _Refused(400, str(exc)) from None
    if not body.approve and not reason.strip():  # blank once neutralised is no reason either
        raise _Refused(400, 'a decline needs a "reason" (the model reads it)')
    return body


async def post_decision(request: Request) -> Response:
    """``POST /v1/approvals/{session}/{call_id}``: approve or decline a waiting call; 200 with
    the ``ApprovalSettled``, 409 with the ``ApprovalRefused`` if it is not waiting."""
    state = _state(request)
    data = await _body(request, state.settings.max_body_bytes)
    try:
        session = check_session_id(request.path_params["session"])
    except ValueError as exc:
        raise _Refused(400, str(exc)) from None
    call_id = _call_id(request.path_params["call_id"])
    body = _decision(data)
    runtime = state.runtime
    try:
        if body.approve:
            answer = await runtime.approve(session, call_id, body.note)
        else:
            answer = await runtime.deny(session, call_id, body.reason or "")
    except (TypeError, ValueError) as exc:  # what the runtime's own door refuses
        raise _Refused(400, str(exc)) from None
    except (RuntimeError, TimeoutError) as exc:  # stopped, or the Context did not answer
        raise _Refused(503, f"the service is stopping: {str(exc) or 'no answer in time'}") from None
    return _json(answer, 200 if isinstance(answer, ApprovalSettled) else 409)


class _EventStream(Response):
    """``text/event-stream`` of one :class:`Subscriber`'s frames until it ends."""

    def __init__(self, client: Subscriber) -> None:
        super().__init__(media_type="text/event-stream")
        self.client = client

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        client = self.client
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-store"),
            (b"x-accel-buffering", b"no"),  # a proxy must not hold the stream back
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            client.close()

        watcher = asyncio.create_task(watch())
        try:
            while (frames := await client.next_frames(KEEPALIVE_S)) is not None:
                chunk = b"".join(frames) if frames else b": keepalive\n\n"
                async with asyncio.timeout(WRITE_S):
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            async with asyncio.timeout(WRITE_S):
                await send({"type": "http.response.body", "body": b""})
        except TimeoutError:  # stalled: uvicorn closes the connection of an unfinished answer
            client.close()
        finally:
            watcher.cancel()
            client.close()


async def get_events(request: Request) -> Response:
    """``GET /v1/events[?session=ID]``: turn events as server-sent events."""
    state = _state(request)
    session = request.query_params.get("session")
    if session is not None:
        try:
            check_session_id(session)
        except ValueError as exc:
            raise _Refused(400, str(exc)) from None
    last: int | None = None
    header = request.headers.get("last-event-id")
    if header is not None and header.strip():
        text = header.strip()
        if not (text.isascii() and text.isdigit() and len(text) <= 18):
            raise _Refused(400, f"Last-Event-ID must be an event id (a number): {text[:40]!r}")
        last = int(text)
    if request.method == "HEAD":  # the head only: no client to feed
        return Response(status_code=200, media_type="text/event-stream")
    return _EventStream(state.hub.open(session, last))


async def get_health(request: Request) -> Response:
    """``GET /healthz``: 200 while the service runs, 503 once it stops."""
    if _state(request).stopping:
        return _json({"status": "stopping"}, 503)
    return _json({"status": "ok"})


async def get_openapi(request: Request) -> Response:
    """``GET /v1/openapi.json``: the API's OpenAPI document."""
    return _json(openapi_document())


def api_routes() -> list[BaseRoute]:
    """The routes of the API (the ones ``/v1/openapi.json`` describes)."""
    return [
        Route("/v1/sessions/{id}/turns", _Endpoint(post_turn), methods=["POST"]),
        Route("/v1/sessions/{id}/cancel", _Endpoint(post_cancel), methods=["POST"]),
        Route("/v1/sessions", _Endpoint(get_sessions), methods=["GET"]),
        Route("/v1/sessions/{id}", _Endpoint(get_session), methods=["GET"]),
        Route("/v1/events", _Endpoint(get_events), methods=["GET"]),
        Route("/v1/approvals", _Endpoint(get_approvals), methods=["GET"]),
        Route("/v1/approvals/{session}/{call_id}", _Endpoint(post_decision), methods=["POST"]),
        Route("/v1/openapi.json", get_openapi, methods=["GET"]),
        Route("/healthz", get_health, methods=["GET"]),
    ]


STATIC = Path(__file__).resolve().parent / "static"
"""The page's files (package data): index.html, app.js, tree.js, app.css."""

_PAGE_HEADERS = {
    # Only the page's own files run: no inline script, nothing from elsewhere.
    "content-security-policy": "default-src 'self'; frame-ancestors 'none'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


async def get_page(request: Request) -> Response:
    """``GET /``: the page (no token needed; it asks for one when the API answers 401)."""
    page = (STATIC / "index.html").read_bytes()
    return Response(page, 200, media_type="text/html; charset=utf-8", headers=_PAGE_HEADERS)


def page_routes() -> list[BaseRoute]:
    """The page and its static files (outside the API and its document)."""
    return [
        Route("/", get_page, methods=["GET"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]


class _Endpoint:
    """An API route's ASGI app: ``handler(request)``'s response, its refusals answered as JSON
    errors (a store that fails is 503).

    Starlette's ``Route`` runs a plain function through ``request_response``, which also wraps
    ``send`` to route an ``HTTPException`` raised in the handler; these handlers raise
    :class:`_Refused` instead, so a class (which ``Route`` takes as an ASGI app) skips that
    layer on every request.
    """

    def __init__(self, handler: Callable[[Request], Awaitable[Response]]) -> None:
        self.handler = handler
        self.__name__ = handler.__name__
        self.__doc__ = handler.__doc__

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        request = Request(scope, receive, send)
        try:
            response = await self.handler(request)
        except _Refused as refused:
            response = _error(refused.status, refused.text)
        except ClientDisconnect:  # gone while sending its body: nobody reads an answer
            response = _error(400, "the client went away before its body was read")
        except StoreError as exc:
            response = _error(503, f"the store could not be read: {exc}")
        await response(scope, receive, send)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return _error(exc.status_code, exc.detail)


def create_app(runtime: AsyncRuntime, settings: ServiceSettings) -> Starlette:
    """The service's app over ``runtime`` (already started; the app never stops it).

    The app's ``state.service`` is its :class:`ServiceState`; call its ``finish()`` on the
    app's loop once the runtime has stopped.
    """
    state = ServiceState(runtime, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.hub.attach(functools.partial(runtime.runtime.subscribe, inline=True))
        try:
            yield
        finally:
            state.finish()
            for close in state.closers:
                await close()

    app = _App(
        settings.token,
        is_loopback(settings.host),
        routes=api_routes() + page_routes(),
        exception_handlers={HTTPException: _http_error},
        lifespan=lifespan,
    )
    app.state.service = state
    return app


TURNS_PREFIX, TURNS_SUFFIX = "/v1/sessions/", "/turns"
"""The path of ``POST /v1/sessions/{id}/turns``, around its one parameter."""


class _TurnsFirst:
    """ASGI: ``POST /v1/sessions/{id}/turns`` straight to its endpoint, everything else to
    Starlette's stack (its error middleware, exception handlers and router).

    The turn route is most of the service's traffic, and each request in flight held a
    coroutine and a wrapped ``send`` for every layer of that stack (seven), which the garbage
    collector scanned again and again while a thousand turns waited. The match is the router's
    own for that route (``{id}`` is a segment without ``/``); an exception other than the
    endpoint's refusals still reaches uvicorn, which logs it and answers 500.
    """

    def __init__(self, stack: Any) -> None:
        self._stack = stack
        self._turns = _Endpoint(post_turn)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path: str = scope["path"]
            if path.startswith(TURNS_PREFIX) and path.endswith(TURNS_SUFFIX):
                session = path[len(TURNS_PREFIX) : -len(TURNS_SUFFIX)]
                if session and "/" not in session:  # Starlette has set scope["app"]
                    scope["path_params"] = {"id": session}
                    await self._turns(scope, receive, send)
                    return
        await self._stack(scope, receive, send)


class _App(Starlette):
    """Starlette with the gate in front of everything, the turn route next (:class:`_TurnsFirst`),
    then Starlette's own middleware stack for every other route."""

    def __init__(self, token: str | None, loopback: bool, **options: Any) -> None:
        super().__init__(**options)
        self._token = token
        self._loopback = loopback

    def build_middleware_stack(self) -> Any:
        """The gate, then the turn route, then Starlette's stack (built lazily by Starlette)."""
        return Gate(_TurnsFirst(super().build_middleware_stack()), self._token, self._loopback)
