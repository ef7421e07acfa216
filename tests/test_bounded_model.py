"""A session against a server that behaves like llama.cpp: it refuses unparseable tool-call
arguments and prompts over its context, and cuts answers at max_tokens. Real actors, the real
HTTP client, a real SQLite store."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from actors.core.config import ModelConfig
from actors.core.turn import COMPACT_INSTRUCTION, SUMMARY_PREFIX
from actors.models.http import props_url
from actors.models.llama import ServerProps, parse_props, read_props
from actors.stores.sqlite import DB_NAME, SessionStore
from actors.testing.script import Answer, RawResponse, call, reply
from messages import (
    Baseline,
    ChatMessage,
    Compacted,
    FailReason,
    ToolCall,
    TurnCompleted,
    TurnFailed,
    Usage,
)


def unmeasured(n: int) -> Usage:
    """The usage of ``n`` requests whose server reported no usage: counted, unmeasured."""
    return Usage(requests=n, unmeasured_requests=n)


WAIT = 20.0


def refuses_bad_arguments(answer: Any) -> Any:
    """A script that answers like llama.cpp: HTTP 500 for a history with unparseable tool-call
    arguments, ``answer(body)`` otherwise."""

    def script(body: dict[str, Any]) -> Answer | RawResponse:
        for message in body["messages"]:
            for item in message.get("tool_calls") or ():
                try:
                    json.loads(item["function"]["arguments"])
                except ValueError:
                    error = {"code": 500, "message": "Failed to parse tool call arguments as JSON"}
                    return RawResponse(
                        500, json.dumps({"error": {**error, "type": "server_error"}}).encode()
                    )
        return answer(body)

    return script


def http_runtime(loopd_runtime, server, config, **model: Any):
    """A runtime with the real HTTP client to ``server``; ``model`` overrides ``[model]`` keys."""
    settings = {"base_url": server.base_url, "retries": 0, **model}
    return loopd_runtime(config=config.replace(model=ModelConfig(**settings)))


def test_arguments_that_are_not_json_do_not_break_the_next_turn(
    loopd_runtime, chat_server, loopd_config
) -> None:
    def answer(body: dict[str, Any]) -> Answer:
        last = body["messages"][-1]
        if last["role"] == "user":
            return call("subagent", '{"task": "look')  # cut off: not JSON
        return reply("sorry")

    server = chat_server(refuses_bad_arguments(answer))
    rt = http_runtime(loopd_runtime, server, loopd_config)
    assert rt.run_turn("s", "first", timeout=WAIT) == TurnCompleted(
        "s", "sorry", usage=unmeasured(2)
    )
    assert rt.run_turn("s", "second", timeout=WAIT) == TurnCompleted(
        "s", "sorry", usage=unmeasured(2)
    )
    assert server.errors == []
    denial = server.requests[1]["messages"][-1]["content"]
    assert denial.endswith("arguments must be a JSON object.")
    rt.stop()
    with SessionStore(loopd_config.home_path / DB_NAME) as store:
        calls = [c for m in store.open("s").transcript for c in m.tool_calls]
    # What the model wrote is kept for the operator, beside the {} the server sees.
    assert calls[0] == ToolCall(1, "subagent", "{}", raw_arguments='{"task": "look')


def test_a_stored_history_the_server_refused_is_repaired(
    loopd_runtime, chat_server, loopd_config
) -> None:
    # A store written before the fix: the model's broken text as the call's arguments.
    loopd_config.home_path.mkdir(parents=True)
    with SessionStore(loopd_config.home_path / DB_NAME) as store:
        store.create("old", Baseline("system prompt"), 0)
        store.append(
            "old",
            (
                ChatMessage("user", "hi"),
                ChatMessage("assistant", None, tool_calls=(ToolCall(1, "clock", "{oops"),)),
                ChatMessage("tool", "Denied.", tool_call_id=1),
                ChatMessage("assistant", "hello"),
            ),
            turns=1,
            next_call_id=2,
            untrusted=False,
        )
    server = chat_server(refuses_bad_arguments(lambda body: reply("back on track")))
    rt = http_runtime(loopd_runtime, server, loopd_config)
    assert rt.run_turn("old", "still there?", timeout=WAIT) == TurnCompleted(
        "old", "back on track", usage=unmeasured(1)
    )


def too_long_after(limit_chars: int, answer: Any) -> Any:
    """A script that refuses a prompt of more than ``limit_chars`` characters like llama.cpp
    refuses one over its context, and answers summary requests."""

    def script(body: dict[str, Any]) -> Answer | RawResponse:
        size = sum(len(m.get("content") or "") for m in body["messages"])
        if size > limit_chars:
            error = {
                "code": 400,
                "message": f"request ({size} tokens) exceeds the available context size "
                f"({limit_chars} tokens), try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": size,
                "n_ctx": limit_chars,
            }
            return RawResponse(400, json.dumps({"error": error}).encode())
        if body["messages"][-1]["content"] == COMPACT_INSTRUCTION:
            return reply("we spoke at length")
        return answer(body)

    return script


def test_a_session_past_the_servers_context_compacts_and_goes_on(
    loopd_runtime, chat_server, probe, loopd_config
) -> None:
    server = chat_server(too_long_after(3000, lambda body: reply("ok " + "z" * 600)))
    rt = http_runtime(loopd_runtime, server, loopd_config)
    events = probe(rt.directory)
    rt.subscribe(events.tell)
    outcomes = [rt.run_turn("s", f"turn {n} " + "w" * 600, timeout=WAIT) for n in range(4)]
    # Turn 3 passes the server's context: refused, compacted, sent again, answered.
    assert [type(o) for o in outcomes] == [TurnCompleted] * 4
    events.expect(Compacted)
    sizes = [sum(len(m.get("content") or "") for m in r["messages"]) for r in server.requests]
    assert [size > 3000 for size in sizes].count(True) == 1  # refused once, then compacted
    statuses = [m["content"] for m in server.requests[-1]["messages"][1:]]
    assert statuses[0] == SUMMARY_PREFIX + "we spoke at length"
    assert statuses[-1].startswith("turn 3 ")


def test_a_known_context_compacts_before_the_server_refuses(
    loopd_runtime, chat_server, probe, loopd_config
) -> None:
    server = chat_server(too_long_after(3000, lambda body: reply("ok " + "z" * 600)))
    # 1000 tokens at 3 characters a token: compaction starts before the server's 3000 chars.
    rt = http_runtime(loopd_runtime, server, loopd_config, context_tokens=1000)
    for n in range(4):
        assert isinstance(rt.run_turn("s", f"turn {n} " + "w" * 600, timeout=WAIT), TurnCompleted)
    assert server.errors == []
    # The server never had to refuse anything.
    sizes = [sum(len(m.get("content") or "") for m in r["messages"]) for r in server.requests]
    assert max(sizes) <= 3000


def cut_off(content: str | None, tool_calls: list[dict[str, Any]] | None = None) -> RawResponse:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    body = {"choices": [{"index": 0, "message": message, "finish_reason": "length"}]}
    return RawResponse(body=json.dumps(body).encode())


def test_an_answer_cut_at_max_tokens_fails_the_turn_saying_so(
    loopd_runtime, chat_server, loopd_config
) -> None:
    server = chat_server([cut_off("Once upon a time there")])
    rt = http_runtime(loopd_runtime, server, loopd_config, max_tokens=8)
    outcome = rt.run_turn("s", "tell me a story", timeout=WAIT)
    assert isinstance(outcome, TurnFailed)
    assert outcome.reason is FailReason.MODEL_ERROR
    assert "hit max_tokens (8 tokens, model.max_tokens)" in outcome.detail
    assert server.requests[0]["max_tokens"] == 8


def test_on_length_keep_completes_marked_truncated(
    loopd_runtime, chat_server, loopd_config
) -> None:
    server = chat_server([cut_off("Once upon a time there")])
    rt = http_runtime(loopd_runtime, server, loopd_config, max_tokens=8, on_length="keep")
    outcome = rt.run_turn("s", "tell me a story", timeout=WAIT)
    assert outcome == TurnCompleted(
        "s", "Once upon a time there", truncated=True, usage=unmeasured(1)
    )


def test_a_cut_off_tool_call_is_never_run(loopd_runtime, chat_server, loopd_config) -> None:
    broken = [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "subagent", "arguments": '{"task": "do a long th'},
        }
    ]
    server = chat_server([cut_off(None, broken), reply("gave up")])
    rt = http_runtime(loopd_runtime, server, loopd_config)
    assert rt.run_turn("s", "go", timeout=WAIT) == TurnCompleted(
        "s", "gave up", usage=unmeasured(2)
    )
    denial = server.requests[1]["messages"][-1]["content"]
    assert denial.endswith("the call was cut off at max_tokens (2048 tokens).")
    assert len(server.requests) == 2  # no child was spawned


# --- /props -------------------------------------------------------------------------------------


class _Props(BaseHTTPRequestHandler):
    body = b""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        status = 200 if self.path == "/props" else 404
        self.send_response(status)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)


def test_the_slot_context_is_read_from_props() -> None:
    props = {"total_slots": 2, "default_generation_settings": {"n_ctx": 4096}}
    handler = type("Handler", (_Props,), {"body": json.dumps(props).encode()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/v1"
        assert read_props(base) == ServerProps(total_slots=2, slot_context_tokens=4096)
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_without_props_leaves_the_context_unknown(chat_server) -> None:
    server = chat_server([])
    assert read_props(server.base_url) == ServerProps(None, None)  # the fake answers 404
    assert parse_props(b"not json") == ServerProps(None, None)
    assert parse_props(b'{"default_generation_settings": {"n_ctx": "big"}}') == ServerProps(
        None, None
    )


def test_props_live_at_the_server_root() -> None:
    assert props_url("http://127.0.0.1:8080/v1") == "http://127.0.0.1:8080/props"
    assert props_url("http://127.0.0.1:8080/v1/") == "http://127.0.0.1:8080/props"
    assert props_url("http://gpu:8080") == "http://gpu:8080/props"
