"""Token usage: read from every answer over HTTP, stored with it, summed over a turn and every
child's turn it waited for, and shown by ``loopd sessions show``."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import msgspec

from actors import Config, ModelConfig, Runtime
from actors.core.usage import INT64_MAX, add_usage, format_usage, total_usage
from actors.shells.views import turn_usage
from actors.stores.sqlite import DB_NAME, SessionStore
from actors.testing import RawResponse, ScriptedModel, call, calls, reply, with_usage
from messages import (
    ChatMessage,
    FailReason,
    ModelAnswered,
    SubagentFinished,
    TurnCompleted,
    TurnEnded,
    TurnFailed,
    Usage,
)


def unmeasured(n: int) -> Usage:
    """The usage of ``n`` requests whose server reported no usage: counted, unmeasured."""
    return Usage(requests=n, unmeasured_requests=n)


WAIT = 10.0


def used(prompt: int, completion: int, cached: int = 0, requests: int = 1) -> Usage:
    return Usage(
        prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached, requests=requests
    )


def wire(config: Config, url: str) -> Config:
    return config.replace(model=ModelConfig(base_url=url, name="m", timeout_s=10, retries=0))


def test_usage_adds_field_by_field_and_none_is_zero() -> None:
    assert add_usage(used(1, 2, 3), used(10, 20, 30, 2)) == used(11, 22, 33, 3)
    assert total_usage([]) == Usage() == used(0, 0, 0, 0)


def family_script(body: dict[str, Any]):
    """``mm`` spawns two children at once; ``sub-mm-1`` spawns a grandchild; each answer
    reports its tokens."""
    users = [m["content"] for m in body["messages"] if m["role"] == "user"]
    last = body["messages"][-1]["role"]
    if users[0] == "plan":
        if last == "user":
            return with_usage(
                calls(("subagent", {"task": "a"}), ("subagent", {"task": "b"})), 100, 10, 40
            )
        return with_usage(reply("planned"), 200, 20, 100)
    task = users[0].rsplit("\n", 1)[-1]
    if task == "a":
        if last == "user":
            return with_usage(call("subagent", task="deep"), 30, 3)
        return with_usage(reply("a done"), 31, 4)
    if task == "b":
        return with_usage(reply("b done"), 50, 5, 10)
    assert task == "deep"
    return with_usage(reply("deep done"), 7, 1)


def test_a_turn_sums_its_own_requests_and_every_descendants(
    chat_server, loopd_runtime, loopd_config
) -> None:
    server = chat_server(family_script)
    rt = loopd_runtime(config=wire(loopd_config, server.base_url))
    seen: list[Any] = []
    ended = threading.Event()

    def note(event: Any) -> None:
        seen.append(event)
        if isinstance(event, TurnEnded) and event.session == "mm":
            ended.set()

    rt.subscribe(note)
    outcome = rt.run_turn("mm", "plan", timeout=WAIT)
    assert isinstance(outcome, TurnCompleted)
    # The events come through the bus: the last ModelAnswered (told once the answer is
    # stored) may reach a subscriber after the caller has its outcome.
    assert ended.wait(WAIT)
    # 2 requests of mm, 2 of sub-mm-1, 1 of sub-mm-2, 1 of the grandchild.
    assert outcome.usage == used(100 + 200 + 30 + 31 + 50 + 7, 10 + 20 + 3 + 4 + 5 + 1, 150, 6)
    answered = [e for e in seen if isinstance(e, ModelAnswered)]
    assert sorted(e.usage.prompt_tokens for e in answered) == [7, 30, 31, 50, 100, 200]
    assert all(e.usage.requests == 1 for e in answered)
    finished = {e.child for e in seen if isinstance(e, SubagentFinished)}
    assert finished == {"sub-mm-1", "sub-mm-2", "sub-sub-mm-1-1"}
    rt.stop()
    with SessionStore(Path(loopd_config.home) / DB_NAME) as store:
        # Stored with each answer, and read back per turn, children included.
        stored = [m.usage for m in store.open("mm").transcript if m.role == "assistant"]
        assert stored == [used(100, 10, 40), used(200, 20, 100)]
        (mm_turn,) = turn_usage(store, "mm")
        assert mm_turn == (used(300, 30, 140, 2), outcome.usage)
        assert turn_usage(store, "sub-mm-1") == [(used(61, 7, 0, 2), used(68, 8, 0, 3))]


def test_a_failed_turn_carries_what_it_spent(chat_server, loopd_runtime, loopd_config) -> None:
    server = chat_server([with_usage(call("clock"), 10, 2), with_usage(call("clock"), 11, 3)])
    rt = loopd_runtime(config=wire(loopd_config, server.base_url), loop={"max_steps": 2})
    outcome = rt.run_turn("mm", "go", timeout=WAIT)
    assert isinstance(outcome, TurnFailed) and outcome.reason is FailReason.TURN_LIMIT
    assert outcome.usage == used(21, 5, 0, 2)


def test_llama_cpp_timings_give_the_cached_tokens(chat_server, loopd_runtime, loopd_config) -> None:
    body = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
        "usage": {"prompt_tokens": 90, "completion_tokens": 3, "total_tokens": 93},
        "timings": {"cache_n": 80, "prompt_n": 10},
    }
    server = chat_server([RawResponse(200, json.dumps(body).encode())])
    rt = loopd_runtime(config=wire(loopd_config, server.base_url))
    assert rt.run_turn("mm", "hi", timeout=WAIT) == TurnCompleted("mm", "hi", usage=used(90, 3, 80))


def test_a_server_that_sends_no_usage_still_counts_its_requests(
    chat_server, loopd_config, tmp_path
) -> None:
    # Issue 19 B5: four requests, no usage in any answer, once said "requests=0".
    script = [call("subagent", task="t"), reply("child"), call("clock"), reply("done")]
    server = chat_server(script)
    config = wire(loopd_config, server.base_url)
    with Runtime.start(config) as rt:
        seen: list[Any] = []
        rt.subscribe(seen.append)
        outcome = rt.run_turn("mm", "go", timeout=WAIT)
    assert outcome == TurnCompleted("mm", "done", usage=unmeasured(4))
    # Issue 35 item 5: no server said, so the tokens are unknown, never "0".
    assert format_usage(outcome.usage) == "unknown tokens, 4 requests (none measured)"
    answered = [e.usage for e in seen if isinstance(e, ModelAnswered)]
    assert answered == [unmeasured(1)] * 4
    with SessionStore(Path(config.home) / DB_NAME) as store:
        assert turn_usage(store, "mm") == [(unmeasured(3), unmeasured(4))]


def test_measured_and_unmeasured_requests_add_up_apart() -> None:
    measured = used(100, 10)
    assert add_usage(measured, unmeasured(2)) == Usage(100, 10, 0, 3, unmeasured_requests=2)
    assert format_usage(add_usage(measured, unmeasured(2))) == (
        "100 prompt (0 cached) + 10 completion tokens, 3 requests (2 unmeasured)"
    )
    assert format_usage(measured) == "100 prompt (0 cached) + 10 completion tokens, 1 request"
    # Sums never pass what a message can carry.
    huge = Usage(prompt_tokens=INT64_MAX, requests=1)
    assert add_usage(huge, huge).prompt_tokens == INT64_MAX


def test_usage_stored_before_unmeasured_requests_existed_still_decodes() -> None:
    old = (
        b'{"type":"ChatMessage","role":"assistant","content":"x","tool_calls":[],'
        b'"tool_call_id":null,"name":null,"usage":{"type":"Usage","prompt_tokens":1,'
        b'"completion_tokens":2,"cached_tokens":0,"requests":1}}'
    )
    message = msgspec.json.decode(old, type=ChatMessage)
    assert message.usage == Usage(1, 2, 0, 1, unmeasured_requests=0)


def test_scripted_model_reports_usage_offline(loopd_runtime) -> None:
    model = ScriptedModel([with_usage(call("subagent", task="t"), 5, 1), reply("c"), reply("p")])
    rt = loopd_runtime(model=model)
    assert rt.run_turn("mm", "go", timeout=WAIT).usage == used(5, 1)


def test_sessions_show_prints_session_and_turn_totals(chat_server, loopd_config, tmp_path) -> None:
    server = chat_server(family_script)
    config = wire(loopd_config, server.base_url)
    with Runtime.start(config) as rt:
        assert isinstance(rt.run_turn("mm", "plan", timeout=WAIT), TurnCompleted)
    toml = tmp_path / "loopd.toml"
    toml.write_text(f'home = "{config.home}"\n')
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "actors.shells.cli",
            "sessions",
            "--config",
            str(toml),
            "show",
            "mm",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "usage     300 prompt (140 cached) + 30 completion tokens, 2 requests\n" in out
    assert "  with children 418 prompt (150 cached) + 43 completion tokens, 6 requests\n" in out
    assert (
        "  turn 1: 300 prompt (140 cached) + 30 completion tokens, 2 requests; "
        "with children 418 prompt (150 cached) + 43 completion tokens, 6 requests\n"
    ) in out
