"""The price of a turn over real HTTP: loopd against the same requests sent straight.

Run: python bench/bench_wire.py [--quick] [--rounds N] [--disk DIR] [--tune-gc].
``bench/fake_llama.py`` serves in a process of its own (asyncio, HTTP/1.1 keep-alive, answers at
once); loopd's runtimes have ``model.base_url`` on it, and direct clients send it the very
bodies loopd sent (read back from the server's ``GET /v1/last``). Every loopd turn is on a new
session. The kinds run alternated in blocks of 20 in one run, so a machine that gets busier or
quieter meets each kind alike; each figure is the median over all its turns, with the range of
its blocks' medians, and each ratio the median of the ratios of blocks run side by side (with
their range).

Measured:
- one plain turn (one request) on a tmpfs home and on a disk home, against ``httpx.Client``;
  SQLite's own commit (WAL, ``synchronous=FULL``, the store's settings) in the same folder, so
  the disk figure reads as loopd / (request + commit), and again as loopd / (request + two
  commits): the contract's own floor, since the user's message is durable before the request
  and the answer before the outcome is told;
- a turn with one child (three requests) against the same three requests sent in a row;
- the model clients alone, one request at a time and 256 at once from one loop: loopd's
  ``HttpChatModel`` and the candidates (``httpx.AsyncClient``, ``aiohttp``);
- 256 concurrent turns from one loop through ``AsyncRuntime`` against the best direct async
  client's 256 requests;
- a streamed answer: the time to the first ``TextDelta`` event against a direct SSE client's
  first body byte.

With ``--tune-gc`` the process's collector is set as ``loopd serve`` sets its own
(``actors.tune_collector``) before anything is measured: loopd and the direct clients share this
process, so both run with it. Nothing here is asserted: the targets are in docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import aiohttp
import fake_llama
import httpx

from actors import Config, ModelConfig, Runtime, SlotsConfig, tune_collector
from actors.aio import AsyncRuntime
from actors.models.http import HttpChatModel
from actors.testing.script import Answer, calls, reply
from messages import ChatMessage, ModelRequest, RequestOptions, TextDelta, TurnCompleted, TurnEvent

BLOCK = 20
WIDE = 256
HEADERS = {"Content-Type": "application/json"}


# --- the server ---------------------------------------------------------------------------------


class Script:
    """The server's answers: a turn whose text is ``spawn`` calls one subagent, then ends; any
    other request (a plain turn, the child) gets a short reply. A class, so the server process
    can unpickle it."""

    def __call__(self, body: dict[str, Any]) -> tuple[Answer, float]:
        messages = body["messages"]
        spawn = any(m["role"] == "user" and "spawn" in str(m["content"]) for m in messages)
        if spawn and messages[-1]["role"] == "user":
            return calls(("subagent", {"task": "part one"})), 0.0
        if spawn:
            return reply("all done"), 0.0
        return reply("ok, that is done"), 0.0


def serve(pipe: Connection) -> None:
    """The server process."""
    fake_llama.serve(Script(), pipe)


@contextmanager
def server_process() -> Iterator[tuple[str, Connection]]:
    """fake_llama in a process of its own: its base URL and the pipe that stops it."""
    ours, theirs = multiprocessing.Pipe()
    process = multiprocessing.get_context("spawn").Process(target=serve, args=(theirs,))
    process.start()
    try:
        yield ours.recv(), ours
    finally:
        if process.is_alive():
            process.terminate()
        process.join(10)


def last_bodies(base_url: str, count: int) -> list[bytes]:
    """The bodies of the server's last ``count`` requests, as they were sent."""
    kept = httpx.get(base_url + "/last").json()
    return [json.dumps(body).encode() for body in kept[-count:]]


# --- figures ------------------------------------------------------------------------------------


@dataclass
class Figure:
    """The seconds of one kind, block by block."""

    blocks: list[list[float]] = field(default_factory=list)

    def add(self, block: list[float]) -> None:
        self.blocks.append(block)

    def median(self) -> float:
        return statistics.median(t for block in self.blocks for t in block)

    def medians(self) -> list[float]:
        return [statistics.median(block) for block in self.blocks]

    def ms(self) -> str:
        meds = self.medians()
        return f"{self.median() * 1e3:.2f} ms [{min(meds) * 1e3:.2f}-{max(meds) * 1e3:.2f}]"


