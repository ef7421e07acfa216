"""The service's API over a real uvicorn on 127.0.0.1 and a real httpx client, with real actors
on the test kit's scripted model: turns, cancel, sessions, hostile input, the token and the
browser guard, the OpenAPI document."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest
from service_kit import WAIT, outcome, wait_for_states

from actors.shells.demo import DEMO_SESSION, DEMO_TEXT
from actors.shells.service.openapi import openapi_document
from actors.testing import call, reply
from messages import (
    FailReason,
    ModelRequest,
    TurnCompleted,
    TurnEnded,
    TurnEvent,
    TurnFailed,
)


def test_a_waited_turn_answers_200_with_the_turn_completed_json_of_the_family(serve) -> None:
    s = serve()
    response = s.client.post(f"/v1/sessions/{DEMO_SESSION}/turns", json={"text": DEMO_TEXT})
    assert response.status_code == 200
    answer = outcome(response)
    assert isinstance(answer, TurnCompleted) and answer.session == DEMO_SESSION
    assert "My helper reported" in answer.content
    assert response.json()["type"] == "TurnCompleted"  # the message's own JSON


def test_a_turn_without_wait_answers_202_at_once_and_runs(serve) -> None:
    release = threading.Event()

    def script(request: ModelRequest):
        release.wait(WAIT)
        return reply("later")

    s = serve(script)
    ended = s.ended("bg")
    response = s.client.post("/v1/sessions/bg/turns", json={"text": "go", "wait": False})
    assert (response.status_code, response.json()) == (202, {"session": "bg"})
    release.set()
    assert ended.wait(WAIT)
    shown = s.client.get("/v1/sessions/bg").json()
    assert shown["turns"] == 1 and shown["transcript"][-1]["content"] == "later"


def test_a_failed_turn_answers_200_with_its_turn_failed(serve) -> None:
    s = serve([])  # a script with no answers: the model fails the first request
    response = s.client.post("/v1/sessions/loop/turns", json={"text": "go"})
    assert response.status_code == 200
    failed = outcome(response)
    assert isinstance(failed, TurnFailed) and failed.reason is FailReason.MODEL_ERROR
    assert "ran out of answers" in failed.detail
    assert response.json()["reason"] == "model_error"


def test_a_client_that_goes_away_mid_turn_leaves_the_turn_running_to_its_end(serve) -> None:
    asked = threading.Event()
    release = threading.Event()

    def script(request: ModelRequest):
        asked.set()
        release.wait(WAIT)
        return reply("stored anyway")

    s = serve(script)
    ended = s.ended("gone")
    body = b'{"text": "hi"}'
    with socket.create_connection(("127.0.0.1", s.service.port), timeout=WAIT) as raw:
        raw.sendall(
            b"POST /v1/sessions/gone/turns HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        assert asked.wait(WAIT)
    release.set()  # the client has gone; the turn ends and is stored
    assert ended.wait(WAIT)
    shown = s.client.get("/v1/sessions/gone").json()
    assert shown["turns"] == 1 and shown["transcript"][-1]["content"] == "stored anyway"


def test_a_client_that_asked_cancel_on_disconnect_cancels_its_family_by_going_away(
    serve,
) -> None:
    asked = threading.Event()
    release = threading.Event()

    def script(request: ModelRequest):
        if request.session == "boss":
            return call("subagent", task="dig")
        asked.set()
        release.wait(WAIT)
        return reply("too late")

    s = serve(script)
    ends: list[TurnEnded] = []
    both = threading.Event()

    def see(event: TurnEvent) -> None:
        if isinstance(event, TurnEnded):
            ends.append(event)
            if {e.session for e in ends} == {"boss", "sub-boss-1"}:
                both.set()

    s.rt.subscribe(see)
    body = b'{"text": "hi", "cancel_on_disconnect": true}'
    try:
        with socket.create_connection(("127.0.0.1", s.service.port), timeout=WAIT) as raw:
            raw.sendall(
                b"POST /v1/sessions/boss/turns HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            assert asked.wait(WAIT)
        assert both.wait(WAIT)  # gone: the turn and its child were cancelled
    finally:
        release.set()
    assert {e.session: e.reason for e in ends} == {
        "boss": FailReason.CANCELLED,
        "sub-boss-1": FailReason.CANCELLED,
    }
    assert s.client.post("/v1/sessions/boss/cancel").json() == {"cancelled": []}


class _ErrorSeen(logging.Handler):
    """Sets ``seen`` at the first ERROR record: an event to wait on, not a log to poll."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen = threading.Event()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.seen.set()


