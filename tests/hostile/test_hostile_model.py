"""A hostile model server (issue 32, B1 at the model's door): a real HTTP server on 127.0.0.1
answers bodies built to break a reader (nested 100,000 deep, 50 MB, an integer past int64, a
lone surrogate), whole or streamed. The turn fails ``model_error`` naming what was wrong, never
``RecursionError``; the runtime lives and the same session's next turn completes. And arguments
a model wrote 5,000 deep are stored aside, so the next request the session sends is one a
server takes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hostile_strategies import DEEP

from actors import Config, ModelConfig
from actors.runtime import Runtime
from actors.testing import RawResponse, call, reply
from actors.testing.chat_server import ChatServer
from messages import TurnCompleted, TurnFailed

WAIT = 20.0
CAP = 8 * 1024 * 1024  # model.max_answer_bytes, by default


def whole(message: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}], **extra}


def raw(text: str) -> RawResponse:
    return RawResponse(body=text.encode(), headers={"Content-Type": "application/json"})


def streamed(lines: list[str]) -> RawResponse:
    body = "".join(f"data: {line}\n\n" for line in lines).encode()
    return RawResponse(body=body, headers={"Content-Type": "text/event-stream"})


GOOD = json.dumps(whole({"role": "assistant", "content": "fine"}))
CHUNK = '{"choices": [{"index": 0, "delta": {"content": %s}, "finish_reason": null}]}'

WHOLE_CASES: list[tuple[str, RawResponse, str]] = [
    (
        "deep",
        RawResponse(body=b'{"choices": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        "the model's answer is out of bounds: JSON nested deeper than 64 levels",
    ),
    (
        "50 MB",
        RawResponse(body=b'{"choices": "' + b"x" * (50 * 1024 * 1024) + b'"}'),
        f"the model's answer was larger than model.max_answer_bytes ({CAP} bytes)",
    ),
    (
        "usage past int64",
        raw(GOOD[:-1] + ', "usage": {"prompt_tokens": 1000000000000000000000000000000}}'),
        "an integer outside the 64-bit range at $.usage.prompt_tokens",
    ),
    (
        "arguments object past int64",
        raw(
            json.dumps(
                whole(
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "clock", "arguments": {"n": 2**70}},
                            }
                        ],
                    }
                )
            )
        ),
        "an integer outside the 64-bit range at $.choices[0].message.tool_calls[0]",
    ),
    (
        "lone surrogate",
        raw('{"choices": [{"message": {"role": "assistant", "content": "hi \\ud800"}}]}'),
        "the model's answer is out of bounds: a lone surrogate (\\ud800) in a string at "
        "$.choices[0].message.content",
    ),
]

STREAM_CASES: list[tuple[str, RawResponse, str]] = [
    (
        "deep piece",
        streamed(['{"choices": ' + "[" * DEEP + "]" * DEEP + "}", "[DONE]"]),
        "a piece of the model's streamed answer is out of bounds: JSON nested deeper than 64",
    ),
    (
        "lone surrogate piece",
        streamed([CHUNK % '"\\udfff"', "[DONE]"]),
        "a piece of the model's streamed answer is out of bounds: a lone surrogate (\\udfff)",
    ),
    (
        "usage not finite piece",
        streamed([CHUNK % '"a"', '{"choices": [], "usage": {"prompt_tokens": -1e999}}', "[DONE]"]),
        "a number that is not finite (-inf) at $.usage.prompt_tokens",
    ),
]


def start(tmp_path: Path, server: ChatServer, *, stream: bool = False) -> Runtime:
    model = ModelConfig(base_url=server.base_url, retries=0, timeout_s=WAIT, stream=stream)
    return Runtime.start(Config(home=str(tmp_path / "home"), model=model))


def fails_then_lives(
    chat_server: Callable[..., ChatServer],
    tmp_path: Path,
    hostile: RawResponse,
    named: str,
    *,
    stream: bool = False,
) -> None:
    good = RawResponse(body=GOOD.encode(), headers={"Content-Type": "application/json"})
    server = chat_server([hostile, good])
    with start(tmp_path, server, stream=stream) as rt:
        outcome = rt.run_turn("s1", "hi", timeout=WAIT)
        assert isinstance(outcome, TurnFailed), outcome
        assert outcome.reason == "model_error"
        assert named in outcome.detail
        assert "RecursionError" not in outcome.detail
        after = rt.run_turn("s1", "again", timeout=WAIT)
        assert isinstance(after, TurnCompleted) and after.content == "fine", after


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("hostile", "named"), [c[1:] for c in WHOLE_CASES], ids=[c[0] for c in WHOLE_CASES]
)
def test_a_hostile_answer_fails_the_turn_naming_it_and_the_session_lives(
    chat_server: Callable[..., ChatServer], tmp_path: Path, hostile: RawResponse, named: str
) -> None:
    fails_then_lives(chat_server, tmp_path, hostile, named)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("hostile", "named"), [c[1:] for c in STREAM_CASES], ids=[c[0] for c in STREAM_CASES]
)
def test_a_hostile_stream_fails_the_turn_naming_it_and_the_session_lives(
    chat_server: Callable[..., ChatServer], tmp_path: Path, hostile: RawResponse, named: str
) -> None:
    fails_then_lives(chat_server, tmp_path, hostile, named, stream=True)


@pytest.mark.timeout(60)
def test_arguments_written_5000_deep_never_break_a_later_request(
    chat_server: Callable[..., ChatServer], tmp_path: Path
) -> None:
    """The deep text is kept aside (``raw_arguments``) and the call denied naming the bound;
    every later request sends the call's arguments as ``{}``, which a server parses."""
    deep = '{"text": ' + "[" * DEEP + "]" * DEEP + "}"
    server = chat_server([call("remember", deep), reply("done"), reply("later")])
    with start(tmp_path, server) as rt:
        first = rt.run_turn("s1", "hi", timeout=WAIT)
        assert isinstance(first, TurnCompleted) and first.content == "done", first
        later = rt.run_turn("s1", "again", timeout=WAIT)
        assert isinstance(later, TurnCompleted) and later.content == "later", later
    requests = server.requests
    assert len(requests) == 3
    for body in requests[1:]:
        sent = [m for m in body["messages"] if m.get("tool_calls")]
        assert sent[0]["tool_calls"][0]["function"]["arguments"] == "{}"
        result = next(m for m in body["messages"] if m["role"] == "tool")
        assert result["content"] == (
            "Denied: the arguments are not valid for this tool: JSON nested deeper than 64 levels."
        )
