"""Benchmark of the HTTP service: concurrent turns through the API against the same turns
through AsyncRuntime directly, and many event clients at once, on the scripted model (no LLM).

Each side runs in a process of its own, started once: the direct side is a child process
running ``AsyncRuntime`` and its callers on one loop (no HTTP); the API side is a child process
serving a runtime (``Service``, as ``loopd serve`` does), and the HTTP client is this process, a
minimal HTTP/1.1 client opening one connection per turn. So the client never competes with the
service for its GIL, though it does for the machine's cores (its CPU per turn is printed too).
The two sides run alternated in blocks of ``--turns`` concurrent turns (new sessions each), so a
machine that gets busier or quieter meets each alike; the ratio is the median of the ratios of
blocks run side by side. With ``--keep-alive`` each round has a direct block beside each HTTP
block (new connections, then kept ones), so the two processes have run as many turns, and hold
as many sessions, whenever a pair is compared: a runtime holding more sessions collects garbage
longer and, past ``[sessions] max_live``, passivates. Each side's time in the garbage collector
is printed with its CPU. Both sides set the collector as ``loopd serve`` does
(``actors.tune_collector``) once started; a checkout given by ``--against`` from before it leaves
its collector at CPython's defaults, so the pair shows what the setting is worth.

Run: python bench/bench_service.py [--turns N] [--repeats R] [--clients K] [--keep-alive]
[--against CHECKOUT]. Prints one line per measurement; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

import httpx

import actors
from actors import Config
from actors.aio import AsyncRuntime
from actors.runtime import Runtime
from actors.shells.service.server import Service
from actors.shells.service.settings import ServiceSettings
from actors.testing import ScriptedModel, reply
from messages import TurnCompleted


def _model() -> ScriptedModel:
    return ScriptedModel(lambda request: reply(f"ok {request.session}"))


def _cpu() -> float:
    """This process's CPU seconds so far (user and system, every thread)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


_gc_seconds = 0.0
_gc_started = 0.0


def _count_gc(phase: str, info: dict[str, int]) -> None:
    global _gc_seconds, _gc_started
    if phase == "start":
        _gc_started = time.perf_counter()
    else:
        _gc_seconds += time.perf_counter() - _gc_started


def _track_gc() -> None:
    """Count the wall seconds this process spends in the cyclic garbage collector (each side's
    child reports it per block: a heap that holds more sessions collects longer)."""
    gc.callbacks.append(_count_gc)


def _tune_gc() -> None:
    """Set the collector as ``loopd serve`` sets it, on both sides alike, once started; a
    checkout from before ``actors.tune_collector`` (``--against``) leaves it as it was."""
    tune = getattr(actors, "tune_collector", None)
    if tune is not None:
        tune()


def _p99(latencies: list[float]) -> float:
    return sorted(latencies)[max(0, int(len(latencies) * 0.99) - 1)]


def _block(
    count: int, took: float, latencies: list[float], cpu: float, gc_s: float
) -> dict[str, float]:
    """One block's figures: turns/s, p50 and p99 in seconds, CPU and garbage-collector
    seconds per turn."""
    return {
        "rate": count / took,
        "p50": statistics.median(latencies),
        "p99": _p99(latencies),
        "cpu": cpu / count,
        "gc": gc_s / count,
    }


async def _direct_block(rt: AsyncRuntime, prefix: str, count: int) -> dict[str, float]:
    """``count`` concurrent turns through ``rt``: the block's figures."""
    latencies: list[float] = []

    async def one(session: str) -> None:
        start = time.perf_counter()
        outcome = await rt.run_turn(session, "hi", timeout=300)
        assert isinstance(outcome, TurnCompleted)
        latencies.append(time.perf_counter() - start)

    cpu, gc_s, loop, start = _cpu(), _gc_seconds, time.thread_time(), time.perf_counter()
    await asyncio.gather(*(one(f"{prefix}{i}") for i in range(count)))
    took = time.perf_counter() - start
    block = _block(count, took, latencies, _cpu() - cpu, _gc_seconds - gc_s)
    block["loop"] = (time.thread_time() - loop) / count  # the callers' loop thread
    return block


