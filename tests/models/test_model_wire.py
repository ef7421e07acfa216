"""The model client against a real HTTP server on 127.0.0.1: the wire body, answers, failures."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from email.utils import formatdate
from typing import Any

import httpx
import pytest

from actors.core.config import ModelConfig
from actors.models.base import ModelFailure
from actors.models.http import HttpChatModel, is_retryable, props_url, retry_delay
from actors.models.wire import encode_body, parse_answer, request_body
from actors.testing.chat_server import ChatServer, Delayed
from actors.testing.script import Answer, RawResponse, call, calls, reply
from messages import (
    ChatMessage,
    ModelAnswer,
    ModelRequest,
    ProposedCall,
    ToolCall,
    ToolSpec,
    Usage,
)

UNMEASURED = Usage(requests=1, unmeasured_requests=1)
"""The usage of one answer whose server reported none."""

ECHO = ToolSpec(
    name="echo",
    description="Repeat a text.",
    parameters={"type": "object", "properties": {"text": {"type": "string"}}},
)


def make_request(
    *messages: ChatMessage,
    tools: tuple[ToolSpec, ...] = (ECHO,),
    slot: int = 3,
    request_id: int = 7,
) -> ModelRequest:
    if not messages:
        messages = (ChatMessage("system", "Be brief."), ChatMessage("user", "hello"))
    return ModelRequest(
        session="s1",
        request_id=request_id,
        slot=slot,
        messages=messages,
        tools=tools,
        reply_to="s1",
    )


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens: connecting to it is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def model_for() -> Any:
    """Build HttpChatModels against a server (or URL) and close them all after the test."""
    made: list[HttpChatModel] = []

    def build(target: ChatServer | str, **config: Any) -> HttpChatModel:
        url = target.base_url if isinstance(target, ChatServer) else target
        model = HttpChatModel(ModelConfig(base_url=url, name="test-model", **config))
        made.append(model)
        return model

    yield build
    for model in made:
        model.close()


# --- the request body -------------------------------------------------------------------------


def test_body_has_the_standard_shapes_and_llama_cpp_fields(model_for: Any) -> None:
    request = make_request(
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "echo hi twice", name="alice"),
        ChatMessage(
            "assistant",
            None,
            tool_calls=(ToolCall(1, "echo", '{"text": "hi"}'), ToolCall(2, "echo", "{bad")),
        ),
        ChatMessage("tool", "hi", tool_call_id=1),
        ChatMessage("tool", "Denied.", tool_call_id=2),
        ChatMessage("assistant", "done"),
        ChatMessage("user", "again"),
    )
    with ChatServer([reply("ok")]) as server:
        answer = model_for(server).complete(request)
        (body,) = server.requests

    # No usage in the answer: the request still counts, as unmeasured.
    assert answer == ModelAnswer(session="s1", request_id=7, content="ok", usage=UNMEASURED)
    assert body == {
        "model": "test-model",
        "id_slot": 3,
        "cache_prompt": True,
        "max_tokens": 2048,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "echo hi twice", "name": "alice"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "echo", "arguments": '{"text": "hi"}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        # Not JSON: servers refuse it, so it goes as {} (the turn stores it so).
                        "function": {"name": "echo", "arguments": "{}"},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "hi"},
            {"role": "tool", "tool_call_id": "call_2", "content": "Denied."},
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "again"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "echo",
                    "description": "Repeat a text.",
                    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
                },
            }
        ],
    }


def test_body_without_tools_has_no_tools_key() -> None:
    body = request_body("m", make_request(tools=()))
    assert "tools" not in body
    assert body["id_slot"] == 3
    assert body["cache_prompt"] is True


def test_tool_message_without_call_id_cannot_be_sent(model_for: Any) -> None:
    request = make_request(ChatMessage("system", "s"), ChatMessage("tool", "orphan"))
    with pytest.raises(ValueError, match="tool_call_id"):
        request_body("m", request)
    # The client reports it as a ModelFailure, and sends nothing.
    with ChatServer([]) as server:
        with pytest.raises(ModelFailure, match="tool_call_id"):
            model_for(server).complete(request)
        assert server.requests == []


def test_same_request_encodes_to_same_bytes() -> None:
    first = make_request()
    # Equal request, but the tool's schema dict was built in another key order.
    reordered = ToolSpec(
        name="echo",
        description="Repeat a text.",
        parameters={"properties": {"text": {"type": "string"}}, "type": "object"},
    )
    second = make_request(tools=(reordered,))
    assert first == second
    assert encode_body("m", first) == encode_body("m", first)
    assert encode_body("m", first) == encode_body("m", second)


def test_a_longer_transcript_keeps_the_byte_prefix() -> None:
    # The server's prompt cache reuses a slot's prefix only if it is byte-identical.
    shorter = make_request()
    longer = make_request(
        *shorter.messages,
        ChatMessage("assistant", None, tool_calls=(ToolCall(1, "echo", '{"text":"x"}'),)),
        ChatMessage("tool", "x", tool_call_id=1),
    )
    short_bytes = encode_body("m", shorter)
    end_of_messages = short_bytes.index(b"]", short_bytes.index(b'"messages":'))
    assert encode_body("m", longer).startswith(short_bytes[:end_of_messages])


# --- answers ----------------------------------------------------------------------------------


def test_tool_calls_are_parsed_with_raw_arguments_kept(model_for: Any) -> None:
    script = [
        calls(("echo", '{"text":  "hi"}'), ("echo", "{not json")),
        call("subagent", task="look"),
    ]
    with ChatServer(script) as server:
        model = model_for(server)
        first = model.complete(make_request(request_id=1))
        second = model.complete(make_request(request_id=2))
        assert server.errors == []

    assert first == ModelAnswer(
        session="s1",
        request_id=1,
        usage=UNMEASURED,
        content=None,
        tool_calls=(
            ProposedCall("echo", '{"text":  "hi"}'),
            ProposedCall("echo", "{not json"),
        ),
    )
    assert second.request_id == 2
    assert second.tool_calls == (ProposedCall("subagent", '{"task": "look"}'),)


def test_content_and_tool_calls_together(model_for: Any) -> None:
    answer = Answer(content="let me look", tool_calls=(ProposedCall("echo", "{}"),))
    with ChatServer([answer]) as server:
        got = model_for(server).complete(make_request())
    assert got.content == "let me look"
    assert got.tool_calls == (ProposedCall("echo", "{}"),)


def test_lenient_tool_call_shapes() -> None:
    # No id, no type, arguments as an object, or missing: all accepted.
    body = (
        b'{"choices":[{"message":{"content":null,"tool_calls":['
        b'{"function":{"name":"echo","arguments":{"text":"hi","n":[1,2]}}},'
        b'{"function":{"name":"ping"}}]}}]}'
    )
    answer = parse_answer("s1", 4, body)
    assert answer == ModelAnswer(
        session="s1",
        request_id=4,
        usage=UNMEASURED,
        content=None,
        tool_calls=(
            ProposedCall("echo", '{"text":"hi","n":[1,2]}'),
            ProposedCall("ping", "{}"),
        ),
    )


@pytest.mark.parametrize(
    ("body", "cause"),
    [
        (b"<html>oops</html>", "the model's answer is not valid JSON"),
        (b"[1, 2]", "the model's answer is not a JSON object"),
        (b"{}", "the model's answer has no choices"),
        (b'{"choices": []}', "the model's answer has no choices"),
        (b'{"choices": [{"index": 0}]}', "choice without a message"),
        (b'{"choices": [{"message": {"content": 5}}]}', "content that is not text"),
        (b'{"choices":[{"message":{"tool_calls":[{"function":{"name":""}}]}}]}', "function name"),
        (b'{"choices":[{"message":{"tool_calls":[{"function":{"arguments":"{}"}}]}}]}', "name"),
        (b'{"choices":[{"message":{"tool_calls":[{"id":"x"}]}}]}', "without a function"),
        (b'{"choices":[{"message":{"tool_calls":{"a":1}}}]}', "tool_calls that are not a list"),
    ],
)
def test_malformed_answers_are_refused(body: bytes, cause: str) -> None:
    with pytest.raises(ModelFailure, match=cause):
        parse_answer("s1", 1, body)


# --- failures over the wire -------------------------------------------------------------------


def test_http_error_names_the_status_and_the_body(model_for: Any) -> None:
    long_body = b"server exploded " + b"x" * 500
    with ChatServer([RawResponse(status=500, body=long_body)]) as server:
        model = model_for(server, retries=0)
        with pytest.raises(ModelFailure) as caught:
            model.complete(make_request())
    message = str(caught.value)
    assert message.startswith(f"the model at {model.url} answered HTTP 500: server exploded")
    assert message.endswith(long_body.decode())  # the server's message whole


def test_body_not_json_over_http(model_for: Any) -> None:
    with (
        ChatServer([RawResponse(status=200, body=b"not json at all")]) as server,
        pytest.raises(ModelFailure, match="the model's answer is not valid JSON"),
    ):
        model_for(server).complete(make_request())


def test_no_choices_over_http(model_for: Any) -> None:
    with (
        ChatServer([RawResponse(body=b'{"choices": []}')]) as server,
        pytest.raises(ModelFailure, match="the model's answer has no choices"),
    ):
        model_for(server).complete(make_request())


def test_connection_refused(model_for: Any) -> None:
    port = closed_port()
    model = model_for(f"http://127.0.0.1:{port}/v1/", retries=0)  # a trailing slash is stripped
    assert model.url == f"http://127.0.0.1:{port}/v1/chat/completions"
    with pytest.raises(ModelFailure) as caught:
        model.complete(make_request())
    assert str(caught.value).startswith(f"cannot reach the model at {model.url}: ")


def test_timeout(model_for: Any) -> None:
    release = threading.Event()

    def slow(body: dict[str, Any]) -> Answer:
        release.wait(10)
        return reply("too late")

    try:
        with ChatServer(slow) as server:
            model = model_for(server, timeout_s=0.3, retries=0)
            with pytest.raises(ModelFailure) as caught:
                model.complete(make_request())
            assert str(caught.value) == f"the model at {model.url} did not answer within 0.3 s"
    finally:
        release.set()


def test_script_running_out_is_an_http_500_and_recorded(model_for: Any) -> None:
    with ChatServer([reply("one")]) as server:
        model = model_for(server, retries=0)
        assert model.complete(make_request()).content == "one"
        with pytest.raises(
            ModelFailure, match=r"answered HTTP 500 \(chat_server_error\): .*script ran out"
        ):
            model.complete(make_request())
        assert len(server.requests) == 2
        assert len(server.errors) == 1
        assert "script ran out" in server.errors[0]


def test_closed_client_fails_cleanly(model_for: Any) -> None:
    with ChatServer([reply("never")]) as server:
        model = model_for(server)
        model.close()
        with pytest.raises(ModelFailure, match="closed"):
            model.complete(make_request())
        assert server.requests == []


# --- retries ----------------------------------------------------------------------------------

FAST = {"retry_backoff_s": 0.01, "retry_max_wait_s": 0.05, "disconnect_grace_s": 0.01}
"""Retry settings that keep a test's waits to a few hundredths of a second."""


