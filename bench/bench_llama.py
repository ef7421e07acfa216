"""loopd against a real llama-server: four sessions at once, and slot pinning.

Run: python bench/bench_llama.py [URL] [--rounds N] [--share-rounds N] [--pinning-rounds N]
[--threads N]. Without URL it starts the llama lane's server itself (tests/llama/llama_server.py:
the build of ``.ci/build-llama-server``, ``-np 4 -c 8192 -t N --metrics --slot-save-path DIR``).
``-t 1`` by default: on 2 cores shared with other work, ``-t 2`` swung eightfold between rounds
(6 to 50 tokens/s) as llama.cpp's two threads waited for each other, and one thread leaves the
other core to loopd and the direct client. A URL must name a server started so: 4 slots or more,
``--metrics`` for the server's own counters, ``--slot-save-path`` so slots can be erased. The
figures are printed and appended to ``$LOOPD_LLAMA_FIGURES`` when it is set. Nothing here is
asserted: the targets are in docs/performance.md.

Four sessions at once (``--rounds``, default 3): four new sessions each run two turns (a
question, then "say that again") through loopd, the four turns of each step at once, on a
4-slot server (``slots.main = [0, 1, 2, 3]``); against the same four requests sent straight
(aiohttp, from one event loop, four at once): the bodies loopd sent, read through a recording
proxy in a first, unmeasured run, with each direct second request carrying the direct first
answer. Each answer is exactly ``GENERATE`` tokens (``ignore_eos``, temperature 0), every slot is
erased before each block, and the blocks alternate (loopd first in even rounds, direct first in
odd ones), so a machine that gets busier or quieter meets both alike. Measured per block:
generated tokens / wall time; the server's own figures from ``GET /metrics`` (its generation
rate per sequence, its ``llama_decode`` calls: four sequences decoded together take one call a
step, one after another four; the share of the wall time it worked on the block); the share of
the second turns' prompt tokens served from the slot's cache
(``usage.prompt_tokens_details.cached_tokens``, which is ``timings.cache_n``).

The client's share (``--share-rounds``, default 2): the same blocks, loopd and direct both
through the recording proxy, alternated: the time of each block outside the server (until the
last of a step's requests reached the proxy, and after the last answer left the server), which
is loopd's own cost against a direct client's, whatever the server's pace.

Slot pinning (``--pinning-rounds``, default 1): a parent, its child and the parent again, pinned
(``id_slot``, loopd's way) and placed by the server (``id_slot`` removed): how many prompt tokens
the parent's request after its child reused, and its time to first token.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "llama"))

from llama_proxy import Exchange, Proxy
from llama_server import Server, running_server

from actors import Config, Runtime
from actors.core.config import AgentConfig, LoopConfig, ModelConfig, SlotsConfig
from messages import TurnCompleted

SESSIONS = 4
GENERATE = 48
TURN_S = 600.0

# --- the server ---------------------------------------------------------------------------------


def erase_slots(server: str, total: int) -> None:
    """Empty every slot's cache, so each block starts cold (needs ``--slot-save-path``)."""
    for slot in range(total):
        response = httpx.post(f"{server}/slots/{slot}?action=erase", timeout=30)
        response.raise_for_status()


def total_slots(server: str) -> int:
    """The server's ``total_slots`` (``GET /props``)."""
    return int(httpx.get(f"{server}/props", timeout=10).json()["total_slots"])


def metrics(server: str) -> dict[str, float]:
    """The server's ``llamacpp:`` counters (``GET /metrics``, needs ``--metrics``)."""
    found: dict[str, float] = {}
    for line in httpx.get(f"{server}/metrics", timeout=10).text.splitlines():
        if line.startswith("llamacpp:"):
            name, value = line.split()[:2]
            found[name.removeprefix("llamacpp:")] = float(value)
    return found


@contextlib.contextmanager
def started_server(cpu_threads: int) -> Iterator[Server]:
    """The lane's llama-server with four slots, the metrics endpoint and slot erasing."""
    with tempfile.TemporaryDirectory() as folder:
        extra = ("--metrics", "--slot-save-path", folder)
        log = Path(folder) / "server.log"
        with running_server(SESSIONS, 8192, log, extra, cpu_threads) as server:
            yield server


# --- four sessions at once ----------------------------------------------------------------------

