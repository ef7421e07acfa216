"""A hostile or odd model server over real HTTP (issue 19, part A): ``/props`` that drips or
floods, a streamed line that never ends, impossible usage, tool-call arguments streamed as an
object, a server that ignores ``"stream": true``, tool-call pieces without a usable index."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest

from actors import ModelConfig, Runtime
from actors.models import llama, wire
from actors.models.base import ModelFailure
from actors.models.http import HttpChatModel, read_total_slots
from actors.models.llama import ServerProps, read_props
from actors.models.wire import parse_answer
from actors.testing import RawResponse
from actors.testing.chat_server import ChatServer, Endless, sse_body
from messages import ChatMessage, ModelAnswered, ModelRequest, RequestOptions, TurnCompleted

WAIT = 10.0


# --- a raw socket server, for answers no HTTP library would send -----------------------------


class RawServer:
    """Accepts connections on 127.0.0.1; reads each request's head, then lets ``answer`` write
    to the socket as it likes. ``sent`` counts the bytes written before the client went away."""

    def __init__(self, answer: Callable[[socket.socket, threading.Event], None]) -> None:
        self._answer = answer
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.port = self._listener.getsockname()[1]
        self.gone = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                piece = conn.recv(65536)
                if not piece:
                    return
                head += piece
            try:
                self._answer(conn, self._stop)
            except OSError:  # the client closed the connection: what the tests wait for
                self.gone.set()

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()
        self._thread.join(5)


@pytest.fixture
def raw_server() -> Iterator[Callable[..., RawServer]]:
    servers: list[RawServer] = []

    def start(answer: Callable[[socket.socket, threading.Event], None]) -> RawServer:
        server = RawServer(answer)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def drip(conn: socket.socket, stop: threading.Event) -> None:
    """A 200 that promises a megabyte and sends one byte every 20 ms."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
    conn.sendall(b"Content-Length: 1000000\r\n\r\n{")
    while not stop.wait(0.02):
        conn.sendall(b" ")


def flood(body: bytes) -> Callable[[socket.socket, threading.Event], None]:
    """A 200 without a length whose body is ``body``, sent in 64 KiB pieces."""

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
        conn.sendall(b"Connection: close\r\n\r\n")
        for at in range(0, len(body), 65536):
            if stop.is_set():
                return
            conn.sendall(body[at : at + 65536])

    return answer


# --- A1: /props within a deadline and a size cap ----------------------------------------------


@pytest.mark.timeout(20)
def test_props_that_drip_give_up_at_the_deadline(raw_server) -> None:
    server = raw_server(drip)
    begun = time.monotonic()
    assert read_props(server.base_url, timeout_s=0.3) == ServerProps(None, None)
    assert time.monotonic() - begun < 2.0
    assert server.gone.wait(WAIT)  # and the connection is closed, not left dripping


@pytest.mark.timeout(20)
def test_a_start_is_not_held_by_props_that_drip(raw_server, loopd_config, monkeypatch) -> None:
    monkeypatch.setattr(llama, "PROPS_DEADLINE_S", 0.3)
    server = raw_server(drip)
    config = loopd_config.replace(model=ModelConfig(base_url=server.base_url))
    begun = time.monotonic()
    with Runtime.start(config):
        assert time.monotonic() - begun < 3.0


def test_props_that_flood_are_not_read_past_the_cap(raw_server) -> None:
    # Valid props padded to 8 MiB: read whole, they would be believed.
    props = {"total_slots": 2, "default_generation_settings": {"n_ctx": 4096}}
    body = json.dumps({**props, "pad": "x" * (8 << 20)}).encode()
    server = raw_server(flood(body))
    assert read_props(server.base_url, timeout_s=5.0) == ServerProps(None, None)
    assert server.gone.wait(WAIT)  # the client stopped reading and closed the connection


@pytest.mark.timeout(20)
def test_slots_total_auto_has_a_deadline_for_the_whole_answer(raw_server) -> None:
    server = raw_server(drip)
    begun = time.monotonic()
    with pytest.raises(ModelFailure, match=r"no whole answer within 0\.3 s"):
        read_total_slots(ModelConfig(base_url=server.base_url, timeout_s=0.3))
    assert time.monotonic() - begun < 2.0


def test_slots_total_auto_refuses_a_flood(raw_server) -> None:
    body = json.dumps({"total_slots": 2, "pad": "x" * (8 << 20)}).encode()
    server = raw_server(flood(body))
    with pytest.raises(ModelFailure, match="larger than 1048576 bytes"):
        read_total_slots(ModelConfig(base_url=server.base_url, timeout_s=5.0))