def test_server_error_then_success_is_retried(model_for: Any) -> None:
    with ChatServer([RawResponse(status=500, body=b"boom"), reply("ok")]) as server:
        answer = model_for(server, **FAST).complete(make_request())
        assert len(server.requests) == 2
        assert server.errors == []
    assert answer.content == "ok"


def test_429_with_retry_after_zero_then_success(model_for: Any) -> None:
    limited = RawResponse(status=429, body=b"slow down", headers={"Retry-After": "0"})
    with ChatServer([limited, reply("ok")]) as server:
        answer = model_for(server, **FAST).complete(make_request())
        assert len(server.requests) == 2
    assert answer.content == "ok"


def test_timeout_is_retried(model_for: Any) -> None:
    release = threading.Event()
    seen = 0

    def slow_once(body: dict[str, Any]) -> Answer:
        nonlocal seen
        seen += 1
        if seen == 1:
            release.wait(10)
        return reply(f"answer {seen}")

    try:
        with ChatServer(slow_once) as server:
            answer = model_for(server, timeout_s=0.3, **FAST).complete(make_request())
            assert len(server.requests) == 2
    finally:
        release.set()
    assert answer.content == "answer 2"


def test_a_retry_after_a_cut_off_attempt_waits_for_the_server_to_let_go(model_for: Any) -> None:
    # A timed-out request may still be generating on its slot: the retry, on the same slot,
    # must not come before the server has had disconnect_grace_s to notice the close.
    arrived: list[float] = []

    def slow_once(body: dict[str, Any]) -> Any:
        arrived.append(time.monotonic())
        return Delayed(reply("late"), 30) if len(arrived) == 1 else reply("second")

    settings = {**FAST, "disconnect_grace_s": 0.4}
    with ChatServer(slow_once) as server:
        answer = model_for(server, timeout_s=0.2, **settings).complete(make_request())
        (closed,) = server.closed
    assert answer.content == "second"
    assert [body["id_slot"] for body in server.requests] == [3, 3]
    assert arrived[1] - closed.at >= 0.4 - 0.05  # the server saw the close; then the grace