SYSTEM = "You are a helpful assistant. Answer in plain sentences."
ASKS = (
    "Write a short poem about the sea.",
    "Name three fruits and say why each is good.",
    "Explain in a few lines what a to-do list is for.",
    "Tell a short story about a cat and a boat.",
)
AGAIN = "Say that again in other words."


def four_config(home: str, base_url: str) -> Config:
    """Four top-level sessions on four slots; answers of exactly ``GENERATE`` tokens."""
    return Config(
        home=home,
        model=ModelConfig(
            base_url=base_url, name="smollm2", max_tokens=GENERATE, on_length="keep", retries=0
        ),
        slots=SlotsConfig(main=(0, 1, 2, 3), background=(0, 1, 2, 3)),
        loop=LoopConfig(system_prompt=SYSTEM),
        # No tools: a tiny model made to write GENERATE tokens must not write a tool call.
        agents={
            "default": AgentConfig(tools=(), temperature=0, seed=1, extra_body={"ignore_eos": True})
        },
    )


@dataclass
class Block:
    """One block: four sessions' two turns, by loopd or sent straight."""

    kind: str
    wall_s: float
    steps_s: tuple[float, float]
    generated: int
    second_prompt: int
    second_cached: int
    server: dict[str, float]
    cpu_s: tuple[float, float | None] = (0.0, None)
    """CPU seconds of this process (loopd or the direct client) and of the server, if known."""

    @property
    def tokens_s(self) -> float:
        return self.generated / self.wall_s

    @property
    def reuse(self) -> float:
        return self.second_cached / self.second_prompt if self.second_prompt else 0.0

    @property
    def server_tokens_s(self) -> float:
        seconds = self.server.get("tokens_predicted_seconds_total", 0.0)
        return self.server.get("tokens_predicted_total", 0.0) / seconds if seconds else 0.0

    @property
    def busy_s(self) -> float:
        """How long the server worked on the block: its prompt and generation seconds, which
        it counts per request, over the four requests it ran side by side. An estimate (the
        four do not start in the same step), the same for loopd and direct."""
        seconds = self.server.get("prompt_seconds_total", 0.0)
        return (seconds + self.server.get("tokens_predicted_seconds_total", 0.0)) / SESSIONS

    @property
    def busy_share(self) -> float:
        """The share of the wall time the server worked on the block."""
        return self.busy_s / self.wall_s


def _diff(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after if k.endswith("_total")}


Bodies = tuple[list[dict[str, Any]], list[dict[str, Any]]]
"""The four first requests' bodies, and the four second ones', in the order of ``ASKS``."""


def capture(server: str) -> Bodies:
    """The bodies loopd sends for the four sessions' two turns, read through the proxy."""
    proxy = Proxy(server).start()
    try:
        with (
            tempfile.TemporaryDirectory() as home,
            Runtime.start(four_config(home, proxy.base_url)) as rt,
            ThreadPoolExecutor(SESSIONS) as pool,
        ):
            list(pool.map(lambda i: _turn(rt, f"capture-{i}", ASKS[i]), range(SESSIONS)))
            list(pool.map(lambda i: _turn(rt, f"capture-{i}", AGAIN), range(SESSIONS)))
        exchanges = proxy.wait_for(2 * SESSIONS, 60)
    finally:
        proxy.stop()

    def by_session(step: str | None) -> list[dict[str, Any]]:
        bodies = [
            e.request
            for e in exchanges
            if (e.request["messages"][-1]["content"] == AGAIN) == (step == AGAIN)
        ]
        return sorted(bodies, key=lambda b: ASKS.index(b["messages"][1]["content"]))

    return by_session(None), by_session(AGAIN)


def _turn(rt: Runtime, session: str, text: str) -> TurnCompleted:
    outcome = rt.run_turn(session, text, timeout=TURN_S)
    if not isinstance(outcome, TurnCompleted):
        raise RuntimeError(f"{session}: {outcome}")
    return outcome


class Clocks:
    """Wall time, this process's CPU time and the server's (when it is this bench's child)."""

    def __init__(self, server_cpu: Callable[[], float] | None) -> None:
        self.server_cpu = server_cpu
        self.marks: list[tuple[float, float, float | None]] = []

    def mark(self) -> None:
        """Note the three clocks now."""
        server = self.server_cpu() if self.server_cpu else None
        # The monotonic clock: the proxy's exchanges are stamped with it.
        self.marks.append((time.monotonic(), time.process_time(), server))

    def steps(self) -> tuple[float, float]:
        """The wall time of each of the two steps."""
        (a, _, _), (b, _, _), (c, _, _) = self.marks
        return b - a, c - b

    def cpu(self) -> tuple[float, float | None]:
        """This process's CPU seconds from the first mark to the last, and the server's."""
        (_, mine0, server0), *_, (_, mine1, server1) = self.marks
        server = server1 - server0 if server0 is not None and server1 is not None else None
        return mine1 - mine0, server