# --- A2: a stream is bounded while it is read --------------------------------------------------


def streamed_request(text: str = "hello") -> ModelRequest:
    messages = (ChatMessage("system", "Be brief."), ChatMessage("user", text))
    return ModelRequest("s1", 1, 0, messages, (), "s1", options=RequestOptions(stream=True))


@pytest.fixture
def model_for() -> Iterator[Callable[..., HttpChatModel]]:
    made: list[HttpChatModel] = []

    def build(base_url: str, **config: Any) -> HttpChatModel:
        config.setdefault("retries", 0)
        model = HttpChatModel(ModelConfig(base_url=base_url, **config))
        made.append(model)
        return model

    yield build
    for model in made:
        model.close()


def test_a_streamed_line_without_its_end_stops_at_max_answer_bytes(model_for) -> None:
    with ChatServer([Endless(b"data: " + b"x" * 4090)]) as server:
        model = model_for(server.base_url, max_answer_bytes=65536, timeout_s=5.0)
        begun = time.monotonic()
        with pytest.raises(ModelFailure, match=r"larger than model.max_answer_bytes \(65536"):
            model.complete(streamed_request())
        assert time.monotonic() - begun < 2.0  # not the 5 s deadline: stopped at the cap
        server.wait_for_closed(1)


def test_a_stream_within_the_cap_with_any_line_ends_is_read(model_for) -> None:
    response = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "a b c"}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3},
    }
    body = sse_body(response, piece=1).replace(b"\n\n", b"\r\n\r\n")
    with ChatServer([RawResponse(body=body)]) as server:
        pieces: list[str] = []
        answer = model_for(server.base_url).complete(streamed_request(), pieces.append)
    assert "".join(pieces) == "a b c"
    assert answer == parse_answer("s1", 1, json.dumps(response).encode())


# --- A10: impossible usage is not believed ----------------------------------------------------


def body_with_usage(prompt: Any, completion: Any) -> bytes:
    return json.dumps(
        {
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion},
        }
    ).encode()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("prompt", "completion"), [(2**63 - 1, 5), (2**62, 5), (5, 2**63 - 1), (10**9, 5)]
)
def test_impossible_usage_is_refused_at_the_wire_and_logged_once(
    model_for, caplog, monkeypatch, prompt: int, completion: int, stream: bool
) -> None:
    monkeypatch.setattr(wire, "_warned", set())
    body = body_with_usage(prompt, completion)
    step = sse(sse_body(json.loads(body))) if stream else RawResponse(body=body)
    request = streamed_request()
    if not stream:
        request = msgspec.structs.replace(request, options=RequestOptions())
    with ChatServer([step, step]) as server:
        model = model_for(server.base_url)
        with caplog.at_level(logging.WARNING, logger="actors.models.wire"):
            answers = [model.complete(request) for _ in range(2)]
    for answer in answers:
        assert answer.usage.prompt_tokens == answer.usage.completion_tokens == 0
        event = ModelAnswered(session="s1", step=1, content="ok", usage=answer.usage)
        assert msgspec.msgpack.decode(msgspec.msgpack.encode(event), type=ModelAnswered) == event
    warnings = [r for r in caplog.records if "more than one request can cost" in r.message]
    assert len(warnings) == 1  # once, not once an answer


@pytest.mark.parametrize("count", [10**30, 2**64 - 1, -(2**63) - 1])
def test_a_usage_past_int64_is_a_model_failure_naming_it(count: int) -> None:
    """Past int64 is no count at all but a value that could not be stored or sent: the bounded
    decode refuses the whole answer, naming the integer and where it was."""
    with pytest.raises(ModelFailure, match=r"integer outside the 64-bit range at \$\.usage"):
        parse_answer("s1", 1, body_with_usage(count, 5))


def test_a_real_usage_stays_believed() -> None:
    answer = parse_answer("s1", 1, body_with_usage(1200, 30), prompt_limit=100_000)
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (1200, 30)


