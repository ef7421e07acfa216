"""Fan-out over real HTTP: N children of one answer against a model that takes 200 ms.

Run: python bench/bench_fanout.py [--quick] [--home DIR] [--server asyncio|chatserver]. A fake
OpenAI-compatible server on 127.0.0.1, in a process of its own like a real server, answers every
request after ``--delay`` seconds; the runtime uses its real HTTP client and model service. The
server is ``bench/fake_llama.py`` (one asyncio loop, HTTP/1.1 keep-alive, as llama-server is);
``--server chatserver`` uses the test kit's ChatServer instead (a thread per connection, HTTP/1.0,
a poll per waiting request every 20 ms), which at 512 in flight is itself the bottleneck.
Each width runs a parent turn whose first answer calls ``subagent`` N times; the background
slot pool is as wide as the fan-out, so every child has a slot of its own (two requests never
share one), and only the fan-out limits are raised (``loop.max_children``,
``loop.max_children_total``); ``model.concurrency`` keeps its default (the runtime raises it to
``loop.max_children``).

Two figures per width, each a ratio to width 1 measured in the same run:
- ``turn``: the parent's whole turn (three model requests' worth of waiting, at best);
- ``children``: from the first SubagentStarted to the last SubagentFinished, that is one child's
  turn at width 1.

Targets (docs/performance.md): 32 children <= 1.3x one child, 512 children <= 2x. Nothing here
is asserted.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import fake_llama

from actors import Config, LoopConfig, ModelConfig, Runtime, SlotsConfig
from actors.testing import ChatServer
from actors.testing.chat_server import Delayed
from actors.testing.script import Answer, calls, reply
from messages import SubagentFinished, SubagentStarted, TurnCompleted, TurnEvent


class Answers:
    """The server's script (a class, so the server process can unpickle it)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def __call__(self, body: dict[str, Any]) -> Any:
        return script(self.delay)(body)


class DelayedAnswers:
    """The same script for fake_llama: the answer and its delay."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def __call__(self, body: dict[str, Any]) -> tuple[Answer, float]:
        step = script(self.delay)(body)
        assert isinstance(step, Delayed) and isinstance(step.step, Answer)
        return step.step, step.seconds


def serve_chatserver(delay: float, pipe: Connection) -> None:
    """The server process: serve until the pipe says stop, then report what it saw."""
    with ChatServer(Answers(delay)) as server:
        pipe.send(server.base_url)
        pipe.recv()
        pipe.send((server.most_in_flight, len(server.overlaps), len(server.requests)))


def serve_asyncio(delay: float, pipe: Connection) -> None:
    """The server process, on fake_llama."""
    fake_llama.serve(DelayedAnswers(delay), pipe)


@contextmanager
def server_process(delay: float, kind: str) -> Iterator[tuple[str, Connection]]:
    ours, theirs = multiprocessing.Pipe()
    target = serve_asyncio if kind == "asyncio" else serve_chatserver
    process = multiprocessing.get_context("spawn").Process(target=target, args=(delay, theirs))
    process.start()
    try:
        yield ours.recv(), ours
    finally:
        process.terminate() if process.is_alive() and not ours.closed else None
        process.join(10)


def script(delay: float) -> Any:
    def answer(body: dict[str, Any]) -> Any:
        first_user = next(m for m in body["messages"] if m["role"] == "user")
        if str(first_user["content"]).startswith("It is "):
            return Delayed(reply("child done"), delay)
        if body["messages"][-1]["role"] == "user":
            width = int(str(first_user["content"]).split()[-1])
            return Delayed(
                calls(*[("subagent", {"task": f"part {i}"}) for i in range(width)]), delay
            )
        return Delayed(reply("all done"), delay)

    return answer


class Span:
    """First SubagentStarted to last SubagentFinished of one parent's turn."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.first: float | None = None
        self.last: float | None = None

    def reset(self) -> None:
        with self.lock:
            self.first = self.last = None

    def see(self, event: TurnEvent) -> None:
        now = time.perf_counter()
        with self.lock:
            if isinstance(event, SubagentStarted) and self.first is None:
                self.first = now
            elif isinstance(event, SubagentFinished):
                self.last = now

    def seconds(self) -> float:
        assert self.first is not None and self.last is not None
        return self.last - self.first


def run_width(home: Path, base_url: str, width: int, rounds: int) -> tuple[float, float]:
    """Median seconds of (the parent's turn, the children's span) at ``width``."""
    config = Config(
        home=str(home / f"w{width}"),
        model=ModelConfig(base_url=base_url, name="bench", retries=0),
        slots=SlotsConfig(main=0, background=tuple(range(1, width + 1))),
        loop=LoopConfig(max_children=width, max_children_total=max(64, width)),
    )
    span = Span()
    turns: list[float] = []
    spans: list[float] = []
    with Runtime.start(config) as rt:
        rt.subscribe(span.see)
        for i in range(rounds + 1):  # the first round warms connections and the store
            span.reset()
            start = time.perf_counter()
            outcome = rt.run_turn(f"fan{width}-{i}", f"spawn {width}", timeout=300)
            took = time.perf_counter() - start
            assert isinstance(outcome, TurnCompleted) and outcome.content == "all done", outcome
            if i:
                turns.append(took)
                spans.append(span.seconds())
    return statistics.median(turns), statistics.median(spans)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer rounds, widths up to 32")
    parser.add_argument("--delay", type=float, default=0.2, help="the model's seconds per answer")
    parser.add_argument("--home", help="where the stores go (default: a temporary folder)")
    parser.add_argument(
        "--server", choices=("asyncio", "chatserver"), default="asyncio", help="the fake server"
    )
    args = parser.parse_args()
    rounds = 2 if args.quick else 5
    widths = [1, 32] if args.quick else [1, 32, 512]
    with (
        tempfile.TemporaryDirectory(dir=args.home) as home,
        server_process(args.delay, args.server) as (base_url, pipe),
    ):
        print(
            f"fan-out over HTTP, model delay {args.delay * 1e3:.0f} ms, store in {home}, "
            f"server {args.server}"
        )
        base_turn = base_span = 0.0
        for width in widths:
            turn, span = run_width(Path(home), base_url, width, rounds if width < 512 else 3)
            if width == 1:
                base_turn, base_span = turn, span
            print(
                f"  {width:>4} children: turn p50 {turn * 1e3:7.1f} ms ({turn / base_turn:4.2f}x), "
                f"children {span * 1e3:7.1f} ms ({span / base_span:4.2f}x one child)"
            )
        pipe.send("stop")
        most, overlaps, requests = pipe.recv()
        print(f"  server: {requests} requests, at most {most} in flight, {overlaps} on a busy slot")


if __name__ == "__main__":
    main()
