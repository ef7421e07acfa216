"""Streamed answers (``model.stream``): the answer built from server-sent events is the one the
whole body would give, each text piece is a ``TextDelta`` event, a broken stream is a model
error that is retried, and a cancel closes the stream."""

from __future__ import annotations

import io
import json
import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from actors import AgentConfig, Config, ModelConfig
from actors.models.base import ModelFailure
from actors.models.stream import StreamAssembler, StreamBroken
from actors.models.wire import parse_answer
from actors.shells.render import EventPrinter
from actors.testing import Probe, RawResponse, ScriptedModel, call, reply, with_usage
from actors.testing.chat_server import Drip, sse_body
from messages import (
    FailReason,
    ModelAnswered,
    TextDelta,
    ToolCallStarted,
    TurnCompleted,
    TurnEnded,
    TurnFailed,
    TurnStarted,
    Usage,
)


def unmeasured(n: int) -> Usage:
    """The usage of ``n`` requests whose server reported no usage: counted, unmeasured."""
    return Usage(requests=n, unmeasured_requests=n)


WAIT = 10.0
AT = datetime(2026, 12, 1, tzinfo=UTC)


def whole(content: str | None, calls: list[tuple[str, str]] = (), usage: bool = True) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(calls, 1)
        ]
    response: dict[str, Any] = {
        "id": "x",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
    }
    if usage:
        response["usage"] = {
            "prompt_tokens": 12,
            "completion_tokens": 3,
            "prompt_tokens_details": {"cached_tokens": 8},
        }
    return response


def assemble(data: bytes) -> tuple[StreamAssembler, list[str]]:
    assembler = StreamAssembler()
    pieces = [assembler.feed(line) for line in data.decode().split("\n")]
    return assembler, [p for p in pieces if p]


# --- the assembler (pure) ---------------------------------------------------------------------


@pytest.mark.parametrize("piece", [1, 3, 64])
def test_a_stream_builds_the_answer_the_whole_body_gives(piece: int) -> None:
    response = whole(
        "Two calls: ",
        [("subagent", '{"task": "count \\u00e9toiles"}'), ("clock", "{}")],
    )
    assembler, pieces = assemble(sse_body(response, piece=piece))
    assert "".join(pieces) == "Two calls: "
    streamed = assembler.answer("s", 7)
    assert streamed == parse_answer("s", 7, json.dumps(response).encode())
    assert streamed.tool_calls[0].arguments == '{"task": "count \\u00e9toiles"}'
    assert streamed.usage == Usage(
        prompt_tokens=12, completion_tokens=3, cached_tokens=8, requests=1
    )


def test_comments_and_other_fields_carry_nothing() -> None:
    assembler = StreamAssembler()
    for line in [": keep-alive", "event: message", "id: 3", "", "retry: 10"]:
        assert assembler.feed(line) == ""
    assert not assembler.ended


