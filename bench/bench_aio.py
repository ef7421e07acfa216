"""Benchmark of AsyncRuntime: many concurrent turns from one event loop, and how long the loop
is ever kept from running (its lag), on the in-process scripted model (no HTTP, no LLM).

Run: python bench/bench_aio.py [--quick]. Prints one line per measurement; the figures in
docs/performance.md come from it. Nothing here is asserted: targets live in the docs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

from actors import Config
from actors.aio import AsyncRuntime
from actors.testing import ScriptedModel, reply
from messages import TurnCompleted


async def lag_probe(stop: asyncio.Event, lags: list[float], every_s: float = 0.005) -> None:
    """Wake every ``every_s`` and record how late each wake-up was: the loop's lag."""
    while not stop.is_set():
        start = time.perf_counter()
        await asyncio.sleep(every_s)
        lags.append(time.perf_counter() - start - every_s)


async def concurrent_turns(count: int, rounds: int) -> None:
    model = ScriptedModel(lambda request: reply(f"ok {request.session}"))
    with tempfile.TemporaryDirectory() as home:
        async with AsyncRuntime.start(Config(home=home), model=model) as rt:
            for _ in range(rounds):
                stop = asyncio.Event()
                lags: list[float] = []
                probe = asyncio.create_task(lag_probe(stop, lags))
                start = time.perf_counter()
                outcomes = await asyncio.gather(
                    *(rt.run_turn(f"s{i}", "hi", timeout=120) for i in range(count))
                )
                took = time.perf_counter() - start
                stop.set()
                await probe
                assert all(isinstance(o, TurnCompleted) for o in outcomes)
                p50, worst = statistics.median(lags) * 1e3, max(lags) * 1e3
                print(
                    f"aio: {count} concurrent turns from one loop in {took:.2f} s "
                    f"({count / took:.0f} turns/s); loop lag p50 {p50:.1f} ms, "
                    f"max {worst:.1f} ms over {len(lags)} wake-ups"
                )


async def idle_lag(seconds: float) -> None:
    """The lag of the same probe on an idle loop: the machine's own noise, for comparison."""
    stop = asyncio.Event()
    lags: list[float] = []
    probe = asyncio.create_task(lag_probe(stop, lags))
    await asyncio.sleep(seconds)
    stop.set()
    await probe
    print(
        f"aio: idle loop lag p50 {statistics.median(lags) * 1e3:.1f} ms, "
        f"max {max(lags) * 1e3:.1f} ms over {len(lags)} wake-ups"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer turns")
    args = parser.parse_args()
    count = 100 if args.quick else 1000
    asyncio.run(idle_lag(0.5))
    asyncio.run(concurrent_turns(count, rounds=1 if args.quick else 3))


if __name__ == "__main__":
    main()