def test_connection_refused_is_retried_then_fails(model_for: Any) -> None:
    model = model_for(f"http://127.0.0.1:{closed_port()}/v1", retries=2, **FAST)
    with pytest.raises(ModelFailure) as caught:
        model.complete(make_request())
    message = str(caught.value)
    assert message.startswith(f"cannot reach the model at {model.url}: ")
    assert message.endswith(" (after 3 attempts)")


def test_client_error_is_not_retried(model_for: Any) -> None:
    with ChatServer([RawResponse(status=400, body=b"bad request"), reply("never")]) as server:
        model = model_for(server, **FAST)
        with pytest.raises(ModelFailure) as caught:
            model.complete(make_request())
        assert len(server.requests) == 1
    assert str(caught.value) == f"the model at {model.url} answered HTTP 400: bad request"


def test_body_not_json_is_not_retried(model_for: Any) -> None:
    with ChatServer([RawResponse(status=200, body=b"not json"), reply("never")]) as server:
        with pytest.raises(ModelFailure, match="not valid JSON") as caught:
            model_for(server, **FAST).complete(make_request())
        assert len(server.requests) == 1
    assert "attempts" not in str(caught.value)


def test_no_choices_is_not_retried(model_for: Any) -> None:
    with ChatServer([RawResponse(body=b'{"choices": []}'), reply("never")]) as server:
        with pytest.raises(ModelFailure, match="no choices"):
            model_for(server, **FAST).complete(make_request())
        assert len(server.requests) == 1