def test_a_stream_cut_short_is_broken_and_an_error_chunk_fails() -> None:
    data = sse_body(whole("a longer answer"), piece=2)
    cut = data[: len(data) // 2]
    assembler, _ = assemble(cut[: cut.rfind(b"\n\n") + 2])
    with pytest.raises(StreamBroken, match="broke off"):
        assembler.answer("s", 1)
    with pytest.raises(ModelFailure, match="reported an error: overloaded"):
        StreamAssembler().feed('data: {"error": {"message": "overloaded"}}')
    with pytest.raises(ModelFailure, match="streamed answer is not valid JSON"):
        StreamAssembler().feed("data: {nope")


def test_the_printer_writes_a_streamed_answer_on_one_line_as_it_comes() -> None:
    out = io.StringIO()
    printer = EventPrinter(out)
    printer(TurnStarted(session="mm", slot=0, at=AT))
    for text in ["Hel", "lo\n", "there"]:
        printer(TextDelta(session="mm", text=text, at=AT))
    printer(TextDelta(session="sub-mm-1", text="child", at=AT))
    printer(ModelAnswered(session="mm", step=1, content="Hello\nthere", at=AT))
    lines = out.getvalue().splitlines()
    assert lines[1] == "00:00:00 mm  ✎ Hello⏎there"
    assert lines[2].endswith("│ sub-mm-1  ✎ child")
    assert "← model answers" in lines[3] and len(lines) == 4


# --- over HTTP --------------------------------------------------------------------------------


def streaming(config: Config, url: str, *, retries: int = 0, stream: bool = True) -> Config:
    model = ModelConfig(
        base_url=url, name="m", timeout_s=10, retries=retries, stream=stream, retry_backoff_s=0
    )
    return config.replace(model=model)


def test_answers_and_children_stream_as_text_deltas(chat_server, loopd_runtime, loopd_config):
    def script(body: dict[str, Any]):
        users = [m["content"] for m in body["messages"] if m["role"] == "user"]
        if users[0] == "go":
            if body["messages"][-1]["role"] == "user":
                return call("subagent", task="write a line about the sea, please")
            return with_usage(reply("The child wrote: it is done."), 20, 7)
        return reply("The sea is wide and grey.")

    server = chat_server(script)
    rt = loopd_runtime(config=streaming(loopd_config, server.base_url))
    seen: list[Any] = []
    ended = threading.Event()

    def see(event: Any) -> None:
        seen.append(event)
        if isinstance(event, TurnEnded) and event.session == "mm":
            ended.set()

    rt.subscribe(see)
    outcome = rt.run_turn("mm", "go", timeout=WAIT)
    # The bus may hand on the turn's last events just after the caller has its answer.
    assert ended.wait(WAIT)
    assert outcome == TurnCompleted(
        "mm",
        "The child wrote: it is done.",
        # Three requests; two answers (the child's, the parent's first) reported no usage.
        usage=Usage(prompt_tokens=20, completion_tokens=7, requests=3, unmeasured_requests=2),
    )
    assert all(b["stream"] is True for b in server.requests)
    assert all(b["stream_options"] == {"include_usage": True} for b in server.requests)
    # The child got its task whole, though its arguments came in pieces.
    child_users = [m["content"] for m in server.requests[1]["messages"] if m["role"] == "user"]
    assert child_users[0].endswith("\n\nwrite a line about the sea, please")

    def text_of(session: str) -> str:
        return "".join(e.text for e in seen if isinstance(e, TextDelta) and e.session == session)

    assert text_of("mm") == "The child wrote: it is done."
    assert text_of("sub-mm-1") == "The sea is wide and grey."
    deltas = [e for e in seen if isinstance(e, TextDelta) and e.session == "mm"]
    assert len(deltas) > 1  # in pieces, as written
    # Every piece arrives before the answer it belongs to is announced.
    last_delta = max(
        i for i, e in enumerate(seen) if isinstance(e, TextDelta) and e.session == "mm"
    )
    answered = [i for i, e in enumerate(seen) if isinstance(e, ModelAnswered) and e.session == "mm"]
    assert last_delta < answered[-1]
    assert [e.name for e in seen if isinstance(e, ToolCallStarted)] == ["subagent"]


def test_a_broken_stream_is_a_model_error_and_is_retried(chat_server, loopd_runtime, loopd_config):
    data = sse_body(whole("a long answer that breaks", usage=False))
    broken = RawResponse(200, data[:120], {"Content-Type": "text/event-stream"})
    server = chat_server([broken, reply("whole this time")])
    rt = loopd_runtime(config=streaming(loopd_config, server.base_url, retries=1))
    assert rt.run_turn("mm", "go", timeout=WAIT) == TurnCompleted(
        "mm", "whole this time", usage=unmeasured(1)
    )
    assert len(server.requests) == 2

    server = chat_server([broken])
    rt = loopd_runtime(
        config=streaming(loopd_config, server.base_url).replace(
            home=str(loopd_config.home_path / "two")
        )
    )
    failed = rt.run_turn("mm", "go", timeout=WAIT)
    assert isinstance(failed, TurnFailed) and failed.reason is FailReason.MODEL_ERROR
    assert "broke off" in failed.detail


def test_a_cancel_closes_the_stream_at_once(chat_server, loopd_runtime, loopd_config):
    server = chat_server([Drip(reply("word " * 2000), interval_s=0.005)])
    rt = loopd_runtime(config=streaming(loopd_config, server.base_url))
    first_text = threading.Event()
    rt.subscribe(lambda e: first_text.set() if isinstance(e, TextDelta) else None)
    probe = Probe.start(rt.directory)
    rt.send_turn("mm", "talk", reply_to=probe.address)
    assert first_text.wait(WAIT)  # the answer is being written
    assert rt.cancel("mm") == ("mm",)
    assert probe.expect(TurnFailed, timeout=WAIT).reason is FailReason.CANCELLED
    (closed,) = server.wait_for_closed(1, timeout=WAIT)
    assert closed.number == 1
    probe.stop()


def test_a_profile_streams_on_its_own(chat_server, loopd_runtime, loopd_config):
    def script(body: dict[str, Any]):
        if body["model"] == "m" and body["messages"][-1]["role"] == "user":
            return call("subagent", task="t", agent="writer")
        return reply("fine")

    server = chat_server(script)
    config = streaming(loopd_config, server.base_url, stream=False).replace(
        agents={"writer": AgentConfig(model="w", stream=True)}
    )
    rt = loopd_runtime(config=config)
    seen: list[Any] = []
    rt.subscribe(seen.append)
    assert rt.run_turn("mm", "go", timeout=WAIT) == TurnCompleted("mm", "fine", usage=unmeasured(3))
    assert [("stream" in b) for b in server.requests] == [False, True, False]
    assert {e.session for e in seen if isinstance(e, TextDelta)} == {"sub-mm-1"}


def test_scripted_model_streams_offline(loopd_runtime, loopd_config):
    model = ScriptedModel([reply("one two three")])
    config = loopd_config.replace(model=ModelConfig(stream=True))
    rt = loopd_runtime(model=model, config=config)
    seen: list[Any] = []
    rt.subscribe(seen.append)
    assert rt.run_turn("mm", "go", timeout=WAIT) == TurnCompleted("mm", "one two three")
    assert [e.text for e in seen if isinstance(e, TextDelta)] == ["one ", "two ", "three"]
