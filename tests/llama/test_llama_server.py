"""loopd against a real llama-server (SmolLM2-135M, two slots): prompt-cache reuse, no leak
between parallel sessions, cancel that reaches the server, and the bounds of issue 12.

A recording proxy sits between loopd and the server (see ``llama_proxy``): the server processes
every prompt for real; the proxy reads its ``timings`` and, where a test needs a tool call the
tiny model would not reliably make, replaces an answer after the server has made it.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from llama_proxy import Proxy

from actors import Config, Runtime
from actors.core.config import CompactConfig, LoopConfig, ModelConfig, SlotsConfig
from actors.core.turn import COMPACT_INSTRUCTION
from actors.stores.sqlite import DB_NAME, SessionStore
from actors.testing import Probe
from messages import (
    Baseline,
    ChatMessage,
    Compacted,
    FailReason,
    TurnCompleted,
    TurnFailed,
)

pytestmark = pytest.mark.timeout(600)

TURN_S = 300.0

NOTES = "Background notes: the project tracks tasks, owners and due dates in a plain list. " * 60


def config(home: Path, proxy: Proxy, **model: Any) -> Config:
    settings: dict[str, Any] = {
        "base_url": proxy.base_url,
        "name": "smollm2",
        "max_tokens": 48,
        "on_length": "keep",
        "retries": 0,
        **model,
    }
    return Config(
        home=str(home),
        model=ModelConfig(**settings),
        slots=SlotsConfig(main=0, background=1),
        loop=LoopConfig(system_prompt="You are a helpful assistant. Answer briefly."),
    )


def greedy(body: dict[str, Any]) -> dict[str, Any]:
    """Temperature 0: the tiny model answers the same way every run."""
    return {**body, "temperature": 0, "seed": 1}


def as_tool_call(answer: dict[str, Any], name: str, arguments: str) -> dict[str, Any]:
    """``answer`` with its message replaced by one tool call (what the test needs the model to
    have said); ``timings`` and ``usage`` stay the server's."""
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_x", "type": "function", "function": {"name": name, "arguments": arguments}}
        ],
    }
    choice = {**answer["choices"][0], "message": message, "finish_reason": "tool_calls"}
    return {**answer, "choices": [choice]}


def is_first_request(body: dict[str, Any]) -> bool:
    return all(m["role"] != "tool" for m in body["messages"]) and body["messages"][-1][
        "content"
    ].startswith("PARENT:")


def slots(server: str) -> list[dict[str, Any]]:
    return list(httpx.get(server + "/slots", timeout=5).json())


def generating(server: str, slot: int) -> bool:
    """Whether ``slot`` is past its prompt and decoding tokens."""
    state = slots(server)[slot]
    decoded = state.get("next_token", [{}])[0].get("n_decoded", 0)
    return bool(state["is_processing"]) and decoded > 0


# --- prompt cache ------------------------------------------------------------------------------


