"""Four sessions at once on the real server's four slots: each gets a slot of its own, all four
requests are in flight together, and each session's next turn goes back to its slot.

What it costs against the same requests sent straight is measured by ``bench/bench_llama.py``,
not here: nothing in this file times anything.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from llama_proxy import Exchange, Proxy

from actors import Config, Runtime
from actors.core.config import AgentConfig, LoopConfig, ModelConfig, SlotsConfig
from messages import TurnCompleted

TURN_S = 120.0

ASKS = {
    "s0": "Write a short poem about the sea.",
    "s1": "Name three fruits.",
    "s2": "What is a to-do list for?",
    "s3": "Tell a short story about a cat.",
}


def four_slots(home: Path, proxy: Proxy) -> Config:
    # Answers of exactly 16 tokens (ignore_eos): every request keeps its slot busy for 16
    # decode steps, long after loopd has sent all four. No tools: a short prompt.
    return Config(
        home=str(home),
        model=ModelConfig(
            base_url=proxy.base_url, name="smollm2", max_tokens=16, on_length="keep", retries=0
        ),
        slots=SlotsConfig(main=(0, 1, 2, 3), background=(0, 1, 2, 3)),
        loop=LoopConfig(system_prompt="You are a helpful assistant. Answer briefly."),
        agents={
            "default": AgentConfig(tools=(), temperature=0, seed=1, extra_body={"ignore_eos": True})
        },
    )


def _session(exchange: Exchange) -> str:
    text = exchange.request["messages"][1]["content"]
    return next(s for s, ask in ASKS.items() if ask == text)


def _in_flight_together(exchanges: list[Exchange]) -> bool:
    """Every request was sent on before any answer came back."""
    ends = [e.started + (e.seconds or 0.0) for e in exchanges]
    return max(e.started for e in exchanges) < min(ends)


@pytest.mark.timeout(300)
def test_four_sessions_at_once_each_get_a_slot_and_keep_it(proxy: Proxy, tmp_path: Path) -> None:
    steps: list[dict[str, Any]] = [ASKS, dict.fromkeys(ASKS, "Say that again.")]
    with Runtime.start(four_slots(tmp_path, proxy)) as rt, ThreadPoolExecutor(4) as pool:
        for n, step in enumerate(steps, start=1):
            futures = {s: pool.submit(rt.run_turn, s, text, TURN_S) for s, text in step.items()}
            for session, future in futures.items():
                outcome = future.result(TURN_S)
                assert isinstance(outcome, TurnCompleted), (session, outcome)
                assert outcome.usage.completion_tokens == 16
            assert len(proxy.wait_for(4 * n, 10)) == 4 * n
    first, second = proxy.exchanges[:4], proxy.exchanges[4:]
    for exchanges in (first, second):
        assert all(e.status == 200 for e in exchanges)
        assert sorted(e.request["id_slot"] for e in exchanges) == [0, 1, 2, 3]
        assert _in_flight_together(exchanges), [(e.started, e.seconds) for e in exchanges]
    slot_of = {_session(e): e.request["id_slot"] for e in first}
    before = {_session(e): e for e in first}
    for exchange in second:
        session = _session(exchange)
        assert exchange.request["id_slot"] == slot_of[session]  # back to its own prefix
        # The slot kept the session's first prompt (and its answer): all of it is reused.
        assert exchange.timings["cache_n"] >= before[session].prompt_tokens, exchange.timings
