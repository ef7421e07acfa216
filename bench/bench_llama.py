"""Slot pinning against a real llama-server: a parent, its child, and the parent again.

Run: python bench/bench_llama.py URL [--rounds N], URL a llama-server root started as
docs/llama.md says (``-np 2``). Prints, for pinned requests (``id_slot``, loopd's way) and for
requests the server places itself (``id_slot`` removed), how many prompt tokens the parent's
request after its child reused, and its time to first token (prompt evaluation). The figures in
docs/performance.md come from it. Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "llama"))

from llama_proxy import Proxy

from actors import Config, Runtime
from actors.core.config import LoopConfig, ModelConfig, SlotsConfig

SYSTEM = (
    "You are a careful assistant working inside loopd. Use the tools when they help. Keep "
    "answers short. " + "Background notes for the session: the project tracks tasks. " * 60
)


def erase_slots(server: str, total: int = 2) -> None:
    """Empty every slot's cache, so each round starts cold."""
    for slot in range(total):
        httpx.post(f"{server}/slots/{slot}?action=erase", timeout=10)


def one_round(server: str, pinned: bool, n: int) -> dict[str, Any]:
    proxy = Proxy(server).start()

    def edit_request(body: dict[str, Any]) -> dict[str, Any]:
        body = {**body, "temperature": 0, "seed": 1}
        if not pinned:
            body.pop("id_slot", None)
        return body

    def edit_answer(request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        if all(m["role"] != "tool" for m in request["messages"]) and request["messages"][-1][
            "content"
        ].startswith("PARENT"):
            call = {
                "id": "call_x",
                "type": "function",
                "function": {"name": "subagent", "arguments": json.dumps({"task": "Say hi."})},
            }
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            choice = {**answer["choices"][0], "message": message, "finish_reason": "tool_calls"}
            return {**answer, "choices": [choice]}
        return answer

    proxy.edit_request, proxy.edit_answer = edit_request, edit_answer
    try:
        with tempfile.TemporaryDirectory() as home:
            config = Config(
                home=home,
                model=ModelConfig(base_url=proxy.base_url, max_tokens=32, on_length="keep"),
                slots=SlotsConfig(main=0, background=1),
                loop=LoopConfig(system_prompt=SYSTEM),
            )
            with Runtime.start(config) as rt:
                rt.run_turn(f"p{n}", "PARENT: ask a helper to say hi.", timeout=600)
        first, _child, second = proxy.wait_for(3, 60)
    finally:
        proxy.stop()
    return {
        "first_prompt": first.prompt_tokens,
        "reused": second.timings["cache_n"],
        "prompt": second.prompt_tokens,
        "ttft_ms": second.timings["prompt_ms"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("server", help="llama-server root URL, e.g. http://127.0.0.1:8080")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for pinned in (True, False):
        rounds = []
        for n in range(args.rounds):
            erase_slots(args.server)
            rounds.append(one_round(args.server, pinned, n))
        name = "pinned (id_slot)" if pinned else "placed by the server"
        reused = statistics.median(r["reused"] for r in rounds)
        prompt = statistics.median(r["prompt"] for r in rounds)
        ttft = statistics.median(r["ttft_ms"] for r in rounds)
        print(
            f"{name}: parent after child reused {reused:.0f} of {prompt:.0f} prompt tokens; "
            f"time to first token {ttft:.0f} ms (median of {args.rounds}; "
            f"rounds {[(r['reused'], round(r['ttft_ms'])) for r in rounds]})"
        )


if __name__ == "__main__":
    main()