def test_503_every_time_fails_after_all_attempts(model_for: Any) -> None:
    def overloaded(body: dict[str, Any]) -> RawResponse:
        return RawResponse(status=503, body=b"overloaded")

    with ChatServer(overloaded) as server:
        model = model_for(server, retries=3, **FAST)
        with pytest.raises(ModelFailure) as caught:
            model.complete(make_request())
        assert len(server.requests) == 4
    assert str(caught.value) == (
        f"the model at {model.url} answered HTTP 503: overloaded (after 4 attempts)"
    )


def test_a_retried_then_refused_request_counts_its_attempts(model_for: Any) -> None:
    script = [RawResponse(status=502, body=b"bad gateway"), RawResponse(status=404, body=b"gone")]
    with ChatServer(script) as server:
        model = model_for(server, **FAST)
        with pytest.raises(ModelFailure) as caught:
            model.complete(make_request())
        assert len(server.requests) == 2
    assert (
        str(caught.value) == f"the model at {model.url} answered HTTP 404: gone (after 2 attempts)"
    )


def test_close_cuts_a_retry_wait_short(model_for: Any) -> None:
    with ChatServer([RawResponse(status=503, body=b"busy")]) as server:
        model = model_for(server, retry_backoff_s=30, retry_max_wait_s=60)
        outcome: list[BaseException] = []

        def complete() -> None:
            try:
                model.complete(make_request())
            except BaseException as exc:
                outcome.append(exc)

        worker = threading.Thread(target=complete, daemon=True)
        worker.start()
        server.wait_for_requests(1)
        server.wait_for_idle()
        model.close()
        worker.join(timeout=10)
        assert not worker.is_alive(), "complete() waited out the 30 s backoff"
        assert len(server.requests) == 1
    # The 503 may still be on its way to the client when close() comes.
    (failure,) = outcome
    assert isinstance(failure, ModelFailure)
    assert str(failure) in (
        "the model client was closed while waiting to retry",
        "the model client was closed during the request",
    )


