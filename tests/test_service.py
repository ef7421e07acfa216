"""loopd as a service: the HTTP API over a real uvicorn server on 127.0.0.1, driven by a real
httpx client, with real actors on the test kit's scripted model."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from actors import Config
from actors.core.config import ConfigError, ServeConfig
from actors.runtime import Runtime
from actors.shells.cli import main
from actors.shells.demo import DEMO_SESSION, DEMO_TEXT, demo_script
from actors.shells.service.openapi import openapi_document
from actors.shells.service.server import Service
from actors.shells.service.settings import ServiceSettings, service_settings
from actors.testing import ScriptedModel, call, reply
from messages import (
    FailReason,
    ModelRequest,
    TurnCompleted,
    TurnEnded,
    TurnEvent,
    TurnFailed,
    TurnOutcome,
)

WAIT = 10.0


class Served:
    """A started runtime, its service and an httpx client of it."""

    def __init__(self, rt: Runtime, service: Service, client: httpx.Client) -> None:
        self.rt = rt
        self.service = service
        self.client = client

    def ended(self, session: str) -> threading.Event:
        """Set when ``session``'s next turn ends (subscribed now, before the turn starts)."""
        done = threading.Event()

        def see(event: TurnEvent) -> None:
            if isinstance(event, TurnEnded) and event.session == session:
                done.set()

        self.rt.subscribe(see)
        return done


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """``serve(script, **settings)``: a runtime on ``script`` served on a free port."""
    with contextlib.ExitStack() as stack:

        def start(script: Any = demo_script, *, token: str | None = None, **options: Any) -> Served:
            config = Config(home=str(tmp_path / f"home{len(stack._exit_callbacks)}"))
            rt = stack.enter_context(Runtime.start(config, model=ScriptedModel(script)))
            settings = ServiceSettings("127.0.0.1", 0, token, **options)
            service = stack.enter_context(Service.start(rt, settings))
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            client = stack.enter_context(
                httpx.Client(base_url=service.url, timeout=WAIT, headers=headers)
            )
            return Served(rt, service, client)

        yield start


def outcome(response: httpx.Response) -> TurnOutcome:
    assert response.headers["content-type"] == "application/json"
    decoded: TurnOutcome = msgspec.json.decode(response.content, type=TurnOutcome)
    return decoded


# Turns.


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


# Cancel.


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


# Reading sessions.


def test_sessions_and_one_session_with_its_children_transcript_and_usage(serve) -> None:
    s = serve()
    assert s.client.get("/v1/sessions").json() == {"sessions": []}
    s.client.post(f"/v1/sessions/{DEMO_SESSION}/turns", json={"text": DEMO_TEXT})
    rows = {row["session"]: row for row in s.client.get("/v1/sessions").json()["sessions"]}
    assert set(rows) == {"demo", "sub-demo-1", "sub-sub-demo-1-1"}
    assert rows["sub-demo-1"]["parent"] == "demo" and rows["demo"]["turns"] == 1
    assert rows["demo"]["state"] == "idle"  # live, no turn running
    shown = s.client.get("/v1/sessions/demo").json()
    assert shown["session"] == "demo" and shown["agent"] == "default"
    assert shown["children"] == ["sub-demo-1"] and shown["state"] == "idle"
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


# Events.


def frames(stream: Iterator[str]) -> Iterator[dict[str, str]]:
    """SSE frames of a line iterator, as ``{"id", "event", "data"}`` dicts (comments skipped)."""
    frame: dict[str, str] = {}
    for line in stream:
        if not line:
            if frame:
                yield frame
            frame = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(": ")
            frame[key] = value