def test_a_client_gone_before_its_body_is_read_logs_no_error(serve) -> None:
    s = serve()
    errors = _ErrorSeen()
    logging.getLogger().addHandler(errors)
    try:
        with socket.create_connection(("127.0.0.1", s.service.port), timeout=WAIT) as raw:
            raw.sendall(
                b"POST /v1/sessions/half/turns HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b'Content-Length: 1000\r\n\r\n{"text": '
            )
        assert s.client.get("/healthz").status_code == 200
        # As Probe.expect_none: what must not come, waited for briefly.
        assert not errors.seen.wait(0.3), [r.getMessage() for r in errors.records]
    finally:
        logging.getLogger().removeHandler(errors)
    assert s.client.get("/v1/sessions").json() == {"sessions": []}


@pytest.mark.parametrize(
    ("path", "body", "said"),
    [
        ("/v1/sessions/sub-demo-1/turns", {"text": "hi"}, "'sub-demo-1' begins with 'sub-'"),
        ("/v1/sessions/a%20b/turns", {"text": "hi"}, "invalid session id 'a b'"),
        ("/v1/sessions/-x/turns", {"text": "hi"}, "invalid session id '-x'"),
        (f"/v1/sessions/{'x' * 65}/turns", {"text": "hi"}, "longer than 64 bytes"),
        ("/v1/sessions/ok/turns", {"text": 7}, "Expected `str`, got `int` - at `$.text`"),
        ("/v1/sessions/ok/turns", {}, "missing required field `text`"),
        ("/v1/sessions/ok/turns", {"text": "hi", "wait": "yes"}, "at `$.wait`"),
        ("/v1/sessions/ok/turns", {"text": "hi", "extra": 1}, "unknown field `extra`"),
        ("/v1/sessions/ok/turns", {"text": "hi", "agent": "nobody"}, "'nobody'"),
        ("/v1/sessions/ok/turns", [1], "must be a JSON object, not an array"),
        ("/v1/sessions/ok/turns", "text", "must be a JSON object, not a string"),
        ("/v1/sessions/ok/turns", None, "must be a JSON object, not null"),
    ],
)
def test_a_bad_id_text_or_body_is_400_naming_it(serve, path: str, body: Any, said: str) -> None:
    s = serve()
    response = s.client.post(path, content=msgspec.json.encode(body))
    assert response.status_code == 400, response.text
    assert said in response.json()["error"]


@pytest.mark.parametrize(
    "raw",
    [b"{", b"not json", b'{"text": "\\ud800"}', b"[" * 100_000 + b"]" * 100_000, b"\xff\xfe"],
)
def test_a_body_that_is_not_json_is_400_never_500(serve, raw: bytes) -> None:
    s = serve()
    response = s.client.post("/v1/sessions/ok/turns", content=raw)
    assert response.status_code == 400
    assert "error" in response.json()
    assert s.client.get("/healthz").status_code == 200  # and the service goes on


def test_a_body_over_the_cap_is_413_with_a_length_or_chunked(serve) -> None:
    s = serve(max_body_bytes=1000)
    big = msgspec.json.encode({"text": "x" * 2000})
    response = s.client.post("/v1/sessions/ok/turns", content=big)
    assert response.status_code == 413 and "cap of 1000 bytes" in response.json()["error"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: read until past the cap
        yield b'{"text": "'
        for _ in range(100):
            yield b"y" * 100

    response = s.client.post("/v1/sessions/ok/turns", content=chunks())
    assert response.status_code == 413
    assert s.client.post("/v1/sessions/ok/turns", json={"text": "fits"}).status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/v1/sessions/x/turns", 405),
        ("DELETE", "/v1/sessions/x", 405),
        ("OPTIONS", "/v1/sessions", 405),
        ("PUT", "/healthz", 405),
        ("GET", "/v2/sessions", 404),
        # Near the turn route, which is matched ahead of the router: as the router matches it.
        ("POST", "/v1/sessions/a/b/turns", 404),
        ("POST", "/v1/sessions/turns", 405),
        ("POST", "/v1/sessions/x/turns/more", 404),
        ("POST", "/v1/sessions/x/turnsx", 404),
    ],
)
def test_a_wrong_method_or_path_is_a_json_error(serve, method: str, path: str, status: int) -> None:
    s = serve()
    response = s.client.request(method, path)
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json" and response.json()["error"]