def ratio(ours: Figure, *theirs: Figure) -> str:
    """The median, min and max over rounds of ours / the sum of theirs, block by block."""
    per_round = [
        mine / sum(other.medians()[i] for other in theirs) for i, mine in enumerate(ours.medians())
    ]
    return f"{statistics.median(per_round):.2f}x [{min(per_round):.2f}-{max(per_round):.2f}]"


def block(run: Callable[[], None], size: int = BLOCK) -> list[float]:
    """``size`` timings of ``run``."""
    times = []
    for _ in range(size):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times


# --- sequential ---------------------------------------------------------------------------------


class Turns:
    """A runtime whose every turn is on a new session."""

    def __init__(self, rt: Runtime, prefix: str) -> None:
        self.rt = rt
        self.prefix = prefix
        self.count = 0

    def turn(self, text: str, expect: str) -> None:
        self.count += 1
        outcome = self.rt.run_turn(f"{self.prefix}{self.count}", text, timeout=60)
        assert isinstance(outcome, TurnCompleted) and outcome.content == expect, outcome


def commit_timer(folder: Path) -> Callable[[], None]:
    """One SQLite commit of a small row, with the store's settings, in ``folder``."""
    conn = sqlite3.connect(folder / "commit.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS t (x TEXT)")

    def commit() -> None:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t VALUES ('a row of some forty bytes, as a turn writes')")
        conn.execute("COMMIT")

    return commit


def config(home: str, base_url: str, **model: Any) -> Config:
    return Config(home=home, model=ModelConfig(base_url=base_url, name="bench", **model))


def sequential(base_url: str, disk: Path, shm: Path, rounds: int) -> dict[str, Figure]:
    figures = {k: Figure() for k in ("d1", "tmp1", "disk1", "d3", "tmp3", "disk3", "commit")}
    with (
        Runtime.start(config(str(shm / "seq"), base_url, retries=0)) as rt_tmp,
        Runtime.start(config(str(disk / "seq"), base_url, retries=0)) as rt_disk,
        httpx.Client(base_url=base_url, headers=HEADERS) as client,
    ):
        tmp, on_disk = Turns(rt_tmp, "t"), Turns(rt_disk, "d")
        for turns in (tmp, on_disk):
            for _ in range(3):
                turns.turn("hi", "ok, that is done")
                turns.turn("spawn", "all done")
        tmp.turn("hi", "ok, that is done")
        (plain,) = last_bodies(base_url, 1)
        tmp.turn("spawn", "all done")
        child = last_bodies(base_url, 3)
        commit = commit_timer(disk)

        def direct(bodies: list[bytes]) -> Callable[[], None]:
            def send() -> None:
                for body in bodies:
                    assert client.post("/chat/completions", content=body).status_code == 200

            return send

        kinds: list[tuple[str, Callable[[], None]]] = [
            ("d1", direct([plain])),
            ("tmp1", lambda: tmp.turn("hi", "ok, that is done")),
            ("disk1", lambda: on_disk.turn("hi", "ok, that is done")),
            ("commit", commit),
            ("d3", direct(child)),
            ("tmp3", lambda: tmp.turn("spawn", "all done")),
            ("disk3", lambda: on_disk.turn("spawn", "all done")),
        ]
        for _ in range(rounds):
            for name, run in kinds:
                figures[name].add(block(run))
    return figures


# --- the clients alone, and 256 at once ---------------------------------------------------------


def model_request(number: int, stream: bool = False) -> ModelRequest:
    """A plain request for the model client alone; as the direct clients' 256 at once, it
    names no slot (the ``openai`` backend's body)."""
    return ModelRequest(
        session=f"b{number}",
        request_id=number,
        slot=0,
        messages=(ChatMessage("system", "You are terse."), ChatMessage("user", "hi")),
        tools=(),
        reply_to="nobody",
        options=RequestOptions(stream=stream, backend="openai"),
    )


Sender = Callable[[int], Awaitable[None]]


