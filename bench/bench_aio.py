"""Benchmark of AsyncRuntime: many concurrent turns from one event loop, and how long the loop
is ever kept from running (its lag), on the in-process scripted model (no HTTP, no LLM).

Run: python bench/bench_aio.py [--quick] [--floor]. Prints one line per measurement; the
figures in docs/performance.md come from it. Nothing here is asserted: targets live in the docs.

``--floor`` measures the runtime's own work at 256 turns at once instead: a model that answers
at once on the model loop (no HTTP, no executor thread), 256 main slots, turns on new sessions
and then on the same sessions again (stored), with the turns per second and the process's CPU
per turn of each.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time

from actors import Config, SlotsConfig
from actors.aio import AsyncRuntime
from actors.testing import ScriptedModel, reply
from messages import ModelAnswer, ModelRequest, TurnCompleted


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


class InstantModel:
    """An async model that answers every request at once, on the model loop."""

    async def acomplete(self, request: ModelRequest) -> ModelAnswer:
        return ModelAnswer(request.session, request.request_id, "ok")

    async def aclose(self) -> None:
        pass

    def close(self) -> None:
        pass


async def floor(rounds: int, width: int = 256) -> None:
    """``rounds`` of ``width`` turns at once on new sessions, then as many on stored ones."""
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None  # the commits' CPU, not the disk's
    with tempfile.TemporaryDirectory(dir=shm) as home:
        config = Config(home=home, slots=SlotsConfig(main=tuple(range(width))))
        async with AsyncRuntime.start(config, model=InstantModel()) as rt:
            await asyncio.gather(*(rt.run_turn(f"w{i}", "hi", timeout=120) for i in range(width)))
            for kind in ("new", "stored"):
                rates = []
                cpu = time.process_time()
                for r in range(rounds):
                    ids = [f"{kind}{r}-{i}" if kind == "new" else f"w{i}" for i in range(width)]
                    start = time.perf_counter()
                    outcomes = await asyncio.gather(
                        *(rt.run_turn(session, "hi", timeout=120) for session in ids)
                    )
                    rates.append(width / (time.perf_counter() - start))
                    assert all(isinstance(o, TurnCompleted) for o in outcomes)
                per_turn = (time.process_time() - cpu) / (rounds * width) * 1e6
                print(
                    f"aio floor: {width} at once on {kind} sessions, instant model: median "
                    f"{statistics.median(rates):,.0f} turns/s, {per_turn:.0f} us of CPU a turn"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer turns")
    parser.add_argument("--floor", action="store_true", help="the runtime's own work at 256")
    args = parser.parse_args()
    if args.floor:
        asyncio.run(floor(3 if args.quick else 12))
        return
    count = 100 if args.quick else 1000
    asyncio.run(idle_lag(0.5))
    asyncio.run(concurrent_turns(count, rounds=1 if args.quick else 3))


if __name__ == "__main__":
    main()