def loopd_block(
    rt: Runtime, server: str, pool: ThreadPoolExecutor, name: str, clocks: Clocks
) -> Block:
    """Four new sessions, two turns each, the four of each step at once, through loopd."""
    erase_slots(server, SESSIONS)
    before = metrics(server)
    clocks.mark()
    first = list(pool.map(lambda i: _turn(rt, f"{name}-{i}", ASKS[i]), range(SESSIONS)))
    clocks.mark()
    second = list(pool.map(lambda i: _turn(rt, f"{name}-{i}", AGAIN), range(SESSIONS)))
    clocks.mark()
    server_figures = _diff(before, metrics(server))
    outcomes = first + second
    return Block(
        "loopd",
        sum(clocks.steps()),
        clocks.steps(),
        sum(o.usage.completion_tokens for o in outcomes),
        sum(o.usage.prompt_tokens for o in second),
        sum(o.usage.cached_tokens for o in second),
        server_figures,
        clocks.cpu(),
    )


async def _post(client: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with client.post(url, data=json.dumps(body).encode(), headers=_HEADERS) as response:
        response.raise_for_status()
        answer: dict[str, Any] = await response.json()
        return answer


_HEADERS = {"Content-Type": "application/json"}


def _with_answer(body: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """``body`` (a second turn's) with its assistant message the first ``answer``'s text."""
    messages = list(body["messages"])
    at = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    text = answer["choices"][0]["message"].get("content")
    messages[at] = {**messages[at], "content": text}
    return {**body, "messages": messages}


async def direct_block(
    client: aiohttp.ClientSession,
    server: str,
    bodies: Bodies,
    clocks: Clocks,
) -> Block:
    """The same four requests, then the four second ones, sent straight, four at once."""
    url = f"{server}/v1/chat/completions"
    erase_slots(server, SESSIONS)
    before = metrics(server)
    clocks.mark()
    first = await asyncio.gather(*(_post(client, url, b) for b in bodies[0]))
    clocks.mark()
    follow = [_with_answer(b, a) for b, a in zip(bodies[1], first, strict=True)]
    second = await asyncio.gather(*(_post(client, url, b) for b in follow))
    clocks.mark()
    server_figures = _diff(before, metrics(server))
    usages = [a["usage"] for a in first + second]
    return Block(
        "direct",
        sum(clocks.steps()),
        clocks.steps(),
        sum(u["completion_tokens"] for u in usages),
        sum(a["usage"]["prompt_tokens"] for a in second),
        sum(a["usage"]["prompt_tokens_details"]["cached_tokens"] for a in second),
        server_figures,
        clocks.cpu(),
    )


def four_sessions(
    server: str,
    rounds: int,
    bodies: Bodies,
    threads_note: str,
    server_cpu: Callable[[], float] | None,
) -> list[str]:
    """Alternated blocks of loopd and direct; the figures' lines."""
    load_at_start = os.getloadavg()[0]
    lines = []
    pairs: list[tuple[Block, Block]] = []
    loop = asyncio.new_event_loop()
    client = loop.run_until_complete(_client())
    try:
        with (
            tempfile.TemporaryDirectory() as home,
            Runtime.start(four_config(home, f"{server}/v1")) as rt,
            ThreadPoolExecutor(SESSIONS) as pool,
        ):
            for n in range(rounds):
                # loopd first in even rounds, direct first in odd ones.
                if n % 2:
                    theirs = loop.run_until_complete(
                        direct_block(client, server, bodies, Clocks(server_cpu))
                    )
                mine = loopd_block(rt, server, pool, f"r{n}", Clocks(server_cpu))
                if not n % 2:
                    theirs = loop.run_until_complete(
                        direct_block(client, server, bodies, Clocks(server_cpu))
                    )
                pairs.append((mine, theirs))
                lines.append(_round_line(n, mine, theirs))
                print(lines[-1], flush=True)
    finally:
        loop.run_until_complete(client.close())
        loop.close()
    load = f"{load_at_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    lines.append(_summary(pairs, threads_note, load))
    return lines


def _outside(clocks: Clocks, exchanges: list[Exchange]) -> tuple[float, float]:
    """A block run through the proxy: the seconds of its two steps before their last request
    reached the proxy and after their last answer left the server (the client's share, loopd's
    or the direct one's, with the proxy's hop), and the server's own seconds for the slowest
    request of each step (``timings.prompt_ms`` + ``predicted_ms``)."""
    start, middle, end = (mark[0] for mark in clocks.marks)
    client = server = 0.0
    for begin, finish, step in ((start, middle, exchanges[:4]), (middle, end, exchanges[4:])):
        sent = max(e.started for e in step) - begin
        answered = finish - max(e.started + (e.seconds or 0.0) for e in step)
        client += sent + answered
        server += max(e.timings["prompt_ms"] + e.timings["predicted_ms"] for e in step) / 1000
    return client, server


def client_share(server: str, rounds: int, bodies: Bodies) -> list[str]:
    """loopd and the direct client through the recording proxy, alternated: the time each
    takes outside the server; the figures' lines."""
    proxy = Proxy(server).start()
    root = proxy.base_url.removesuffix("/v1")  # erase and metrics go through it as well
    loop = asyncio.new_event_loop()
    client = loop.run_until_complete(_client())
    found: dict[str, list[tuple[float, float, float]]] = {"loopd": [], "direct": []}
    try:
        with (
            tempfile.TemporaryDirectory() as home,
            Runtime.start(four_config(home, proxy.base_url)) as rt,
            ThreadPoolExecutor(SESSIONS) as pool,
        ):
            for n in range(rounds):
                for kind in ("loopd", "direct") if n % 2 == 0 else ("direct", "loopd"):
                    clocks = Clocks(None)
                    first = len(proxy.exchanges)
                    if kind == "loopd":
                        block = loopd_block(rt, root, pool, f"share{n}", clocks)
                    else:
                        block = loop.run_until_complete(direct_block(client, root, bodies, clocks))
                    outside, busy = _outside(clocks, proxy.exchanges[first:])
                    found[kind].append((outside, busy, block.wall_s))
    finally:
        loop.run_until_complete(client.close())
        loop.close()
        proxy.stop()

    def ms(kind: str) -> str:
        values = [o * 1000 for o, _, _ in found[kind]]
        return f"{statistics.median(values):.0f} ms ({min(values):.0f}-{max(values):.0f})"

    extra = [(m[0] - t[0]) / m[2] for m, t in zip(found["loopd"], found["direct"], strict=True)]
    line = (
        f"through a recording proxy ({rounds} alternated rounds): time outside the server a "
        f"block (both steps: until the last of the four requests reached it, after the last "
        f"answer left it): loopd {ms('loopd')}, direct {ms('direct')}; loopd's extra "
        f"{statistics.median(extra):.2%} of its block's wall time ({min(extra):.2%}-"
        f"{max(extra):.2%}); the server's own time for the slowest request of each step, "
        f"loopd {statistics.median(b for _, b, _ in found['loopd']):.2f} s, direct "
        f"{statistics.median(b for _, b, _ in found['direct']):.2f} s a block"
    )
    print(line, flush=True)
    return [line]


async def _client() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TURN_S))


