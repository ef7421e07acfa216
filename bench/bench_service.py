"""Benchmark of the HTTP service: concurrent turns through the API (an httpx client on
127.0.0.1, in this process; the service in a child process, as a real one runs) against the
same turns through AsyncRuntime directly, and many event clients at once, on the scripted
model (no LLM).

Run: python bench/bench_service.py [--turns N] [--clients K]. Prints one line per
measurement; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import httpx

from actors import Config
from actors.aio import AsyncRuntime
from actors.runtime import Runtime
from actors.shells.service.server import Service
from actors.shells.service.settings import ServiceSettings
from actors.testing import ScriptedModel, reply
from messages import TurnCompleted


def _model() -> ScriptedModel:
    return ScriptedModel(lambda request: reply(f"ok {request.session}"))


def _line(what: str, count: int, took: float, latencies: list[float]) -> str:
    p50 = statistics.median(latencies) * 1e3
    p99 = sorted(latencies)[int(len(latencies) * 0.99) - 1] * 1e3
    return (
        f"{what}: {count} concurrent turns in {took:.2f} s ({count / took:.0f} turns/s); "
        f"latency p50 {p50:.0f} ms, p99 {p99:.0f} ms"
    )


async def direct(count: int, prefix: str) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as home:
        async with AsyncRuntime.start(Config(home=home), model=_model()) as rt:
            await rt.run_turn("warm", "hi", timeout=60)
            latencies: list[float] = []

            async def one(i: int) -> None:
                start = time.perf_counter()
                outcome = await rt.run_turn(f"{prefix}{i}", "hi", timeout=300)
                assert isinstance(outcome, TurnCompleted)
                latencies.append(time.perf_counter() - start)

            start = time.perf_counter()
            await asyncio.gather(*(one(i) for i in range(count)))
            took = time.perf_counter() - start
    print(_line("direct (AsyncRuntime)", count, took, latencies), flush=True)
    return count / took, sorted(latencies)[int(len(latencies) * 0.99) - 1]


def serve_here() -> None:
    """The child: a runtime on the scripted model, served on a free port, until stdin closes."""
    with (
        tempfile.TemporaryDirectory() as home,
        Runtime.start(Config(home=home), model=_model()) as rt,
        Service.start(rt, ServiceSettings("127.0.0.1", 0)) as service,
    ):
        print(service.url, flush=True)
        sys.stdin.read()


@contextlib.contextmanager
def served() -> Iterator[str]:
    """A child process serving a runtime; its URL."""
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        yield child.stdout.readline().strip()
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(60)


async def _post(host: str, port: int, path: str, body: bytes) -> bytes:
    """One POST on a new connection, read to the end of its answer: a minimal HTTP/1.1 client
    (httpx's async pool costs more CPU per request than the service itself, so with it this
    bench would measure the client)."""
    reader, writer = await asyncio.open_connection(host, port)
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
        writer.close()


async def through_http(count: int, prefix: str) -> tuple[float, float]:
    with served() as url:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        await _post(host, int(port), "/v1/sessions/warm/turns", b'{"text": "hi"}')
        latencies: list[float] = []

        async def one(i: int) -> None:
            start = time.perf_counter()
            answer = await _post(
                host, int(port), f"/v1/sessions/{prefix}{i}/turns", b'{"text": "hi"}'
            )
            assert b'"type":"TurnCompleted"' in answer
            latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(count)))
        took = time.perf_counter() - start
    print(_line("through the API", count, took, latencies), flush=True)
    return count / took, sorted(latencies)[int(len(latencies) * 0.99) - 1]


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
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve_here()
        return
    direct_rate, direct_p99 = asyncio.run(direct(args.turns, "d"))
    http_rate, http_p99 = asyncio.run(through_http(args.turns, "h"))
    print(
        f"the API against direct: {http_rate / direct_rate:.2f}x the turns/s, "
        f"p99 {http_p99 * 1e3:.0f} ms against {direct_p99 * 1e3:.0f} ms",
        flush=True,
    )
    asyncio.run(event_clients(args.clients, 100))


if __name__ == "__main__":
    main()
