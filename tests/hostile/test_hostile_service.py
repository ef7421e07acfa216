"""Hostile bodies at every POST route of the service (issue 32, A21, A22 and B1 at the HTTP
door): a real service on 127.0.0.1 over a real runtime. Each body is answered 400 or 413 naming
what was wrong (or a clean answer), never a 500 or a hang, and the service then runs a plain turn.
And a ``token_env`` holding only spaces is refused at start."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest
from hostile_strategies import DEEP, HUGE_BYTES, hostile_json
from hypothesis import HealthCheck, given, settings

from actors import Config
from actors.core.config import ConfigError, ServeConfig
from actors.runtime import Runtime
from actors.shells.service.server import Service
from actors.shells.service.settings import ServiceSettings, service_settings
from actors.testing import ScriptedModel, reply
from messages import ModelRequest, TurnCompleted, TurnOutcome

WAIT = 15.0
ROUTES = ("/v1/sessions/h1/turns", "/v1/sessions/h1/cancel", "/v1/approvals/h1/1")


def answer(_request: ModelRequest) -> object:
    return reply("plain")


@pytest.fixture
def client(tmp_path: Path) -> Iterator[httpx.Client]:
    with (
        Runtime.start(Config(home=str(tmp_path / "home")), model=ScriptedModel(answer)) as rt,
        Service.start(rt, ServiceSettings("127.0.0.1", 0)) as service,
        httpx.Client(base_url=service.url, timeout=WAIT) as client,
    ):
        yield client


def alive(client: httpx.Client) -> None:
    """The service answers its health and runs a plain turn."""
    assert client.get("/healthz").status_code == 200
    response = client.post("/v1/sessions/after/turns", json={"text": "still there?"})
    assert response.status_code == 200, response.text
    outcome = msgspec.json.decode(response.content, type=TurnOutcome)
    assert isinstance(outcome, TurnCompleted) and outcome.content == "plain"


def refusal(response: httpx.Response) -> str:
    assert response.status_code in (400, 413), (response.status_code, response.text[:300])
    error = response.json()["error"]
    assert isinstance(error, str) and error.strip()
    return str(error)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b'{"text": "\\ud800"}', "the body is out of bounds: a lone surrogate (\\ud800)"),
        (b'{"text": ' + b"[" * DEEP + b"]" * DEEP + b"}", "JSON nested deeper than 64 levels"),
        (b"[" * 100_000, "JSON nested deeper than 64 levels"),
        (b'{"text": "a", "x": 36893488147419103232}', "an integer outside the 64-bit range"),
        (b'{"text": "a", "x": 1e400}', "a number that is not finite (inf) at $.x"),
        (b'{"text": "a", "x": NaN}', "the body is not valid JSON: NaN is not valid JSON"),
        (b'{"text": "' + b"x" * HUGE_BYTES + b'"}', "the body is over the cap of 1048576 bytes"),
    ],
    ids=["lone surrogate", "deep", "deep unclosed", "past int64", "1e400", "NaN", "huge"],
)
def test_a_hostile_body_is_refused_naming_it_and_the_service_lives(
    client: httpx.Client, route: str, body: bytes, named: str
) -> None:
    response = client.post(route, content=body, headers={"Content-Type": "application/json"})
    assert named in refusal(response)
    alive(client)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("route", ROUTES)
@settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=hostile_json)
def test_any_hostile_json_body_gets_a_clear_answer(
    client: httpx.Client, route: str, text: str
) -> None:
    data = text.encode("utf-8", "surrogatepass")
    response = client.post(route, content=data, headers={"Content-Type": "application/json"})
    if response.status_code not in (200, 409):  # a clean answer: cancelled, or not waiting
        refusal(response)
    assert client.get("/healthz").status_code == 200


@pytest.mark.timeout(60)
def test_the_service_runs_a_turn_after_the_hostile_bodies(client: httpx.Client) -> None:
    for route in ROUTES:
        refusal(client.post(route, content=b'{"text": "\\udfff"}'))
    alive(client)


@pytest.mark.parametrize("token", [" ", "   ", "\t", " \n "])
def test_a_token_env_holding_only_whitespace_is_refused_at_start(
    tmp_path: Path, token: str
) -> None:
    config = Config(home=str(tmp_path / "home"), serve=ServeConfig(token_env="LOOPD_T"))
    with pytest.raises(ConfigError, match="names LOOPD_T, which is unset or empty"):
        service_settings(config, "127.0.0.1:0", environ={"LOOPD_T": token})


def test_a_token_with_whitespace_at_an_end_is_refused_at_start(tmp_path: Path) -> None:
    config = Config(home=str(tmp_path / "home"), serve=ServeConfig(token_env="LOOPD_T"))
    with pytest.raises(ConfigError, match="begins or ends with whitespace"):
        service_settings(config, "127.0.0.1:0", environ={"LOOPD_T": " tok-9f3"})
    settings = service_settings(config, "127.0.0.1:0", environ={"LOOPD_T": "tok 9f3"})
    assert settings is not None and settings.token == "tok 9f3"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("route", ROUTES)
def test_a_body_that_drips_is_answered_408_and_the_service_lives(
    client: httpx.Client, route: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from actors.shells.service import app

    monkeypatch.setattr(app, "BODY_DEADLINE_S", 1.0)
    host, port = str(client.base_url.host), int(client.base_url.port or 80)
    with socket.create_connection((host, port), timeout=WAIT) as sock:
        head = (
            f"POST {route} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            "Content-Length: 1000\r\n\r\n"
        )
        sock.sendall(head.encode())
        sock.settimeout(0.2)
        answer = b""
        for _ in range(int(WAIT / 0.2)):  # a byte every 0.2 s, until an answer comes
            try:
                answer = sock.recv(4096)
                break
            except TimeoutError:
                sock.sendall(b" ")
    status = answer.split(b"\r\n", 1)[0]
    assert status.startswith(b"HTTP/1.1 408"), answer[:300]
    assert b"did not arrive within 1 s" in answer, answer[:300]
    alive(client)