def test_cancel_answers_the_cancelled_family_and_the_waiting_turn_gets_its_turn_failed(
    serve,
) -> None:
    asked = threading.Event()
    release = threading.Event()

    def script(request: ModelRequest):
        if request.session == "boss":
            return call("subagent", task="dig")
        asked.set()
        release.wait(WAIT)
        return reply("too late")

    s = serve(script)
    answers: list[httpx.Response] = []
    waiter = threading.Thread(
        target=lambda: answers.append(s.client.post("/v1/sessions/boss/turns", json={"text": "x"}))
    )
    waiter.start()
    try:
        assert asked.wait(WAIT)
        response = s.client.post("/v1/sessions/boss/cancel")
        assert response.status_code == 200
        assert sorted(response.json()["cancelled"]) == ["boss", "sub-boss-1"]
        waiter.join(WAIT)
    finally:
        release.set()
    failed = outcome(answers[0])
    assert isinstance(failed, TurnFailed) and failed.reason is FailReason.CANCELLED
    # Nothing runs now: a second cancel cancels nothing.
    assert s.client.post("/v1/sessions/boss/cancel").json() == {"cancelled": []}
    assert s.client.post("/v1/sessions/bad%20id/cancel").status_code == 400
    assert s.client.post("/v1/sessions/boss/cancel", content=b"[").status_code == 400


def test_sessions_and_one_session_with_its_children_transcript_and_usage(serve) -> None:
    s = serve()
    assert s.client.get("/v1/sessions").json() == {"sessions": []}
    s.client.post(f"/v1/sessions/{DEMO_SESSION}/turns", json={"text": DEMO_TEXT})
    rows = wait_for_states(s.client, {"demo": "completed"})
    assert set(rows) == {"demo", "sub-demo-1", "sub-sub-demo-1-1"}
    assert rows["sub-demo-1"]["parent"] == "demo" and rows["demo"]["turns"] == 1
    assert rows["demo"]["background"] is False
    shown = s.client.get("/v1/sessions/demo").json()
    assert shown["session"] == "demo" and shown["agent"] == "default"
    assert shown["children"] == ["sub-demo-1"] and shown["state"] == "completed"
    assert shown["transcript"][0]["role"] == "user"
    assert shown["transcript"][0]["content"] == DEMO_TEXT
    assert set(shown["usage"]) >= {"prompt_tokens", "completion_tokens"}
    child = s.client.get("/v1/sessions/sub-demo-1").json()  # a child can be read, not run
    assert child["children"] == ["sub-sub-demo-1-1"] and child["parent"] == "demo"


def test_an_unknown_session_is_404_and_a_bad_id_400(serve) -> None:
    s = serve()
    response = s.client.get("/v1/sessions/nobody")
    assert response.status_code == 404 and "nobody" in response.json()["error"]
    assert s.client.get("/v1/sessions/%2Ebad").status_code == 400


@pytest.mark.parametrize(
    "path",
    [
        "/v1/sessions/..%2F..",
        "/v1/sessions/..%2F..%2Fetc%2Fpasswd",
        "/v1/sessions/%2e%2e",
        "/v1/sessions/..",
        "/v1/sessions/x%00y",
        "/v1/sessions/%2Fetc%2Fpasswd",
        "/v1/sessions/loopd.db",
        "/v1/sessions/../../../etc/passwd",
        "/v1/../../pyproject.toml",
        "/static/..%2F..%2Fpyproject.toml",
        "/static/../../pyproject.toml",
    ],
)
def test_path_tricks_are_refused_and_read_no_file(serve, path: str) -> None:
    s = serve()
    # A raw request: an HTTP client would tidy the dots away before sending.
    with socket.create_connection(("127.0.0.1", s.service.port), timeout=WAIT) as raw:
        raw.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := raw.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    assert status in (400, 404), answer
    assert b'"error"' in body
    assert b"[project]" not in body and b"root:" not in body and b"SQLite" not in body