def direct_here() -> None:
    """The direct side's child: a runtime on the scripted model and its callers on one loop
    (asyncio's own, as an application's); each line ``PREFIX COUNT`` on stdin runs COUNT
    concurrent turns and prints the block's figures as JSON, until stdin closes."""

    _track_gc()

    async def run() -> None:
        with tempfile.TemporaryDirectory() as home:
            async with AsyncRuntime.start(Config(home=home), model=_model()) as rt:
                await rt.run_turn("warm", "hi", timeout=60)
                _tune_gc()
                print("ready", flush=True)
                loop = asyncio.get_running_loop()
                while line := await loop.run_in_executor(None, sys.stdin.readline):
                    prefix, count = line.split()
                    print(json.dumps(await _direct_block(rt, prefix, int(count))), flush=True)

    asyncio.run(run())


def serve_here() -> None:
    """The API side's child: a runtime on the scripted model, served on a free port; prints its
    URL, then answers each line on stdin with its CPU and garbage-collector seconds so far and
    the CPU seconds of the service's loop thread (the HTTP server and the app), until stdin
    closes."""
    _track_gc()
    with (
        tempfile.TemporaryDirectory() as home,
        Runtime.start(Config(home=home), model=_model()) as rt,
        Service.start(rt, ServiceSettings("127.0.0.1", 0)) as service,
    ):
        _tune_gc()
        print(service.url, flush=True)
        loop_clock = time.pthread_getcpuclockid(service._thread.ident or 0)
        while sys.stdin.readline():
            print(_cpu(), _gc_seconds, time.clock_gettime(loop_clock), flush=True)


@contextlib.contextmanager
def child(flag: str, code: str | None = None) -> Iterator[subprocess.Popen[str]]:
    """A child process of this bench (``--serve`` or ``--direct``), talked to over its stdin
    and stdout, on the code of checkout ``code`` (default: the one on the path now); it ends
    when its stdin closes."""
    env = None if code is None else {**os.environ, "PYTHONPATH": os.path.abspath(code)}
    process = subprocess.Popen(
        [sys.executable, __file__, flag],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        yield process
    finally:
        assert process.stdin is not None
        process.stdin.close()
        process.wait(60)


def _ask(process: subprocess.Popen[str], line: str) -> str:
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(line + "\n")
    process.stdin.flush()
    return process.stdout.readline().strip()


@contextlib.contextmanager
def served() -> Iterator[str]:
    """A child process serving a runtime; its URL."""
    with child("--serve") as process:
        assert process.stdout is not None
        yield process.stdout.readline().strip()


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _post(
    host: str, port: int, path: str, body: bytes, kept: Connection | None = None
) -> bytes:
    """One POST read to the end of its answer: a minimal HTTP/1.1 client (httpx's async pool
    costs more CPU per request than the service itself, so with it this bench would measure
    the client). On a new connection, closed after, unless ``kept`` is one to reuse."""
    reader, writer = kept or await asyncio.open_connection(host, port)
    try:
        writer.write(
            b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (path.encode(), host.encode(), len(body), body)
        )
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        assert head.startswith(b"HTTP/1.1 200"), head
        return await reader.readexactly(length)
    finally:
        if kept is None:
            writer.close()


async def http_block(
    host: str,
    port: int,
    service: subprocess.Popen[str],
    prefix: str,
    count: int,
    kept: list[Connection] | None = None,
) -> tuple[dict[str, float], float]:
    """``count`` concurrent turns through the API, each on a new connection (or on one of
    ``kept``, opened before): the block's figures (``cpu`` the service process's CPU per turn)
    and this client's CPU seconds per turn."""
    latencies: list[float] = []

    async def one(i: int) -> None:
        start = time.perf_counter()
        path = f"/v1/sessions/{prefix}{i}/turns"
        answer = await _post(host, port, path, b'{"text": "hi"}', kept[i] if kept else None)
        assert b'"type":"TurnCompleted"' in answer
        latencies.append(time.perf_counter() - start)

    served_cpu, served_gc, served_loop = map(float, _ask(service, "cpu").split())
    client_cpu, start = _cpu(), time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(count)))
    took = time.perf_counter() - start
    client = (_cpu() - client_cpu) / count
    cpu, gc_s, loop = map(float, _ask(service, "cpu").split())
    block = _block(count, took, latencies, cpu - served_cpu, gc_s - served_gc)
    block["loop"] = (loop - served_loop) / count
    return block, client