def test_cancelling_the_task_ends_a_retry_wait_at_once() -> None:
    with ChatServer([RawResponse(status=500, body=b"boom"), reply("never")]) as server:
        config = ModelConfig(base_url=server.base_url, name="m", retry_backoff_s=30)
        model = HttpChatModel(config)

        async def cancel_during_the_wait() -> None:
            task = asyncio.create_task(model.acomplete(make_request()))
            await asyncio.to_thread(server.wait_for_requests, 1)
            await asyncio.to_thread(server.wait_for_idle)  # the 500 was sent
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 5)
            await model.aclose()

        try:
            asyncio.run(cancel_during_the_wait())
        finally:
            model.close()
        assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("failure", "retryable"),
    [
        (429, True),
        (500, True),
        (502, True),
        (503, True),
        (504, True),
        (400, False),
        (401, False),
        (404, False),
        (422, False),
        (501, False),
        (httpx.ConnectError("refused"), True),
        (httpx.ConnectTimeout("slow"), True),
        (httpx.ReadTimeout("slow"), True),
        (httpx.RemoteProtocolError("closed early"), True),
        (httpx.ReadError("reset"), True),
        (httpx.UnsupportedProtocol("ftp"), False),
        (httpx.TooManyRedirects("loop"), False),
    ],
)
def test_is_retryable(failure: httpx.HTTPError | int, retryable: bool) -> None:
    assert is_retryable(failure) is retryable


def test_retry_delay_backs_off_exponentially_with_a_little_jitter() -> None:
    config = ModelConfig(retry_backoff_s=1.0, retry_max_wait_s=100.0)
    for attempt in range(4):
        for _ in range(20):
            assert 2**attempt <= retry_delay(attempt, None, config) <= 2**attempt * 1.1
    # Headers without Retry-After: the backoff too.
    assert 1.0 <= retry_delay(0, {"Content-Type": "text/plain"}, config) <= 1.1


def test_retry_delay_is_capped() -> None:
    config = ModelConfig(retry_backoff_s=1.0, retry_max_wait_s=5.0)
    assert retry_delay(9, None, config) == 5.0


def test_retry_after_is_capped_by_the_max_wait() -> None:
    config = ModelConfig(retry_backoff_s=0.01, retry_max_wait_s=0.05)
    assert retry_delay(0, {"Retry-After": "3600"}, config) == 0.05


def test_retry_after_seconds_replace_the_backoff() -> None:
    config = ModelConfig(retry_backoff_s=30.0, retry_max_wait_s=60.0)
    assert retry_delay(0, {"Retry-After": "0"}, config) == 0.0
    assert retry_delay(3, {"retry-after": " 7 "}, config) == 7.0


