"""The CLI as a client of ``loopd serve --listen``: the same commands, through the HTTP API.

On a served home (``<home>/loopd.serve.json`` names a live service, see actors.shells.served)
``loopd run``, ``loopd sessions``, ``loopd approvals``, ``loopd approve`` and ``loopd deny`` go
through that service instead of failing with ``HomeInUse``; ``--connect URL`` reaches a service
anywhere. The token is read from the caller's environment: the variable the home's file names,
or ``--token-env NAME`` (default ``LOOPD_TOKEN``) with ``--connect``; it is sent as a bearer
header and never printed. The output is the local commands' (``--json`` too).

httpx is imported when the first request is made, not with this module: building the ``loopd``
parser (which adds this module's flags) costs none of it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from actors.shells.flags import DEFAULT_TOKEN_ENV, add_client_flags, read_output_schema
from actors.stores.base import SessionNotFound, StoredMessage
from messages import (
    ApprovalRefused,
    ApprovalRequested,
    ApprovalSettled,
    TurnCompleted,
    TurnEnded,
    TurnEvent,
    TurnOutcome,
    Usage,
    check_session_id,
    check_text,
    check_top_level_session,
)

if TYPE_CHECKING:
    import httpx

    from actors.core.config import Config
    from actors.shells.views import ShownSession

__all__ = [
    "DEFAULT_TOKEN_ENV",
    "ServiceClient",
    "ServiceError",
    "add_client_flags",
    "client_for",
    "remote_approvals",
    "remote_decide",
    "remote_run",
    "remote_sessions",
]

CONNECT_S = 10.0
"""Seconds to connect, send a body or wait for an answer that is not a turn's."""

_EVENTS_AFTER_S = 2.0
"""How long ``run`` waits, after the outcome, for the stream to bring the turn's last events."""

_LOOK_AGAIN_S = 0.5
"""How often ``approvals --wait`` asks the service again once its event stream was cut."""

_LOCAL_ONLY = (
    ("base_url", "--base-url"),
    ("model", "--model"),
    ("tools", "--tools"),
)
"""``run`` flags that configure a local runtime: through a service they are refused."""


class _TurnUsage(msgspec.Struct, frozen=True):
    usage: Usage
    usage_with_children: Usage


class _SessionAnswer(msgspec.Struct, frozen=True):
    """The fields of ``GET /v1/sessions/{id}`` that ``sessions show`` prints (others ignored)."""

    session: str
    slot: int
    agent: str
    turns: int
    untrusted: bool
    next_call_id: int
    children: tuple[str, ...]
    turn_usage: tuple[_TurnUsage, ...]
    history: tuple[StoredMessage, ...]
    backend: str | None = None


class ServiceError(RuntimeError):
    """The service could not be reached, refused the request, or is missing its token."""