def _round_line(n: int, mine: Block, theirs: Block) -> str:
    def one(b: Block) -> str:
        mine, server = b.cpu_s
        cpu = f"CPU {mine:.2f} s" + (f", server's {server:.2f} s" if server is not None else "")
        return (
            f"{b.kind} {b.tokens_s:.1f} tok/s ({b.generated} tokens in {b.wall_s:.2f} s: "
            f"{b.steps_s[0]:.2f} + {b.steps_s[1]:.2f}; {cpu}; server {b.server_tokens_s:.1f} tok/s "
            f"a sequence, {b.server.get('n_decode_total', 0):.0f} decode calls, busy "
            f"{b.busy_s:.2f} s; turn 2 reused "
            f"{b.second_cached} of {b.second_prompt} prompt tokens)"
        )

    ratio = mine.tokens_s / theirs.tokens_s
    busy = mine.busy_share / theirs.busy_share
    return (
        f"4 at once, round {n}: {one(mine)}; {one(theirs)}; ratio {ratio:.3f}, "
        f"busy-share ratio {busy:.3f}"
    )


def _summary(pairs: list[tuple[Block, Block]], threads_note: str, load: str) -> str:
    ratios = [m.tokens_s / t.tokens_s for m, t in pairs]
    mine = [m.tokens_s for m, _ in pairs]
    theirs = [t.tokens_s for _, t in pairs]
    reuse_m = [m.reuse for m, _ in pairs]
    reuse_t = [t.reuse for _, t in pairs]
    busy = [m.busy_share / t.busy_share for m, t in pairs]
    return (
        f"4 sessions at once on 4 slots ({len(pairs)} alternated rounds, {threads_note}, load "
        f"{load}): loopd {statistics.median(mine):.1f} tok/s "
        f"({min(mine):.1f}-{max(mine):.1f}), direct {statistics.median(theirs):.1f} tok/s "
        f"({min(theirs):.1f}-{max(theirs):.1f}); loopd / direct median "
        f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}); share of the "
        f"wall time the server worked, loopd / direct median {statistics.median(busy):.3f} "
        f"({min(busy):.3f}-{max(busy):.3f}); turn 2 prompt from the cache: loopd "
        f"{min(reuse_m):.1%}-{max(reuse_m):.1%}, direct "
        f"{min(reuse_t):.1%}-{max(reuse_t):.1%}"
    )