def test_retry_after_http_date_is_parsed() -> None:
    config = ModelConfig(retry_backoff_s=0.01, retry_max_wait_s=7200.0)
    in_an_hour = formatdate(time.time() + 3600, usegmt=True)
    assert 3500 < retry_delay(0, {"Retry-After": in_an_hour}, config) <= 3600
    an_hour_ago = formatdate(time.time() - 3600, usegmt=True)
    assert retry_delay(0, {"Retry-After": an_hour_ago}, config) == 0.0


def test_unreadable_retry_after_falls_back_to_the_backoff() -> None:
    config = ModelConfig(retry_backoff_s=1.0, retry_max_wait_s=60.0)
    for value in ("soon", "-5", "1.5", ""):
        assert 1.0 <= retry_delay(0, {"Retry-After": value}, config) <= 1.1


# --- headers and concurrency ------------------------------------------------------------------


def test_no_authorization_without_api_key(model_for: Any) -> None:
    with ChatServer([reply("a")]) as server:
        model_for(server).complete(make_request())
        (headers,) = server.request_headers
    assert "authorization" not in headers
    assert headers["content-type"] == "application/json"


def test_bearer_token_from_the_environment(model_for: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("LOOPD_TEST_KEY", "sekrit")
    with ChatServer([reply("a")]) as server:
        model_for(server, api_key_env="LOOPD_TEST_KEY").complete(make_request())
        (headers,) = server.request_headers
    assert headers["authorization"] == "Bearer sekrit"


def test_unset_api_key_variable_sends_no_authorization(model_for: Any, monkeypatch: Any) -> None:
    monkeypatch.delenv("LOOPD_TEST_KEY", raising=False)
    with ChatServer([reply("a")]) as server:
        model_for(server, api_key_env="LOOPD_TEST_KEY").complete(make_request())
        (headers,) = server.request_headers
    assert "authorization" not in headers


def test_concurrent_requests_are_in_flight_together(model_for: Any) -> None:
    # Each answer waits until all three requests have arrived: only possible if the client
    # lets them run at once. A serialising client breaks the barrier and gets HTTP 500s.
    barrier = threading.Barrier(3, timeout=10)

    def together(body: dict[str, Any]) -> Answer:
        barrier.wait()
        return reply(f"slot {body['id_slot']}")

    with ChatServer(together) as server:
        model = model_for(server)
        with ThreadPoolExecutor(max_workers=3) as pool:
            futures = [
                pool.submit(model.complete, make_request(slot=n, request_id=n)) for n in range(3)
            ]
            answers = [future.result() for future in futures]
        assert server.errors == []
    assert [(a.request_id, a.content) for a in answers] == [(n, f"slot {n}") for n in range(3)]


# --- the fake server itself -------------------------------------------------------------------


def test_chat_server_answers_404_elsewhere_and_waits_for_requests() -> None:
    with ChatServer([reply("a")]) as server:
        assert httpx.post(server.base_url + "/completions", json={}).status_code == 404
        assert httpx.get(server.base_url + "/chat/completions").status_code == 404
        with pytest.raises(AssertionError, match=r"expected 1 request\(s\) .* but 0 arrived"):
            server.wait_for_requests(1, timeout=0.05)
        answer = httpx.post(server.base_url + "/chat/completions", json={"model": "m"}).json()
        assert server.wait_for_requests(1) == [{"model": "m"}]
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "a"}
    assert answer["choices"][0]["finish_reason"] == "stop"


def test_props_live_beside_v1() -> None:
    assert props_url("http://127.0.0.1:8080/v1") == "http://127.0.0.1:8080/props"
    assert props_url("http://gpu/llama/v1/") == "http://gpu/llama/props"
    assert props_url("http://gpu:8080") == "http://gpu:8080/props"