class Reader:
    """An SSE client on a thread: collects frames until ``until(frame)`` says stop."""

    def __init__(
        self,
        client: httpx.Client,
        until: Callable[[dict[str, str]], bool],
        query: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.frames: list[dict[str, str]] = []
        self.status = 0
        self.connected = threading.Event()
        self.done = threading.Event()
        self._args = (client, until, query, headers or {})
        threading.Thread(target=self._run, daemon=True).start()
        assert self.connected.wait(WAIT)

    def _run(self) -> None:
        client, until, query, headers = self._args
        try:
            with client.stream("GET", f"/v1/events{query}", headers=headers) as response:
                self.status = response.status_code
                self.content_type = response.headers.get("content-type", "")
                self.connected.set()
                for frame in frames(response.iter_lines()):
                    self.frames.append(frame)
                    if until(frame):
                        return
        finally:
            self.connected.set()
            self.done.set()

    def wait(self) -> list[dict[str, str]]:
        assert self.done.wait(WAIT), self.frames
        return self.frames


def ended(session: str) -> Callable[[dict[str, str]], bool]:
    return lambda f: f.get("event") == "TurnEnded" and f'"session":"{session}"' in f["data"]


def test_events_stream_every_event_of_the_family_with_increasing_ids_and_tags(serve) -> None:
    s = serve()
    reader = Reader(s.client, ended(DEMO_SESSION))
    assert reader.status == 200 and reader.content_type.startswith("text/event-stream")
    s.client.post(f"/v1/sessions/{DEMO_SESSION}/turns", json={"text": DEMO_TEXT})
    got = reader.wait()
    ids = [int(f["id"]) for f in got]
    assert ids == list(range(ids[0], ids[0] + len(ids)))  # increasing, none skipped
    events = [msgspec.json.decode(f["data"], type=TurnEvent) for f in got]
    assert [f["event"] for f in got] == [type(e).__name__ for e in events]
    sessions = {e.session for e in events}
    assert sessions == {"demo", "sub-demo-1", "sub-sub-demo-1-1"}  # children's included
    assert {"SubagentStarted", "SubagentFinished", "ToolCallStarted"} <= {f["event"] for f in got}


def test_events_of_one_session_are_its_familys_only(serve) -> None:
    s = serve()
    family = Reader(s.client, ended(DEMO_SESSION), query=f"?session={DEMO_SESSION}")
    s.client.post("/v1/sessions/other/turns", json={"text": DEMO_TEXT})
    s.client.post(f"/v1/sessions/{DEMO_SESSION}/turns", json={"text": DEMO_TEXT})
    got = [msgspec.json.decode(f["data"], type=TurnEvent) for f in family.wait()]
    assert {e.session for e in got} == {"demo", "sub-demo-1", "sub-sub-demo-1-1"}
    assert s.client.get("/v1/events?session=bad%20id").status_code == 400


def test_last_event_id_replays_the_buffered_events_after_it(serve) -> None:
    s = serve()
    first = Reader(s.client, ended(DEMO_SESSION))
    s.client.post(f"/v1/sessions/{DEMO_SESSION}/turns", json={"text": DEMO_TEXT})
    seen = first.wait()
    middle = seen[len(seen) // 2]["id"]
    again = Reader(
        s.client, lambda f: f.get("id") == seen[-1]["id"], headers={"Last-Event-ID": middle}
    )
    replayed = again.wait()
    assert replayed == [f for f in seen if int(f["id"]) > int(middle)]
    bad = s.client.get("/v1/events", headers={"Last-Event-ID": "nine"})
    assert bad.status_code == 400 and "Last-Event-ID" in bad.json()["error"]


def test_a_replay_that_reaches_past_the_buffer_says_gap_first(serve) -> None:
    s = serve(replay_events=5)
    first = Reader(s.client, ended(DEMO_SESSION))
    s.client.post(f"/v1/sessions/{DEMO_SESSION}/turns", json={"text": DEMO_TEXT})
    seen = first.wait()
    again = Reader(
        s.client, lambda f: f.get("id") == seen[-1]["id"], headers={"Last-Event-ID": "0"}
    )
    replayed = again.wait()
    assert replayed[0]["event"] == "gap" and "id" not in replayed[0]
    gap = msgspec.json.decode(replayed[0]["data"])
    assert gap["after"] == 0 and gap["first"] == int(seen[-5]["id"])
    assert replayed[1:] == seen[-5:]


def test_a_slow_client_is_told_and_dropped_and_turns_do_not_wait_for_it(serve) -> None:
    """A client that never reads: its queue fills, it gets a ``dropped`` event and its stream
    ends, while turns with large answers go on and a reading client sees every event."""
    big = "x" * 200_000
    s = serve(lambda request: reply(big), client_queue=8)
    host, port = "127.0.0.1", s.service.port
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.settimeout(WAIT)
    slow.connect((host, port))
    slow.sendall(f"GET /v1/events HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:  # the answer's head: the client is attached
        head += slow.recv(1)
    assert head.startswith(b"HTTP/1.1 200")
    fast = Reader(s.client, ended("last"))
    hub = s.service.state.hub
    assert hub.clients == 2
    started = time.monotonic()
    for n in range(400):  # until the socket's buffers and then the queue of 8 are full
        response = s.client.post(f"/v1/sessions/t{n}/turns", json={"text": "go"})
        assert response.status_code == 200
        if hub.clients == 1:  # the slow one was dropped, the fast one reads on
            break
    assert hub.clients == 1, "the slow client was never dropped"
    assert s.client.post("/v1/sessions/last/turns", json={"text": "go"}).status_code == 200
    took = time.monotonic() - started
    got = fast.wait()
    ids = [int(f["id"]) for f in got]
    assert ids == list(range(ids[0], ids[0] + len(ids)))  # the reading client missed nothing
    assert took < WAIT
    received = bytearray()
    while not received.endswith(b"\r\n0\r\n\r\n"):  # to the end of its stream
        chunk = slow.recv(1 << 20)
        assert chunk, "the connection closed before the stream's end"
        received += chunk
    slow.close()
    tail = bytes(received[-2000:])
    assert b"event: dropped" in tail and b"fell more than 8 events behind" in tail


# Auth.


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


def test_a_non_loopback_address_without_a_token_and_an_unset_token_are_refused(
    tmp_path: Path,
) -> None:
    config = Config(home=str(tmp_path / "home"))
    with pytest.raises(ConfigError, match=r"refusing to serve on 0\.0\.0\.0:8321 without a token"):
        service_settings(config, "0.0.0.0:8321", environ={})
    with pytest.raises(ConfigError, match="not a loopback"):
        service_settings(config, "example.org:80", environ={})
    with_token = config.replace(serve=ServeConfig(token_env="LOOPD_TEST_TOKEN"))
    with pytest.raises(ConfigError, match="names LOOPD_TEST_TOKEN, which is unset or empty"):
        service_settings(with_token, "127.0.0.1:0", environ={"LOOPD_TEST_TOKEN": ""})
    settings = service_settings(with_token, "0.0.0.0:0", environ={"LOOPD_TEST_TOKEN": "tok-9f3"})
    assert settings is not None and settings.token == "tok-9f3" and "tok-9f3" not in repr(settings)
    assert service_settings(config, "[::1]:0", environ={}) is not None
    assert service_settings(config, None, environ={}) is None  # no address: no service
    flag_wins = config.replace(serve=ServeConfig(listen="0.0.0.0:1"))
    assert service_settings(flag_wins, "127.0.0.1:2", environ={}).port == 2


def test_loopd_serve_refuses_an_open_address_without_a_token_before_it_starts(
    tmp_path: Path, capsys
) -> None:
    home = tmp_path / "home"
    code = main(["serve", "--home", str(home), "--listen", "0.0.0.0:8321"])
    assert code == 2
    err = capsys.readouterr().err
    assert "refusing to serve on 0.0.0.0:8321 without a token" in err
    assert "docs/runbook.md#serve-open-address" in err
    assert not home.exists()  # refused before anything was made
    assert main(["serve", "--home", str(home), "--listen", "nohost"]) == 2
    assert "--listen must be HOST:PORT" in capsys.readouterr().err


# The document.


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


def test_loopd_serve_on_a_taken_port_exits_2_naming_it(tmp_path: Path, capsys) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["serve", "--home", str(tmp_path / "home"), "--listen", f"127.0.0.1:{port}"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"loopd: cannot listen on 127.0.0.1:{port}: Address already in use" in err
    assert "docs/runbook.md#serve-cannot-listen" in err and "Traceback" not in err


def test_a_last_event_id_of_an_earlier_run_says_gap_and_streams_on(serve) -> None:
    s = serve()
    again = Reader(s.client, ended(DEMO_SESSION), headers={"Last-Event-ID": "5000"})
    s.client.post(f"/v1/sessions/{DEMO_SESSION}/turns", json={"text": DEMO_TEXT})
    got = again.wait()
    gap = msgspec.json.decode(got[0]["data"])
    assert got[0]["event"] == "gap" and gap["after"] == 5000 and gap["first"] == 1
    assert "restarted" in gap["detail"]
    assert got[1]["id"] == "1" and got[1]["event"] == "TurnStarted"


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


def test_a_stalled_client_is_cut_off_after_the_write_deadline(serve, monkeypatch) -> None:
    """A client that takes nothing while its queue still has room: a write that waits past
    WRITE_S ends its stream, so it holds up neither the runtime nor a stop."""
    from actors.shells.service import app

    monkeypatch.setattr(app, "WRITE_S", 0.3)
    big = "x" * 200_000
    s = serve(lambda request: reply(big), client_queue=100_000)
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.settimeout(WAIT)
    stalled.connect(("127.0.0.1", s.service.port))
    stalled.sendall(b"GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        head += stalled.recv(1)
    hub = s.service.state.hub
    assert hub.clients == 1
    n = 0
    deadline = time.monotonic() + WAIT
    while hub.clients:  # turns go on until the stalled stream is cut
        assert time.monotonic() < deadline, "the stalled client was never cut off"
        assert s.client.post(f"/v1/sessions/w{n}/turns", json={"text": "go"}).status_code == 200
        n += 1
    received = bytearray()
    while chunk := stalled.recv(1 << 20):  # what was buffered, then the end of the connection
        received += chunk
    stalled.close()
    assert not received.endswith(b"\r\n0\r\n\r\n") and b"event: dropped" not in received


def test_head_of_events_is_the_head_only(serve) -> None:
    s = serve()
    response = s.client.head("/v1/events")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert s.service.state.hub.clients == 0


def test_a_client_gone_before_its_body_is_read_logs_no_error(serve, caplog) -> None:
    s = serve()
    with socket.create_connection(("127.0.0.1", s.service.port), timeout=WAIT) as raw:
        raw.sendall(
            b"POST /v1/sessions/half/turns HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b'Content-Length: 1000\r\n\r\n{"text": '
        )
    assert s.client.get("/healthz").status_code == 200
    deadline = time.monotonic() + 0.3  # as Probe.expect_none: what must not come, briefly
    while time.monotonic() < deadline:
        assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
        time.sleep(0.01)
    assert s.client.get("/v1/sessions").json() == {"sessions": []}


def test_loopd_serve_refuses_a_token_env_that_is_unset_or_empty(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    home = tmp_path / "home"
    config = tmp_path / "loopd.toml"
    config.write_text(f'home = "{home}"\n[serve]\nlisten = "127.0.0.1:0"\ntoken_env = "LOOPD_T"\n')
    for value in (None, ""):
        if value is None:
            monkeypatch.delenv("LOOPD_T", raising=False)
        else:
            monkeypatch.setenv("LOOPD_T", value)
        assert main(["serve", "--config", str(config)]) == 2
        err = capsys.readouterr().err
        assert "serve.token_env names LOOPD_T, which is unset or empty" in err
        assert "docs/runbook.md#serve-token-unset" in err
        assert not home.exists()
