"""Subagents over the real HTTP wire: a fake OpenAI-compatible server on 127.0.0.1 records every
request, so the slot of each request, the child's first text and the parent's prompt prefix can
be checked byte for byte."""

from __future__ import annotations

import re
from typing import Any

import msgspec
import pytest

from actors import Config, ModelConfig
from actors.stores.sqlite import DB_NAME, SessionStore
from actors.testing import RawResponse, call, calls, reply
from messages import FailReason, Inspect, TurnCompleted, TurnFailed, Usage


def unmeasured(n: int) -> Usage:
    """The usage of ``n`` requests whose server reported no usage: counted, unmeasured."""
    return Usage(requests=n, unmeasured_requests=n)


WAIT = 10.0
IT_IS = re.compile(r"It is \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\.\n\n")


def wire_config(config: Config, url: str, **loop: Any) -> Config:
    # No retries: these tests script each answer, a retry would take the next one.
    model = ModelConfig(base_url=url, name="local", timeout_s=10, retries=0)
    changes: dict[str, Any] = {"model": model}
    if loop:
        changes["loop"] = msgspec.structs.replace(config.loop, **loop)
    return config.replace(**changes)


def user_texts(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "user"]


def tool_texts(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def spawning_parent(child_answer, *, task: str = "count the stars"):
    """Slot 0 is the parent: it spawns one child, then repeats its tool text."""

    def script(body: dict[str, Any]):
        if body["id_slot"] == 0:
            if body["messages"][-1]["role"] == "user":
                return call("subagent", task=task)
            return reply(tool_texts(body)[-1])
        return child_answer(body)

    return script


def test_the_child_runs_fresh_on_the_background_slot_and_the_parent_prefix_holds(
    chat_server, loopd_runtime, loopd_config
) -> None:
    server = chat_server(spawning_parent(lambda body: reply("about 6000")))
    rt = loopd_runtime(config=wire_config(loopd_config, server.base_url))
    outcome = rt.run_turn("mm-thread", "how many stars?", timeout=WAIT)
    assert outcome == TurnCompleted(
        "mm-thread", "sub-mm-thread-1 completed\nabout 6000", usage=unmeasured(3)
    )

    first, child, second = server.requests
    assert [first["id_slot"], child["id_slot"], second["id_slot"]] == [0, 1, 0]
    assert all(
        body["cache_prompt"] is True and body["model"] == "local" for body in server.requests
    )
    # The child starts fresh: its system prompt, then one user text, nothing of the parent's.
    assert [m["role"] for m in child["messages"]] == ["system", "user"]
    (child_text,) = user_texts(child)
    assert IT_IS.match(child_text) and child_text.endswith("\n\ncount the stars")
    assert "how many stars?" not in str(child["messages"])
    # The parent's next request begins with exactly the messages of its previous one.
    assert second["messages"][: len(first["messages"])] == first["messages"]
    assert second["tools"] == first["tools"]
    assert second["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "sub-mm-thread-1 completed\nabout 6000",
    }
    subagent = next(t for t in first["tools"] if t["function"]["name"] == "subagent")
    assert subagent["function"]["parameters"] == {
        "type": "object",
        "properties": {
            "task": {"type": "string", "description": "Everything the child needs to know."}
        },
        "required": ["task"],
        "additionalProperties": False,
    }


def test_a_child_whose_model_fails_answers_failed(chat_server, loopd_runtime, loopd_config):
    server = chat_server(spawning_parent(lambda body: RawResponse(500, b'{"error": "boom"}')))
    rt = loopd_runtime(config=wire_config(loopd_config, server.base_url))
    assert rt.run_turn("mm-thread", "go", timeout=WAIT) == TurnCompleted(
        "mm-thread", "sub-mm-thread-1 failed", usage=unmeasured(2)
    )


def test_a_second_spawn_takes_the_next_call_id(chat_server, loopd_runtime, loopd_config):
    def script(body: dict[str, Any]):
        if body["id_slot"] == 1:
            return reply("ok " + user_texts(body)[0].rsplit("\n", 1)[-1])
        if body["messages"][-1]["role"] == "user":
            return calls(("clock", {}), ("subagent", {"task": "a"}), ("subagent", {"task": "b"}))
        return reply(" | ".join(tool_texts(body)[1:]))

    server = chat_server(script)
    rt = loopd_runtime(config=wire_config(loopd_config, server.base_url))
    outcome = rt.run_turn("mm-thread", "go", timeout=WAIT)
    assert outcome == TurnCompleted(
        "mm-thread",
        "sub-mm-thread-2 completed\nok a | sub-mm-thread-3 completed\nok b",
        usage=unmeasured(4),
    )


def test_a_child_id_that_would_not_fit_is_denied_before_any_child_request(
    chat_server, loopd_runtime, loopd_config
) -> None:
    parent = "a" * 59
    server = chat_server(spawning_parent(lambda body: reply("never")))
    rt = loopd_runtime(config=wire_config(loopd_config, server.base_url))
    outcome = rt.run_turn(parent, "go", timeout=WAIT)
    raw = f"sub-{parent}-1"
    assert outcome == TurnCompleted(
        parent,
        "Denied: the arguments are not valid for this tool: "
        f"child session id `{raw}` would not fit; see docs/runbook.md#subagent-id.",
        usage=unmeasured(2),
    )
    assert [body["id_slot"] for body in server.requests] == [0, 0]
    assert rt.context.ask(Inspect(), timeout=WAIT).held == ()


def test_malformed_subagent_arguments_are_denied_locally(chat_server, loopd_runtime, loopd_config):
    def script(body: dict[str, Any]):
        if body["messages"][-1]["role"] == "user":
            return calls(
                ("subagent", '{"task": "t", "depth": 2}'),
                ("call_tool", {"name": "subagent", "arguments": {}}),
                ("subagent", "not json"),
                ("nope", {}),
            )
        return reply("\n".join(tool_texts(body)))

    server = chat_server(script)
    rt = loopd_runtime(config=wire_config(loopd_config, server.base_url))
    outcome = rt.run_turn("s", "go", timeout=WAIT)
    assert isinstance(outcome, TurnCompleted)
    assert outcome.content.splitlines() == [
        "Denied: the arguments are not valid for this tool: unknown field: depth.",
        "Denied: the arguments are not valid for this tool: task is required.",
        "Denied: the arguments are not valid for this tool: arguments must be a JSON object.",
        "Denied: there is no tool with this name: nope.",
    ]
    assert all(body["id_slot"] == 0 for body in server.requests)


@pytest.mark.parametrize(
    ("response", "cause"),
    [
        (RawResponse(200, b"<html>gateway</html>"), "not valid JSON"),
        (RawResponse(200, b'{"choices": []}'), "no choices"),
        (RawResponse(503, b"overloaded"), "HTTP 503"),
    ],
)
def test_a_bad_model_answer_fails_the_turn_and_loses_nothing(
    chat_server, loopd_runtime, loopd_config, response, cause
) -> None:
    server = chat_server([reply("first answer"), response, reply("third answer")])
    rt = loopd_runtime(config=wire_config(loopd_config, server.base_url))
    assert isinstance(rt.run_turn("s", "one", timeout=WAIT), TurnCompleted)
    failed = rt.run_turn("s", "two", timeout=WAIT)
    assert isinstance(failed, TurnFailed) and failed.reason is FailReason.MODEL_ERROR
    assert cause in failed.detail
    assert rt.run_turn("s", "three", timeout=WAIT) == TurnCompleted(
        "s", "third answer", usage=unmeasured(1)
    )
    rt.stop()
    with SessionStore(loopd_config.home_path / DB_NAME) as store:
        texts = [m.content for m in store.open("s").transcript]
    assert texts == ["one", "first answer", "two", "three", "third answer"]
