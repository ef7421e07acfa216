"""Hostile requests at the A2A door (``[a2a] serve``): a real service on 127.0.0.1 over a real
runtime. Every JSON-RPC body passes the bounded decode before the SDK parses it: a body out of
bounds is answered with a JSON-RPC error naming what was wrong, a hostile value inside a
well-formed message gets an error or a clean answer, never a 500 or a hang, and the endpoint
then runs a plain message."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("a2a.server")

from hostile_strategies import DEEP, HUGE_BYTES, hostile_json, hostile_text
from hypothesis import HealthCheck, given, settings

from actors import Config
from actors.core.config import A2aConfig
from actors.runtime import Runtime
from actors.shells.service.server import Service
from actors.shells.service.settings import ServiceSettings
from actors.testing import ScriptedModel, reply
from messages import ModelRequest

WAIT = 15.0
HEADERS = {"Content-Type": "application/json", "A2A-Version": "1.0"}


def answer(_request: ModelRequest) -> object:
    return reply("plain")


@pytest.fixture
def client(tmp_path: Path) -> Iterator[httpx.Client]:
    config = Config(home=str(tmp_path / "home"), a2a=A2aConfig(serve=True))
    with (
        Runtime.start(config, model=ScriptedModel(answer)) as rt,
        Service.start(rt, ServiceSettings("127.0.0.1", 0)) as service,
        httpx.Client(base_url=service.url, timeout=WAIT, headers=HEADERS) as client,
    ):
        yield client


def envelope(message: str) -> bytes:
    """A ``SendMessage`` request around ``message`` (JSON text of the message object)."""
    return (
        '{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": '
        + message
        + "}}"
    ).encode("utf-8", "surrogatepass")


def message(parts: str, extra: str = "") -> str:
    return '{"messageId": "m1", "role": "ROLE_USER", "parts": ' + parts + extra + "}"


def alive(client: httpx.Client) -> None:
    """The endpoint answers its card and completes a plain message."""
    assert client.get("/a2a/.well-known/agent-card.json").status_code == 200
    response = client.post("/a2a/", content=envelope(message('[{"text": "still there?"}]')))
    assert response.status_code == 200, response.text
    task = response.json()["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
    assert task["artifacts"][0]["parts"][0]["text"] == "plain"


def rpc_error(response: httpx.Response) -> str:
    """The JSON-RPC error's message (a 200 or 413 answer, never a 500)."""
    assert response.status_code in (200, 413), (response.status_code, response.text[:300])
    error = response.json()["error"]
    assert isinstance(error["code"], int) and error["message"].strip()
    return str(error["message"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("body", "named"),
    [
        (envelope(message('[{"text": "\\ud800"}]')), "a lone surrogate (\\ud800)"),
        (envelope(message("[" * DEEP + "]" * DEEP)), "JSON nested deeper than 64 levels"),
        (b"[" * 100_000, "JSON nested deeper than 64 levels"),
        (
            envelope(message('[{"text": "a"}]', ', "metadata": {"n": 36893488147419103232}')),
            "an integer outside the 64-bit range",
        ),
        (envelope(message('[{"data": 1e400}]')), "a number that is not finite"),
        (envelope(message('[{"data": NaN}]')), "the request is not valid JSON"),
        (envelope('{"a": "' + "x" * HUGE_BYTES + '"}'), "over the cap of 1048576 bytes"),
        (b"not json", "the request is not valid JSON"),
    ],
    ids=["lone surrogate", "deep", "deep unclosed", "past int64", "1e400", "NaN", "huge", "junk"],
)
def test_a_body_out_of_bounds_is_refused_naming_it_and_the_endpoint_lives(
    client: httpx.Client, body: bytes, named: str
) -> None:
    assert named in rpc_error(client.post("/a2a/", content=body))
    alive(client)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("message_text", "named"),
    [
        (message('[{"text": "x"}]', ', "contextId": "sub-boss-1"'), "sub-boss-1"),
        (message('[{"text": "x"}]', ', "contextId": "../etc"'), "'../etc'"),
        (message('[{"text": "x"}]', ', "metadata": {"skill": ["default"]}'), "is not a skill"),
        (message('[{"text": "x"}]', ', "metadata": {"skill": "\\u001b[2J"}'), "is not a skill"),
        (message('[{"data": {"a": 1}}]'), "no text part"),
        (message('[{"text": "  "}, {"raw": "AAEC"}]'), "no text part"),
    ],
    ids=["child id", "path", "skill not text", "skill escape", "no text", "blank text"],
)
def test_a_hostile_value_in_a_message_is_an_invalid_params_error_naming_it(
    client: httpx.Client, message_text: str, named: str
) -> None:
    said = rpc_error(client.post("/a2a/", content=envelope(message_text)))
    assert named in said, said
    alive(client)


@pytest.mark.timeout(300)
@settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=hostile_json, text=hostile_text)
def test_any_hostile_part_gets_a_clear_answer(client: httpx.Client, data: str, text: str) -> None:
    import json

    quoted = json.dumps(text)  # a lone surrogate stays one, escaped
    body = envelope(message(f'[{{"text": {quoted}}}, {{"data": {data}}}]'))
    response = client.post("/a2a/", content=body)
    assert response.status_code in (200, 413), (response.status_code, response.text[:300])
    answered: Any = response.json()
    assert "error" in answered or "result" in answered
    assert client.get("/healthz").status_code == 200