class ServiceClient:
    """The HTTP API of one service at ``url``; ``token`` None sends no ``Authorization``."""

    def __init__(self, url: str, token: str | None, token_env: str | None) -> None:
        self.url = url.rstrip("/")
        self.token_env = token_env
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        import httpx

        self._http = httpx.Client(base_url=self.url, headers=self._headers, timeout=CONNECT_S)

    def __repr__(self) -> str:  # never the token
        return f"ServiceClient({self.url!r})"

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    @contextlib.contextmanager
    def _answer(self, *, timeouts: bool = False) -> Iterator[None]:
        """httpx's errors as :class:`ServiceError` (a timeout kept as is with ``timeouts``)."""
        import httpx

        try:
            yield
        except httpx.TimeoutException:
            if timeouts:
                raise
            raise ServiceError(f"the loopd service at {self.url} gave no answer in time") from None
        except httpx.HTTPError as exc:
            raise ServiceError(f"cannot reach the loopd service at {self.url}: {exc}") from None

    def _check(self, response: httpx.Response) -> httpx.Response:
        if response.status_code == 401:
            where = f"the variable {self.token_env}" if self.token_env else "--token-env"
            raise ServiceError(
                f"the loopd service at {self.url} refused the request (401): it needs its token "
                f"in {where}; see docs/runbook.md#cli-through-the-service"
            )
        if response.status_code >= 400 and response.status_code != 409:
            try:
                text = str(msgspec.json.decode(response.content)["error"])
            except (msgspec.DecodeError, KeyError, TypeError):
                text = response.text[:200]
            raise ServiceError(f"the loopd service answered {response.status_code}: {text}")
        return response

    def _get(self, path: str) -> Any:
        with self._answer():
            return msgspec.json.decode(self._check(self._http.get(path)).content)

    def turn(
        self,
        session: str,
        text: str,
        agent: str | None,
        timeout: float | None,
        output_schema: dict[str, Any] | None = None,
    ) -> TurnOutcome:
        """Run one turn and wait for its outcome (``TimeoutError`` after ``timeout`` s); with
        ``output_schema`` the turn is typed."""
        import httpx

        body: dict[str, Any] = {"text": text, "agent": agent, "wait": True}
        if output_schema is not None:
            body["output_schema"] = output_schema
        wait = httpx.Timeout(CONNECT_S, read=timeout)
        path = f"/v1/sessions/{session}/turns"
        try:
            with self._answer(timeouts=True):
                response = self._check(self._http.post(path, json=body, timeout=wait))
        except httpx.TimeoutException:
            raise TimeoutError(f"no answer within {timeout} s") from None
        outcome: TurnOutcome = msgspec.json.decode(response.content, type=TurnOutcome)
        return outcome

    def start_turn(self, session: str, text: str, agent: str | None) -> None:
        """Start a turn and return once the service took it (202)."""
        body = {"text": text, "agent": agent, "wait": False}
        with self._answer():
            self._check(self._http.post(f"/v1/sessions/{session}/turns", json=body))

    def cancel(self, session: str) -> tuple[str, ...]:
        """Cancel ``session``'s turn and its descendants'; the ids cancelled."""
        with self._answer():
            response = self._check(self._http.post(f"/v1/sessions/{session}/cancel", json={}))
        return tuple(msgspec.json.decode(response.content)["cancelled"])

    def sessions(self) -> list[dict[str, Any]]:
        """``GET /v1/sessions``: the stored sessions' rows."""
        rows: list[dict[str, Any]] = self._get("/v1/sessions")["sessions"]
        return rows

    def session(self, session: str) -> dict[str, Any]:
        """``GET /v1/sessions/{id}``: one stored session."""
        shown: dict[str, Any] = self._get(f"/v1/sessions/{session}")
        return shown

    def shown(self, session: str) -> ShownSession:
        """``GET /v1/sessions/{id}`` as ``loopd sessions show`` prints it; ``SessionNotFound``
        (the store's own error, so the CLI says what it says locally) for a session that is not
        stored."""
        from actors.shells.views import ShownSession

        with self._answer():
            response = self._http.get(f"/v1/sessions/{session}")
        if response.status_code == 404:
            raise SessionNotFound(session)
        try:
            view = msgspec.json.decode(self._check(response).content, type=_SessionAnswer)
        except msgspec.ValidationError as exc:  # a service of an older loopd: no history
            raise ServiceError(
                f"the loopd service at {self.url} answered a session view this loopd cannot "
                f"show ({exc}); it may be an older version"
            ) from None
        return ShownSession(
            id=view.session,
            slot=view.slot,
            backend=view.backend,
            agent=view.agent,
            turns=view.turns,
            untrusted=view.untrusted,
            next_call_id=view.next_call_id,
            children=view.children,
            turn_usage=tuple((t.usage, t.usage_with_children) for t in view.turn_usage),
            history=view.history,
        )

    def approvals(self) -> tuple[ApprovalRequested, ...]:
        """``GET /v1/approvals``: the calls waiting for a person's decision."""
        from actors.shells.approvals_cli import _request

        return tuple(_request(item) for item in self.approval_items())

    def approval_items(self) -> list[dict[str, Any]]:
        """``GET /v1/approvals``' items as the service wrote them (every key kept)."""
        answer = self._get("/v1/approvals")
        items: list[dict[str, Any]] = (
            answer.get("approvals", []) if isinstance(answer, dict) else answer
        )
        return items

    def wait_approvals(self, timeout: float | None) -> list[dict[str, Any]] | None:
        """``GET /v1/approvals``' items once at least one call waits; None when ``timeout``
        seconds passed first. It listens to ``GET /v1/events`` (attached before the first
        look, so no request falls between) and looks again at each ``ApprovalRequested``:
        no polling, and the answer comes as soon as the call is stored."""
        import httpx

        deadline = None if timeout is None else time.monotonic() + timeout
        requested = threading.Event()
        http = httpx.Client(
            base_url=self.url, headers=self._headers, timeout=httpx.Timeout(CONNECT_S, read=None)
        )
        try:
            with self._answer():
                stream = http.stream("GET", "/v1/events")
                response = self._check(stream.__enter__())

            ended = threading.Event()

            def pump() -> None:
                with contextlib.suppress(Exception):  # the stream is cut when the wait ends
                    for line in response.iter_lines():
                        if line.startswith("event:") and line[6:].strip() == "ApprovalRequested":
                            requested.set()
                ended.set()
                requested.set()

            threading.Thread(target=pump, name="loopd-approvals", daemon=True).start()
            while True:
                requested.clear()
                items = self.approval_items()
                if items:
                    return items
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                if ended.is_set():  # the stream is gone (cut, not stopped): look now and then
                    time.sleep(_LOOK_AGAIN_S if left is None else min(_LOOK_AGAIN_S, left))
                else:
                    requested.wait(left)
        finally:
            http.close()

    def decide(
        self, session: str, call_id: int, approve: bool, note: str, reason: str
    ) -> ApprovalSettled | ApprovalRefused:
        """``POST /v1/approvals/{session}/{call_id}``: 200 settled, 409 refused."""
        body = {"approve": approve, "note": note, "reason": reason}
        with self._answer():
            response = self._check(self._http.post(f"/v1/approvals/{session}/{call_id}", json=body))
        kind: type[ApprovalSettled | ApprovalRefused] = (
            ApprovalRefused if response.status_code == 409 else ApprovalSettled
        )
        fields = {*kind.__struct_fields__, "type"}
        kept = {k: v for k, v in msgspec.json.decode(response.content).items() if k in fields}
        answer: ApprovalSettled | ApprovalRefused = msgspec.convert(kept, kind)
        return answer

    @contextlib.contextmanager
    def events(self, session: str, show: Callable[[TurnEvent], None]) -> Iterator[threading.Event]:
        """Feed ``show`` the events of ``session``'s family from ``GET /v1/events`` while the
        block runs; yields an Event set once ``session``'s ``TurnEnded`` has come. The stream
        is attached (its head came) before the block starts."""
        import httpx

        ended = threading.Event()
        http = httpx.Client(
            base_url=self.url, headers=self._headers, timeout=httpx.Timeout(CONNECT_S, read=None)
        )
        try:
            with self._answer():
                stream = http.stream("GET", "/v1/events", params={"session": session})
                response = self._check(stream.__enter__())

            def pump() -> None:
                with contextlib.suppress(Exception):  # the stream is cut when the block ends
                    for data in _sse_data(response.iter_lines()):
                        event = msgspec.json.decode(data, type=TurnEvent)
                        show(event)
                        if isinstance(event, TurnEnded) and event.session == session:
                            ended.set()
                ended.set()

            reader = threading.Thread(target=pump, name="loopd-events", daemon=True)
            reader.start()
            yield ended
            ended.wait(_EVENTS_AFTER_S)
        finally:
            http.close()