def _client_loop() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The HTTP client's event loop: uvloop's where it is installed (the service's extra
    brings it), so the load generator costs the machine less CPU per request; else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _side(name: str, blocks: list[dict[str, float]]) -> str:
    rates = [b["rate"] for b in blocks]
    return (
        f"{name}: {statistics.median(rates):.0f} turns/s (blocks {min(rates):.0f}-"
        f"{max(rates):.0f}); latency p50 {statistics.median(b['p50'] for b in blocks) * 1e3:.0f}"
        f" ms, p99 {statistics.median(b['p99'] for b in blocks) * 1e3:.0f} ms; CPU "
        f"{statistics.median(b['cpu'] for b in blocks) * 1e3:.2f} ms a turn (in the garbage "
        f"collector {statistics.median(b['gc'] for b in blocks) * 1e3:.2f} ms"
        + (
            f", the loop's thread {statistics.median(b['loop'] for b in blocks) * 1e3:.2f} ms)"
            if "loop" in blocks[0]
            else ")"
        )
    )


class _Served:
    """One service child of the bench: its process, address, kept connections and blocks."""

    def __init__(self, name: str, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        self.name = name
        self.process = process
        host, port = process.stdout.readline().strip().removeprefix("http://").rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.opened: list[Connection] = []
        self.new: list[dict[str, float]] = []
        self.kept: list[dict[str, float]] = []
        self.clients: list[float] = []


def turns(count: int, repeats: int, keep_alive: bool, against: str | None) -> None:
    """``repeats`` rounds of blocks of ``count`` concurrent turns: direct, then through the API
    on new connections, then (with ``keep_alive``) direct again and through the API on
    ``count`` connections opened once and kept, as a client's pool keeps them; a first round
    warms every side up. With ``against`` (another checkout), a second service on that
    checkout's code runs each HTTP block too, right after this one's, for a before and after
    in the same run."""
    with contextlib.ExitStack() as stack:
        direct = stack.enter_context(child("--direct"))
        services = [_Served("this checkout", stack.enter_context(child("--serve")))]
        if against is not None:
            services.append(_Served(against, stack.enter_context(child("--serve", against))))
        client_loop = stack.enter_context(asyncio.Runner(loop_factory=_client_loop()))
        assert direct.stdout is not None
        assert direct.stdout.readline().strip() == "ready"
        for served in services:
            served.opened = client_loop.run(
                _connections(served.host, served.port, count if keep_alive else 0)
            )
        directs: list[dict[str, float]] = []
        besides: list[dict[str, float]] = []
        for repeat in range(repeats + 1):
            warm = repeat == 0  # the first round warms every side up
            # With two services, which goes first alternates round by round.
            order = list(enumerate(services))[:: 1 if repeat % 2 else -1]
            block = json.loads(_ask(direct, f"d{repeat}- {count}"))
            if not warm:
                directs.append(block)
            for n, served in order:
                new, client = client_loop.run(
                    http_block(served.host, served.port, served.process, f"h{n}-{repeat}-", count)
                )
                if not warm:
                    served.new.append(new)
                    served.clients.append(client)
            if not keep_alive:
                continue
            # A direct block for the kept ones too, so that each side has run as many turns
            # (and holds as many sessions) when a pair of blocks is compared.
            block = json.loads(_ask(direct, f"e{repeat}- {count}"))
            if not warm:
                besides.append(block)
            for n, served in order:
                kept, _ = client_loop.run(
                    http_block(
                        served.host,
                        served.port,
                        served.process,
                        f"k{n}-{repeat}-",
                        count,
                        served.opened,
                    )
                )
                if not warm:
                    served.kept.append(kept)
        for served in services:
            for _, writer in served.opened:
                writer.close()
    print(_side(f"direct (AsyncRuntime), {count} concurrent turns", directs), flush=True)
    if keep_alive:
        print(_side("direct, the blocks beside the kept ones", besides), flush=True)
    for served in services:
        print(f"-- the service of {served.name}:", flush=True)
        print(
            _side(f"through the API, {count} concurrent turns", served.new)
            + f" (the service's process; the HTTP client's: "
            f"{statistics.median(served.clients) * 1e3:.2f} ms)",
            flush=True,
        )
        print(_ratio("the API against direct", directs, served.new), flush=True)
        if keep_alive:
            print(_side("through the API on kept connections", served.kept), flush=True)
            print(_ratio("kept connections against direct", besides, served.kept), flush=True)


async def _connections(host: str, port: int, count: int) -> list[Connection]:
    """``count`` connections to the service, opened now, for the blocks to reuse."""
    return [await asyncio.open_connection(host, port) for _ in range(count)]


def _ratio(what: str, direct: list[dict[str, float]], http: list[dict[str, float]]) -> str:
    ratios = [h["rate"] / d["rate"] for d, h in zip(direct, http, strict=True)]
    p99s = [h["p99"] / d["p99"] for d, h in zip(direct, http, strict=True)]
    return (
        f"{what}: {statistics.median(ratios):.2f}x the turns/s (blocks "
        f"{min(ratios):.2f}-{max(ratios):.2f}), {statistics.median(p99s):.2f}x the p99"
    )


async def event_clients(clients: int, turns: int) -> None:
    """``clients`` event streams at once while ``turns`` turns run: each client must see every
    turn's TurnEnded; how long until the last one has."""
    with served() as url:
        limits = httpx.Limits(max_connections=clients + 50)
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
            attached = 0
            all_attached = asyncio.Event()

            async def watch() -> int:
                nonlocal attached
                ended = 0
                async with client.stream("GET", "/v1/events") as response:
                    attached += 1
                    if attached == clients:
                        all_attached.set()
                    async for line in response.aiter_lines():
                        if line == "event: TurnEnded":
                            ended += 1
                            if ended == turns:
                                return ended
                return ended

            watchers = [asyncio.create_task(watch()) for _ in range(clients)]
            await asyncio.wait_for(all_attached.wait(), 60)
            start = time.perf_counter()
            await asyncio.gather(
                *(
                    client.post(f"/v1/sessions/e{i}/turns", json={"text": "hi"})
                    for i in range(turns)
                )
            )
            turns_took = time.perf_counter() - start
            seen = await asyncio.gather(*watchers)
            took = time.perf_counter() - start
    complete = sum(1 for n in seen if n == turns)
    print(
        f"events: {clients} clients, {turns} turns: turns done in {turns_took:.2f} s, every "
        f"client had every TurnEnded after {took:.2f} s ({complete}/{clients} complete)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument(
        "--keep-alive", action="store_true", help="also turns on connections kept open"
    )
    parser.add_argument(
        "--against",
        metavar="CHECKOUT",
        help="also serve from another checkout's code (say, of main), block for block",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--direct", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be 1 or more")
    if args.serve:
        serve_here()
        return
    if args.direct:
        direct_here()
        return
    turns(args.turns, args.repeats, args.keep_alive, args.against)
    if args.clients:
        asyncio.run(event_clients(args.clients, 100))


if __name__ == "__main__":
    main()