def test_a_turn_with_impossible_usage_completes_and_its_messages_encode(
    chat_server, loopd_runtime, loopd_config
) -> None:
    server = chat_server([RawResponse(body=body_with_usage(2**63 - 1, 2**63 - 1))])
    config = loopd_config.replace(
        model=ModelConfig(base_url=server.base_url, timeout_s=10, retries=0, context_tokens=4096)
    )
    seen: list[Any] = []
    rt = loopd_runtime(config=config)
    rt.subscribe(seen.append)
    outcome = rt.run_turn("mm", "hi", timeout=WAIT)
    assert isinstance(outcome, TurnCompleted) and outcome.content == "ok"
    msgspec.msgpack.encode(outcome)
    for event in seen:
        msgspec.msgpack.encode(event)


def test_an_impossible_context_size_in_an_error_is_no_size() -> None:
    body = json.dumps({"error": {"type": "exceed_context_size_error", "n_ctx": 10**30}})
    assert wire.http_failure("u", 400, body.encode()).context_tokens is None


# --- A11 and A12: a stream gives the answer the body would -----------------------------------


def chunks(*deltas: dict[str, Any], finish: str = "stop") -> bytes:
    lines = [{"choices": [{"index": 0, "delta": delta, "finish_reason": None}]} for delta in deltas]
    lines.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    text = "".join(f"data: {json.dumps(line)}\n\n" for line in lines) + "data: [DONE]\n\n"
    return text.encode()


def sse(body: bytes) -> RawResponse:
    return RawResponse(body=body, headers={"Content-Type": "text/event-stream"})


def test_streamed_arguments_sent_as_an_object_are_kept(model_for) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "subagent"}}
    call["function"]["arguments"] = {"task": "count stars"}
    whole = {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [call]}}]}
    streamed = chunks({"tool_calls": [{"index": 0, **call}]}, finish="tool_calls")
    with ChatServer([sse(streamed)]) as server:
        answer = model_for(server.base_url).complete(streamed_request())
    assert answer.tool_calls[0].arguments == '{"task":"count stars"}'
    expected = parse_answer("s1", 1, json.dumps(whole).encode())
    assert answer.tool_calls == expected.tool_calls


def test_a_server_that_ignores_stream_true_has_its_body_read(model_for) -> None:
    body = body_with_usage(7, 2)
    with ChatServer([RawResponse(body=body, headers={"Content-Type": "application/json"})]) as s:
        pieces: list[str] = []
        answer = model_for(s.base_url).complete(streamed_request(), pieces.append)
    assert answer == parse_answer("s1", 1, body)
    assert pieces == ["ok"]  # the text still reaches the live view, in one piece


def test_a_server_that_neither_streams_nor_answers_says_so(model_for) -> None:
    page = RawResponse(body=b"<html>proxy login</html>", headers={"Content-Type": "text/html"})
    with ChatServer([page]) as server, pytest.raises(ModelFailure, match=r"did not stream .*html"):
        model_for(server.base_url).complete(streamed_request())


def test_tool_call_pieces_without_an_index_build_one_call(model_for) -> None:
    streamed = chunks(
        {"tool_calls": [{"id": "c1", "type": "function", "function": {"name": "subagent"}}]},
        {"tool_calls": [{"function": {"arguments": '{"task": '}}]},
        {"tool_calls": [{"function": {"arguments": '"t"}'}}]},
        {"tool_calls": [{"id": "c2", "function": {"name": "clock", "arguments": "{}"}}]},
        finish="tool_calls",
    )
    with ChatServer([sse(streamed)]) as server:
        answer = model_for(server.base_url).complete(streamed_request())
    assert [(c.name, c.arguments) for c in answer.tool_calls] == [
        ("subagent", '{"task": "t"}'),
        ("clock", "{}"),
    ]


def test_a_tool_call_piece_with_a_string_index_says_so(model_for) -> None:
    streamed = chunks(
        {"tool_calls": [{"index": "0", "id": "c1", "function": {"name": "clock"}}]},
        {"tool_calls": [{"index": "0", "function": {"arguments": "{}"}}]},
        finish="tool_calls",
    )
    refused = pytest.raises(ModelFailure, match=r'index is not a whole number: "0"')
    with ChatServer([sse(streamed)]) as server, refused:
        model_for(server.base_url).complete(streamed_request())


def test_a_streamed_call_never_named_says_which(model_for) -> None:
    streamed = chunks(
        {"tool_calls": [{"index": 0, "id": "c1", "function": {"arguments": "{}"}}]},
        finish="tool_calls",
    )
    refused = pytest.raises(ModelFailure, match=r"tool call \(index 0\) whose pieces never named")
    with ChatServer([sse(streamed)]) as server, refused:
        model_for(server.base_url).complete(streamed_request())