def _sse_data(lines: Iterator[str]) -> Iterator[str]:
    """The ``data`` of each server-sent event (comments and other fields skipped)."""
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
            data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))


def client_for(
    args: argparse.Namespace, config: Config, environ: Mapping[str, str] | None = None
) -> ServiceClient | None:
    """The service to go through: ``--connect``'s, or the one serving ``config``'s home; None
    to work locally. ``ServiceError`` when the token's variable is unset or empty."""
    environ = os.environ if environ is None else environ
    url = getattr(args, "connect", None)
    from actors.shells.served import find_served

    if url is not None:
        if not url.startswith(("http://", "https://")):
            raise ServiceError(f"--connect wants an http:// or https:// URL, not {url!r}")
        name = getattr(args, "token_env", None)
        if name is None:  # the default variable is optional: a service may take no token
            return ServiceClient(url, environ.get(DEFAULT_TOKEN_ENV) or None, DEFAULT_TOKEN_ENV)
        return ServiceClient(url, _token(environ, name, url), name)
    if getattr(args, "token_env", None) is not None:
        raise ServiceError("--token-env goes with --connect")
    served = find_served(config.home_path)
    if served is None:
        return None
    token = None if served.token_env is None else _token(environ, served.token_env, served.url)
    return ServiceClient(served.url, token, served.token_env)