async def senders(base_url: str, body: bytes, stack: Any) -> dict[str, Sender]:
    """One request each, by every client measured: loopd's model client and the candidates."""
    url = base_url + "/chat/completions"
    ours = HttpChatModel(ModelConfig(base_url=base_url, name="bench", retries=0))
    stack.push_async_callback(ours.aclose)
    hx = httpx.AsyncClient(
        headers=HEADERS, limits=httpx.Limits(max_connections=WIDE, max_keepalive_connections=WIDE)
    )
    stack.push_async_callback(hx.aclose)
    aio = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=WIDE), headers=HEADERS)
    stack.push_async_callback(aio.close)

    async def loopd_client(i: int) -> None:
        await ours.acomplete(model_request(i))

    async def httpx_async(i: int) -> None:
        response = await hx.post(url, content=body)
        assert response.status_code == 200

    async def aiohttp_client(i: int) -> None:
        async with aio.post(url, data=body) as response:
            await response.read()
            assert response.status == 200

    return {
        "HttpChatModel": loopd_client,
        "httpx.AsyncClient": httpx_async,
        "aiohttp": aiohttp_client,
    }


async def one_at_a_time(send: Sender, size: int = BLOCK) -> list[float]:
    times = []
    for i in range(size):
        start = time.perf_counter()
        await send(i)
        times.append(time.perf_counter() - start)
    return times


async def wide(send: Sender) -> float:
    """Seconds for WIDE requests at once."""
    start = time.perf_counter()
    await asyncio.gather(*(send(i) for i in range(WIDE)))
    return time.perf_counter() - start


async def concurrent(base_url: str, body: bytes, shm: Path, rounds: int) -> dict[str, Any]:
    from contextlib import AsyncExitStack

    seq: dict[str, Figure] = {}
    rates: dict[str, list[float]] = {}
    cfg = Config(
        home=str(shm / "wide"),
        model=ModelConfig(base_url=base_url, name="bench", retries=0, concurrency=WIDE),
        slots=SlotsConfig(main=tuple(range(WIDE))),
    )
    async with AsyncExitStack() as stack, AsyncRuntime.start(cfg) as rt:
        clients = await senders(base_url, body, stack)
        count = 0

        async def turn(i: int) -> None:
            nonlocal count
            count += 1
            outcome = await rt.run_turn(f"w{count}", "hi", timeout=120)
            assert isinstance(outcome, TurnCompleted), outcome

        everyone = {**clients, "AsyncRuntime turns": turn}
        for send in everyone.values():  # warm: connections, the store, the code
            await wide(send)
        for _ in range(rounds):
            for name, send in everyone.items():
                if name != "AsyncRuntime turns":
                    seq.setdefault(name, Figure()).add(await one_at_a_time(send))
                rates.setdefault(name, []).append(WIDE / await wide(send))
    return {"seq": seq, "rates": rates}


# --- streaming ----------------------------------------------------------------------------------


def first_delta(base_url: str, shm: Path, rounds: int) -> tuple[Figure, Figure]:
    """The time to the first TextDelta of a streamed turn, and a direct SSE client's first
    body byte, block by block."""
    ours, theirs = Figure(), Figure()
    firsts: dict[str, float] = {}
    seen = threading.Event()

    def see(event: TurnEvent) -> None:
        if isinstance(event, TextDelta) and event.session not in firsts:
            firsts[event.session] = time.perf_counter()
            seen.set()

    with (
        Runtime.start(config(str(shm / "stream"), base_url, retries=0, stream=True)) as rt,
        httpx.Client(base_url=base_url, headers=HEADERS) as client,
    ):
        rt.subscribe(see)
        count = 0

        def turn() -> float:
            nonlocal count
            count += 1
            session = f"s{count}"
            seen.clear()
            start = time.perf_counter()
            outcome = rt.run_turn(session, "hi", timeout=60)
            assert isinstance(outcome, TurnCompleted), outcome
            assert seen.wait(10)
            return firsts[session] - start

        for _ in range(3):
            turn()
        (body,) = last_bodies(base_url, 1)
        assert b'"stream":true' in body.replace(b" ", b"")

        def direct() -> float:
            start = time.perf_counter()
            first = None
            with client.stream("POST", "/chat/completions", content=body) as response:
                for _chunk in response.iter_raw():
                    if first is None:
                        first = time.perf_counter() - start
            assert first is not None
            return first

        for _ in range(rounds):
            theirs.add([direct() for _ in range(BLOCK)])
            ours.add([turn() for _ in range(BLOCK)])
    return ours, theirs


# --- the table ----------------------------------------------------------------------------------