def test_parent_child_parent_reuses_the_parents_whole_prompt(
    proxy: Proxy, tmp_path: Path, figures: list[str]
) -> None:
    proxy.edit_request = greedy

    def edit_answer(request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        if request["id_slot"] == 0 and is_first_request(request):
            return as_tool_call(answer, "subagent", json.dumps({"task": "Say hello."}))
        return answer

    proxy.edit_answer = edit_answer
    with Runtime.start(config(tmp_path, proxy)) as rt:
        outcome = rt.run_turn("p", "PARENT: ask a helper to say hello.", timeout=TURN_S)
        assert isinstance(outcome, TurnCompleted), outcome
    first, child, second = proxy.wait_for(3, 10)
    assert [e.request["id_slot"] for e in (first, child, second)] == [0, 1, 0]
    assert child.request["messages"][-1]["content"].endswith("Say hello.")
    # The parent's second prompt starts with its first: the slot kept all of it.
    assert second.timings["cache_n"] >= first.prompt_tokens - 4, (first.timings, second.timings)
    figures.append(
        f"pinned parent after child: reused {second.timings['cache_n']} of "
        f"{second.prompt_tokens} prompt tokens (first prompt {first.prompt_tokens}); "
        f"evaluated {second.timings['prompt_n']} in {second.timings['prompt_ms']:.0f} ms; "
        f"first request evaluated {first.timings['prompt_n']} in "
        f"{first.timings['prompt_ms']:.0f} ms"
    )


def test_two_sessions_in_parallel_keep_their_secrets_and_their_caches(
    proxy: Proxy, tmp_path: Path, figures: list[str]
) -> None:
    proxy.edit_request = greedy
    secrets = {"alpha": "PLUM", "beta": "WALRUS"}
    # A system prompt of an agent's usual length (~1,500 tokens with the tools): turn 2 adds
    # about 30 tokens to it, which the slot must be the only one to evaluate.
    system = "You are a helpful assistant. Answer briefly. " + NOTES
    cfg = config(tmp_path, proxy, max_tokens=40)
    cfg = cfg.replace(
        slots=SlotsConfig(main=[0, 1], background=[0, 1]),
        loop=LoopConfig(system_prompt=system),
    )
    asks = (
        "The secret word is {}. Say the secret word, then write a sentence about it.",
        "Say the secret word {} again, then write a new sentence.",
    )
    with Runtime.start(cfg) as rt, ThreadPoolExecutor(2) as pool:
        for ask in asks:
            # Both turns at once: their requests are in flight together.
            futures = {
                s: pool.submit(rt.run_turn, s, ask.format(w), TURN_S) for s, w in secrets.items()
            }
            for session, future in futures.items():
                outcome = future.result(TURN_S)
                assert isinstance(outcome, TurnCompleted), outcome
                other = next(w for s, w in secrets.items() if s != session)
                assert other not in outcome.content.upper(), (session, outcome.content)
    exchanges = proxy.wait_for(4, 10)
    # The two sessions' requests that ran together were on different slots.
    assert {e.request["id_slot"] for e in exchanges[:2]} == {0, 1}
    assert {e.request["id_slot"] for e in exchanges[2:]} == {0, 1}
    for session, secret in secrets.items():
        turn1, turn2 = [e for e in exchanges if secret in e.request["messages"][1]["content"]]
        assert turn2.request["id_slot"] == turn1.request["id_slot"]  # back to its own prefix
        reuse = turn2.timings["cache_n"] / turn2.prompt_tokens
        assert reuse >= 0.95, (session, turn2.timings)
        figures.append(
            f"parallel session {session}: turn 2 reused {turn2.timings['cache_n']} of "
            f"{turn2.prompt_tokens} prompt tokens ({reuse:.1%}) on slot {turn2.request['id_slot']}"
        )


# --- cancel ------------------------------------------------------------------------------------


def test_a_cancelled_child_frees_its_slot_within_3_s(
    proxy: Proxy, llama_server: str, tmp_path: Path, figures: list[str]
) -> None:
    def edit_request(body: dict[str, Any]) -> dict[str, Any]:
        body = greedy(body)
        if body["id_slot"] == 1:  # the child: generate until cancelled
            body = {**body, "max_tokens": 3000, "ignore_eos": True}
        return body

    def edit_answer(request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        if request["id_slot"] == 0 and is_first_request(request):
            return as_tool_call(answer, "subagent", json.dumps({"task": "Write a long essay."}))
        return answer

    proxy.edit_request, proxy.edit_answer = edit_request, edit_answer
    with Runtime.start(config(tmp_path, proxy)) as rt:
        events = Probe.start(rt.directory)
        rt.subscribe(events.tell)
        rt.send_turn("p", "PARENT: have a helper write an essay.")
        proxy.wait_for_request(2, TURN_S)  # the child's request is on its way
        # Cancel while it generates: a cancel lands between two decode steps, and the prompt
        # is one step (seconds long on a busy CPU).
        assert poll(lambda: generating(llama_server, 1), every=1.0, within=120)
        cancelled_at = time.monotonic()
        assert "p" in rt.cancel("p")
        # The server notices a closed connection only after a quiet second: poll once a second.
        idle = poll(lambda: not slots(llama_server)[1]["is_processing"], every=1.0, within=3.0)
        idle_after = time.monotonic() - cancelled_at
        events.stop()
    assert idle, f"slot 1 still generating {idle_after:.1f} s after the cancel"
    figures.append(f"cancel to idle slot: within {idle_after:.1f} s (polled once a second)")


def poll(check: Any, *, every: float, within: float) -> bool:
    """Ask the server ``check()`` every ``every`` seconds until it is true or ``within``
    seconds have passed; the last answer. The server is another process: nothing can signal."""
    deadline = time.monotonic() + within
    pause = threading.Event()
    while True:
        pause.wait(min(every, max(0.0, deadline - time.monotonic())))
        if check():
            return True
        if time.monotonic() >= deadline:
            return False


# --- bounds ------------------------------------------------------------------------------------


def _long_history(pairs: int) -> tuple[ChatMessage, ...]:
    filler = "The quick brown fox jumps over the lazy dog while counting sheep. " * 14
    messages = []
    for n in range(pairs):
        messages.append(ChatMessage("user", f"Note {n}: {filler}"))
        messages.append(ChatMessage("assistant", f"Noted {n}."))
    return tuple(messages)


def _stored_long_session(home: Path, session: str) -> int:
    home.mkdir(parents=True, exist_ok=True)
    history = _long_history(24)  # ~22,000 characters: more than a 4,096-token slot holds
    with SessionStore(home / DB_NAME) as store:
        store.create(session, Baseline("You are a helpful assistant. Answer briefly."), 0)
        store.append(session, history, turns=24, next_call_id=1, untrusted=False)
    return sum(len(m.content or "") for m in history)


@pytest.mark.parametrize("context_known", [True, False], ids=["props", "refused"])
def test_a_transcript_longer_than_the_slot_compacts_and_goes_on(
    proxy: Proxy, tmp_path: Path, context_known: bool, figures: list[str]
) -> None:
    proxy.edit_request = greedy
    proxy.hide_props = not context_known  # unknown: the server's refusal tells
    home = tmp_path / "home"
    chars = _stored_long_session(home, "long")
    cfg = config(home, proxy).replace(compact=CompactConfig(summary_chars=400))
    with Runtime.start(cfg) as rt:
        events = Probe.start(rt.directory)
        rt.subscribe(events.tell)
        outcome = rt.run_turn("long", "What is two plus two?", timeout=TURN_S)
        assert isinstance(outcome, TurnCompleted), outcome
        events.expect(Compacted, timeout=10)
        again = rt.run_turn("long", "And three plus three?", timeout=TURN_S)
        assert isinstance(again, TurnCompleted), again
        events.stop()
    statuses = [e.status for e in proxy.exchanges]
    summaries = [
        e for e in proxy.exchanges if e.request["messages"][-1]["content"] == COMPACT_INSTRUCTION
    ]
    assert len(summaries) == 1
    if context_known:
        assert 400 not in statuses  # compacted before the server had to refuse
    else:
        assert statuses.count(400) == 1  # refused once, compacted, sent again
    source = "from /props" if context_known else "unknown"
    figures.append(
        f"long transcript ({chars} chars, context {source}): "
        f"statuses {statuses}; summary prompt {summaries[0].prompt_tokens} tokens"
    )


def test_tool_arguments_that_are_not_json_do_not_break_the_next_turn(
    proxy: Proxy, tmp_path: Path
) -> None:
    proxy.edit_request = greedy

    def edit_answer(request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        if is_first_request(request):
            return as_tool_call(answer, "subagent", '{"task": "unterminated')
        return answer

    proxy.edit_answer = edit_answer
    with Runtime.start(config(tmp_path, proxy)) as rt:
        first = rt.run_turn("args", "PARENT: call a tool.", timeout=TURN_S)
        second = rt.run_turn("args", "Say hi.", timeout=TURN_S)
    assert isinstance(first, TurnCompleted), first
    assert isinstance(second, TurnCompleted), second
    assert [e.status for e in proxy.exchanges] == [200, 200, 200]
    sent = proxy.exchanges[-1].request["messages"]
    call = next(m for m in sent if m.get("tool_calls"))["tool_calls"][0]
    assert call["function"]["arguments"] == "{}"


def test_an_answer_cut_at_max_tokens_is_reported(proxy: Proxy, tmp_path: Path) -> None:
    proxy.edit_request = greedy
    with Runtime.start(config(tmp_path, proxy, max_tokens=5, on_length="fail")) as rt:
        outcome = rt.run_turn("cut", "Write a long story about a dragon.", timeout=TURN_S)
    (exchange,) = proxy.exchanges
    assert exchange.answer is not None
    assert exchange.answer["choices"][0]["finish_reason"] == "length"
    assert isinstance(outcome, TurnFailed)
    assert outcome.reason is FailReason.MODEL_ERROR
    assert "hit max_tokens (5 tokens, model.max_tokens)" in outcome.detail


# --- typed results -----------------------------------------------------------------------------


class Greeting(msgspec.Struct):
    name: str
    words: int


def _prefix_only_extended(exchanges: list[Any]) -> None:
    for before, after in itertools.pairwise(e.request for e in exchanges):
        assert after["messages"][: len(before["messages"])] == before["messages"]
        assert after["tools"] == before["tools"]


def test_a_typed_turn_runs_on_the_real_server_whatever_the_tiny_model_answers(
    proxy: Proxy, tmp_path: Path
) -> None:
    """loopd's handling, not the model's skill: the server takes the final_answer tool (its
    schema turned into a grammar with --jinja) and every later request, and the turn ends
    either with a validated value or OUTPUT_INVALID / TURN_LIMIT after the nudges."""
    proxy.edit_request = greedy
    base = config(tmp_path, proxy)
    typed = base.replace(loop=msgspec.structs.replace(base.loop, output_retries=1, max_steps=4))
    with Runtime.start(typed) as rt:
        outcome = rt.run_turn(
            "typed",
            "Greet Ada: call final_answer with her name and 2.",
            timeout=TURN_S,
            output=Greeting,
        )
    assert all(e.status == 200 for e in proxy.exchanges)
    # The typed session's own requests (a child the model may spawn runs on slot 1, untyped).
    exchanges = [e for e in proxy.exchanges if e.request["id_slot"] == 0]
    assert exchanges
    for exchange in exchanges:
        names = [t["function"]["name"] for t in exchange.request["tools"]]
        assert "final_answer" in names
    _prefix_only_extended(exchanges)
    if isinstance(outcome, TurnCompleted):
        assert isinstance(outcome.output, Greeting)
        assert msgspec.json.decode(outcome.content, type=Greeting) == outcome.output
    else:
        assert outcome.reason in (FailReason.OUTPUT_INVALID, FailReason.TURN_LIMIT), outcome
        assert len(exchanges) >= 2  # it was asked again at least once


def test_a_typed_retry_history_is_accepted_by_the_real_server(proxy: Proxy, tmp_path: Path) -> None:
    """An invalid final_answer (denied naming the field), then a valid one: the server takes
    the history with the denial, and the turn returns the Struct."""
    proxy.edit_request = greedy
    answers = iter(
        [json.dumps({"name": "Ada", "words": "two"}), json.dumps({"name": "Ada", "words": 2})]
    )

    def edit_answer(request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        return as_tool_call(answer, "final_answer", next(answers, '{"name": "x", "words": 0}'))

    proxy.edit_answer = edit_answer
    with Runtime.start(config(tmp_path, proxy)) as rt:
        outcome = rt.run_turn("retry", "Greet Ada.", timeout=TURN_S, output=Greeting)
    assert isinstance(outcome, TurnCompleted), outcome
    assert outcome.output == Greeting("Ada", 2)
    first, second = proxy.exchanges
    assert [first.status, second.status] == [200, 200]
    denial = second.request["messages"][-1]["content"]
    assert denial.startswith("Denied: the arguments are not valid for this tool: ")
    assert "$.words" in denial
    _prefix_only_extended([first, second])