def _token(environ: Mapping[str, str], name: str, url: str) -> str:
    token = environ.get(name, "")
    if not token:
        raise ServiceError(
            f"the loopd service at {url} needs a token, read from the variable {name}, which "
            f"is unset or empty here: set {name}; see docs/runbook.md#cli-through-the-service"
        )
    return token


def remote_run(client: ServiceClient, args: argparse.Namespace, config: Config) -> int:
    """``loopd run`` through the service: the answer on stdout, the family's events on
    stderr. ``TimeoutError`` when ``--timeout`` runs out (the caller cancels the turn through
    ``client`` and exits 124, as locally)."""
    from actors.core.text import escape_controls, redact
    from actors.shells.render import EventPrinter

    for name, flag in _LOCAL_ONLY:
        if getattr(args, name, None):
            raise ServiceError(
                f"{flag} configures a local runtime; the loopd service at {client.url} runs "
                "its own (leave the flag out, or stop the service)"
            )
    check_top_level_session(args.session)
    check_text(args.text, "the turn text")
    schema = read_output_schema(getattr(args, "output_schema", None))
    if args.json:

        def show(event: TurnEvent) -> None:
            print(msgspec.json.encode(event).decode(), file=sys.stderr, flush=True)

    else:
        show = EventPrinter(sys.stderr)
    with contextlib.ExitStack() as stack:
        if not args.quiet:
            stack.enter_context(client.events(args.session, show))
        outcome = client.turn(args.session, args.text, args.agent, args.timeout, schema)
    if args.json:
        print(msgspec.json.encode(outcome).decode())
        return 0 if isinstance(outcome, TurnCompleted) else 1
    if isinstance(outcome, TurnCompleted):
        print(escape_controls(outcome.content))
        return 0
    detail = escape_controls(redact(outcome.detail, config.model.secrets()))
    print(f"loopd: the turn failed: {outcome.reason}: {detail}", file=sys.stderr)
    return 1


def remote_sessions(client: ServiceClient, args: argparse.Namespace) -> int:
    """``loopd sessions`` through the service (the stored sessions, as locally)."""
    if args.action == "show":
        return _remote_show(client, args)
    rows = [r for r in client.sessions() if "slot" in r]  # opened but not stored yet: not shown
    if args.json:  # the service's row as it came, and its ``id`` (as the local lines have)
        for r in rows:
            print(msgspec.json.encode({"id": r["session"], **r}).decode())
        return 0
    from actors.shells.views import sessions_table

    print(sessions_table(rows))
    return 0


def _remote_show(client: ServiceClient, args: argparse.Namespace) -> int:
    """``sessions show ID`` through the service: what the store-side command prints (text or
    ``--json``), from the service's view of the session."""
    from actors.shells.views import print_shown, print_shown_json

    shown = client.shown(check_session_id(args.id))
    if args.json:
        print_shown_json(shown)
    else:
        print_shown(shown)
    return 0


def remote_approvals(client: ServiceClient, args: argparse.Namespace) -> int:
    """``loopd approvals`` through the service (``--json``: the service's items, one a line;
    ``--wait``: once a call waits, see :meth:`ServiceClient.wait_approvals`)."""
    from actors.shells.approvals_cli import print_requests, wait_timed_out

    json_lines = getattr(args, "json", False)
    if getattr(args, "wait", False):
        items = client.wait_approvals(args.timeout)
        if items is None:
            return wait_timed_out(args.timeout)
    else:
        items = client.approval_items()
    print_requests(items, json_lines=json_lines)
    return 0


def remote_decide(client: ServiceClient, args: argparse.Namespace, approve: bool) -> int:
    """``loopd approve`` / ``loopd deny`` through the service: the running turn resumes at
    once; a refused decision prints its detail and exits 1."""
    check_session_id(args.session)
    note = (getattr(args, "note", None) or "") if approve else ""
    reason = "" if approve else args.reason
    answer = client.decide(args.session, args.call_id, approve, note, reason)
    if isinstance(answer, ApprovalRefused):
        print(answer.detail)
        return 1
    word = "approved" if approve else "declined"
    print(f"call {args.call_id} of session {args.session} {word}; its turn resumes now")
    return 0