def rate(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f}/s [{min(values):,.0f}-{max(values):,.0f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3 rounds instead of 10")
    parser.add_argument("--rounds", type=int, help="rounds of blocks (default 10)")
    parser.add_argument("--disk", help="the disk folder for the disk home (default: /tmp)")
    parser.add_argument(
        "--tune-gc", action="store_true", help="the collector as loopd serve sets it, for all"
    )
    args = parser.parse_args()
    if args.tune_gc:
        tune_collector()
    rounds = args.rounds or (3 if args.quick else 10)
    shm_root = "/dev/shm" if os.path.isdir("/dev/shm") else None
    load = os.getloadavg()
    with (
        tempfile.TemporaryDirectory(dir=shm_root) as shm,
        tempfile.TemporaryDirectory(dir=args.disk) as disk,
        server_process() as (base_url, pipe),
    ):
        seq = sequential(base_url, Path(disk), Path(shm), rounds)
        (plain,) = last_bodies(base_url, 1)
        # The direct clients' 256 at once leave id_slot out (all would name slot 0), so the
        # server's count of requests on a busy slot is loopd's alone.
        unslotted = json.loads(plain)
        unslotted.pop("id_slot", None)
        plain = json.dumps(unslotted).encode()
        many = asyncio.run(concurrent(base_url, plain, Path(shm), max(3, rounds // 2)))
        ours, theirs = first_delta(base_url, Path(shm), rounds)
        pipe.send("stop")
        most, overlaps, requests = pipe.recv()

    print(
        f"bench_wire: {rounds} rounds of blocks of {BLOCK}, python {sys.version.split()[0]}, "
        f"{os.cpu_count()} cores, load average {load[0]:.1f} at the start; "
        f"{'the collector tuned (tune_collector); ' if args.tune_gc else ''}"
        f"median [range of block medians]"
    )
    print("| what (median) | loopd | the same requests sent straight | ratio |")
    print("| --- | --- | --- | --- |")
    d1, d3, commit = seq["d1"], seq["d3"], seq["commit"]
    print(
        f"| one plain turn, tmpfs home | {seq['tmp1'].ms()} | httpx.Client: {d1.ms()} | "
        f"{ratio(seq['tmp1'], d1)} |"
    )
    print(
        f"| one plain turn, disk home | {seq['disk1'].ms()} | + one SQLite commit "
        f"{commit.ms()} | {ratio(seq['disk1'], d1, commit)} |"
    )
    print(
        f"| the same, against the contract's floor | | + two SQLite commits (the message "
        f"before the request, the answer before the outcome) | "
        f"{ratio(seq['disk1'], d1, commit, commit)} |"
    )
    print(
        f"| a turn with one child (3 requests), tmpfs | {seq['tmp3'].ms()} | 3 requests: "
        f"{d3.ms()} | {ratio(seq['tmp3'], d3)} |"
    )
    print(
        f"| a turn with one child, disk | {seq['disk3'].ms()} | + one SQLite commit | "
        f"{ratio(seq['disk3'], d3, commit)} |"
    )
    rates = many["rates"]
    direct_async = {
        k: v for k, v in rates.items() if k not in ("AsyncRuntime turns", "HttpChatModel")
    }
    best = max(direct_async, key=lambda k: statistics.median(direct_async[k]))
    others = "; ".join(f"{k} {rate(v)}" for k, v in direct_async.items())
    share = statistics.median(rates["AsyncRuntime turns"]) / statistics.median(rates[best])
    print(
        f"| {WIDE} concurrent turns from one loop (AsyncRuntime) | "
        f"{rate(rates['AsyncRuntime turns'])} | {others} | {share:.2f}x of {best} |"
    )
    gap = (ours.median() - theirs.median()) * 1e3
    print(
        f"| time to first streamed TextDelta | {ours.ms()} | first SSE byte (httpx): "
        f"{theirs.ms()} | +{gap:.2f} ms |"
    )
    print()
    print("the model clients alone, same server, same body:")
    print("| client | one request at a time | 256 at once from one loop |")
    print("| --- | --- | --- |")
    for name, figure in many["seq"].items():
        print(f"| {name} | {figure.ms()} | {rate(rates[name])} |")
    print(
        f"server: {requests} requests, at most {most} in flight, {overlaps} on a busy slot "
        "(loopd's requests only name slots)"
    )


if __name__ == "__main__":
    main()
