"""The wire parts of running against llama.cpp: max_tokens, usage, truncation, error types."""

from __future__ import annotations

import json
from typing import Any

import pytest

from actors.core.config import ModelConfig
from actors.models.base import ModelFailure
from actors.models.http import HttpChatModel, is_retryable
from actors.models.wire import encode_body, error_detail, http_failure, parse_answer
from actors.testing.chat_server import ChatServer
from actors.testing.script import RawResponse, reply
from messages import ChatMessage, ModelRequest, ToolCall, Usage

FAST = {"retries": 2, "retry_backoff_s": 0.0}

CONTEXT_ERROR = {
    "error": {
        "code": 400,
        "message": "request (4671 tokens) exceeds the available context size (4096 tokens), "
        "try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 4671,
        "n_ctx": 4096,
    }
}


def request(*messages: ChatMessage) -> ModelRequest:
    if not messages:
        messages = (ChatMessage("system", "Be brief."), ChatMessage("user", "hello"))
    return ModelRequest("s1", 1, 0, messages, (), "s1")


def completion(**extra: Any) -> RawResponse:
    body = {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
            }
        ],
        **extra,
    }
    return RawResponse(body=json.dumps(body).encode())


def error(status: int, body: dict[str, Any] | str) -> RawResponse:
    raw = body if isinstance(body, str) else json.dumps(body)
    return RawResponse(status=status, body=raw.encode())


@pytest.fixture
def model_for() -> Any:
    made: list[HttpChatModel] = []

    def build(server: ChatServer, **config: Any) -> HttpChatModel:
        model = HttpChatModel(ModelConfig(base_url=server.base_url, **config))
        made.append(model)
        return model

    yield build
    for model in made:
        model.close()


def test_max_tokens_from_the_config_goes_with_every_request(model_for: Any) -> None:
    with ChatServer([reply("a"), reply("b")]) as server:
        model_for(server).complete(request())
        model_for(server, max_tokens=64).complete(request())
        first, second = server.requests
    assert first["max_tokens"] == 2048
    assert second["max_tokens"] == 64


def test_usage_is_read_with_cached_tokens(model_for: Any) -> None:
    usage = {
        "prompt_tokens": 1755,
        "completion_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 1680},
    }
    with ChatServer([completion(usage=usage)]) as server:
        answer = model_for(server).complete(request())
    assert answer.usage == Usage(1755, 12, 1680, 1)
    assert answer.truncated is False


def test_cached_tokens_fall_back_to_llama_cpp_timings() -> None:
    body = json.dumps(
        {
            "choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 30, "completion_tokens": 2},
            "timings": {"cache_n": 25, "prompt_n": 5},
        }
    ).encode()
    assert parse_answer("s1", 1, body).usage == Usage(30, 2, 25, 1)


def test_no_usage_is_one_unmeasured_request_of_zero_tokens() -> None:
    body = b'{"choices": [{"message": {"content": "ok"}}]}'
    unmeasured = Usage(0, 0, 0, requests=1, unmeasured_requests=1)
    assert parse_answer("s1", 1, body).usage == unmeasured
    for usage in ("null", "{}", '{"prompt_tokens": "many"}', '{"total_tokens": 9}'):
        body = b'{"choices": [{"message": {"content": "ok"}}], "usage": %s}' % usage.encode()
        assert parse_answer("s1", 1, body).usage == unmeasured, usage
    body = b'{"choices": [{"message": {"content": "ok"}}], "usage": {"completion_tokens": 0}}'
    assert parse_answer("s1", 1, body).usage == Usage(requests=1)  # measured: nothing


def test_finish_reason_length_marks_the_answer_truncated() -> None:
    body = b'{"choices": [{"message": {"content": "Once upon a"}, "finish_reason": "length"}]}'
    answer = parse_answer("s1", 1, body)
    assert answer.truncated is True
    assert answer.content == "Once upon a"


def test_context_exceeded_is_not_retried_and_says_so(model_for: Any) -> None:
    with ChatServer([error(400, CONTEXT_ERROR), reply("never")]) as server:
        model = model_for(server, **FAST)
        with pytest.raises(ModelFailure) as caught:
            model.complete(request())
        assert len(server.requests) == 1
    failure = caught.value
    assert failure.context_exceeded is True
    assert failure.context_tokens == 4096
    assert str(failure) == (
        f"the model at {model.url} answered HTTP 400 (exceed_context_size_error): "
        + CONTEXT_ERROR["error"]["message"]
    )


def test_a_500_naming_a_request_error_is_not_retried(model_for: Any) -> None:
    body = {
        "error": {"code": 500, "message": "bad template input", "type": "invalid_request_error"}
    }
    with ChatServer([error(500, body), reply("never")]) as server:
        model = model_for(server, **FAST)
        with pytest.raises(ModelFailure, match="bad template input"):
            model.complete(request())
        assert len(server.requests) == 1


def test_a_500_server_error_is_still_retried(model_for: Any) -> None:
    body = {"error": {"code": 500, "message": "out of memory", "type": "server_error"}}
    with ChatServer([error(500, body), reply("fine")]) as server:
        answer = model_for(server, **FAST).complete(request())
        assert len(server.requests) == 2
    assert answer.content == "fine"


@pytest.mark.parametrize(
    ("status", "body", "retryable"),
    [
        (500, b'{"error": {"type": "server_error", "message": "x"}}', True),
        (500, b'{"error": {"type": "invalid_request_error", "message": "x"}}', False),
        (503, b'{"error": {"type": "unavailable_error", "message": "loading"}}', True),
        (500, b'{"object": "error", "type": "BadRequestError", "message": "x"}', False),
        (500, b'{"error": "ollama says no"}', True),
        (500, b"not json", True),
        (400, b'{"error": {"type": "exceed_context_size_error"}}', False),
        (429, b"", True),
    ],
)
def test_retryable_depends_on_the_error_type(status: int, body: bytes, retryable: bool) -> None:
    assert is_retryable(status, body) is retryable


def test_error_detail_keeps_a_message_whole_and_caps_a_long_one_at_a_word() -> None:
    assert error_detail("short message") == "short message"
    long = " ".join(f"word{n}" for n in range(400))  # ~2,700 characters
    capped = error_detail(long)
    head, _, tail = capped.partition(" ... ")
    assert long.startswith(head + " ")  # cut between two words, not inside one
    assert len(head) <= 1000
    assert tail == f"(cut at {len(head)} of {len(long)} characters)"


def test_error_messages_of_other_servers_are_read() -> None:
    ollama = http_failure("u", 400, b'{"error": "model \\"x\\" not found"}')
    assert str(ollama) == 'the model at u answered HTTP 400: model "x" not found'
    plain = http_failure("u", 502, b"<html>Bad Gateway</html>")
    assert str(plain) == "the model at u answered HTTP 502: <html>Bad Gateway</html>"
    assert not plain.context_exceeded


def test_stored_arguments_a_server_cannot_parse_go_as_an_empty_object() -> None:
    # An old store may hold a call whose text is not JSON; the server would refuse every
    # request of the session over it.
    history = (
        ChatMessage("system", "s"),
        ChatMessage("user", "u"),
        ChatMessage("assistant", None, tool_calls=(ToolCall(1, "echo", '{"text": '),)),
        ChatMessage("tool", "Denied.", tool_call_id=1),
    )
    body = json.loads(encode_body("m", request(*history)))
    assert body["messages"][2]["tool_calls"][0]["function"]["arguments"] == "{}"
    # The same history always encodes to the same bytes: the prompt cache stays valid.
    assert encode_body("m", request(*history)) == encode_body("m", request(*history))