# --- slot pinning: parent, child, parent --------------------------------------------------------

PINNING_SYSTEM = (
    "You are a careful assistant working inside loopd. Use the tools when they help. Keep "
    "answers short. " + "Background notes for the session: the project tracks tasks. " * 60
)


def pinning_round(server: str, pinned: bool, n: int) -> dict[str, Any]:
    """One parent turn with one child; the parent's request after the child, as measured."""
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
                loop=LoopConfig(system_prompt=PINNING_SYSTEM),
            )
            with Runtime.start(config) as rt:
                rt.run_turn(f"p{n}", "PARENT: ask a helper to say hi.", timeout=TURN_S)
        first, _child, second = proxy.wait_for(3, 60)
    finally:
        proxy.stop()
    return {
        "first_prompt": first.prompt_tokens,
        "reused": second.timings["cache_n"],
        "prompt": second.prompt_tokens,
        "ttft_ms": second.timings["prompt_ms"],
    }


def pinning(server: str, rounds: int) -> list[str]:
    """Pinned rounds, then rounds placed by the server; the figures' lines."""
    lines = []
    for pinned in (True, False):
        results = []
        for n in range(rounds):
            erase_slots(server, total_slots(server))
            results.append(pinning_round(server, pinned, n))
        name = "pinned (id_slot)" if pinned else "placed by the server"
        reused = statistics.median(r["reused"] for r in results)
        prompt = statistics.median(r["prompt"] for r in results)
        ttft = statistics.median(r["ttft_ms"] for r in results)
        lines.append(
            f"{name}: parent after child reused {reused:.0f} of {prompt:.0f} prompt tokens; "
            f"time to first token {ttft:.0f} ms (median of {rounds}; "
            f"rounds {[(r['reused'], round(r['ttft_ms'])) for r in results]})"
        )
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("server", nargs="?", help="a llama-server root URL; none: start one")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of four sessions at once")
    parser.add_argument("--share-rounds", type=int, default=2, help="rounds through the proxy")
    parser.add_argument("--pinning-rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="the started server's -t")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        server_cpu: Callable[[], float] | None = None
        if args.server:
            server, threads_note = args.server.rstrip("/"), "the given server"
        else:
            started = stack.enter_context(started_server(args.threads))
            server, threads_note, server_cpu = started.url, f"-t {args.threads}", started.cpu_s
        lines: list[str] = []
        if args.rounds or args.share_rounds:
            bodies = capture(server)
        if args.rounds:
            lines += four_sessions(server, args.rounds, bodies, threads_note, server_cpu)
            print(lines[-1], flush=True)
        if args.share_rounds:
            lines += client_share(server, args.share_rounds, bodies)
        lines += pinning(server, args.pinning_rounds) if args.pinning_rounds else []
    figures = os.environ.get("LOOPD_LLAMA_FIGURES")
    if figures:
        with open(figures, "a", encoding="utf-8") as out:
            out.write("".join(f"bench_llama: {line}\n" for line in lines))


if __name__ == "__main__":
    main()