def test_with_a_token_every_request_but_healthz_needs_it(serve) -> None:
    secret = "s3cret-token-value"
    s = serve(token=secret)
    bare = httpx.Client(base_url=s.service.url, timeout=WAIT)
    with bare:
        for method, path in [
            ("GET", "/v1/sessions"),
            ("GET", "/v1/sessions/demo"),
            ("POST", "/v1/sessions/demo/turns"),
            ("POST", "/v1/sessions/demo/cancel"),
            ("GET", "/v1/events"),
            ("GET", "/v1/openapi.json"),
        ]:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": secret}):
                response = bare.request(method, path, headers=headers, json={"text": "hi"})
                assert response.status_code == 401, (method, path, headers)
                assert secret not in response.text
                assert response.headers["www-authenticate"].startswith("Bearer")
        assert bare.get("/healthz").status_code == 200
    assert s.client.get("/v1/sessions").status_code == 200  # the fixture's client has it
    response = s.client.post("/v1/sessions/demo/turns", json={"text": DEMO_TEXT})
    assert response.status_code == 200


@pytest.mark.parametrize(
    ("headers", "said"),
    [
        ({"Origin": "http://evil.example"}, "another origin"),
        ({"Origin": "null"}, "another origin"),
        ({"Host": "evil.example:8321"}, "answers only requests for a loopback host"),
        ({"Host": "evil.example", "Origin": "http://evil.example"}, "loopback host"),
    ],
)
def test_a_request_from_another_sites_page_is_403(serve, headers: dict, said: str) -> None:
    """A page elsewhere may post to 127.0.0.1 (no preflight for a plain form post) or rebind its
    own name to it: neither may run a turn on a loopback service without a token."""
    s = serve()
    response = s.client.post("/v1/sessions/csrf/turns", content=b'{"text": "hi"}', headers=headers)
    assert response.status_code == 403 and said in response.json()["error"]
    assert s.client.get("/v1/sessions").json() == {"sessions": []}  # nothing ran


def test_the_services_own_page_origin_and_localhost_pass(serve) -> None:
    s = serve()
    own = s.service.url  # http://127.0.0.1:PORT
    response = s.client.post(
        f"/v1/sessions/{DEMO_SESSION}/turns", json={"text": DEMO_TEXT}, headers={"Origin": own}
    )
    assert response.status_code == 200
    local = {"Host": f"localhost:{s.service.port}", "Origin": f"http://localhost:{s.service.port}"}
    assert s.client.get("/v1/sessions", headers=local).status_code == 200


def test_the_openapi_document_describes_exactly_the_apps_routes(serve) -> None:
    s = serve()
    served = s.client.get("/v1/openapi.json")
    assert served.status_code == 200 and served.json() == openapi_document()
    document = {
        (path, method.upper())
        for path, operations in openapi_document()["paths"].items()
        for method in operations
    }
    routes = {
        (route.path, method)
        for route in s.service.app.routes
        for method in (getattr(route, "methods", None) or set()) - {"HEAD"}
        if route.path.startswith("/v1/") or route.path == "/healthz"
    }
    assert document == routes
    app_routes = {getattr(r, "path", None) for r in s.service.app.routes}
    assert {path for path, _ in routes} <= app_routes
    assert s.client.get("/healthz").json() == {"status": "ok"}


def test_the_service_runs_on_httptools_and_uvloop_where_installed(serve) -> None:
    # The serve extra installs both: h11 and asyncio's own loop cost the service about half
    # of its throughput (docs/performance.md). Without them it still runs, on h11 and asyncio.
    pytest.importorskip("httptools")
    uvloop = pytest.importorskip("uvloop")
    s = serve()
    assert s.service._server.config.http == "httptools"
    assert isinstance(s.service._loop, uvloop.Loop)
    response = s.client.post(f"/v1/sessions/{DEMO_SESSION}/turns", json={"text": DEMO_TEXT})
    assert response.status_code == 200 and "server" not in response.headers
