"""Where a turn over real HTTP spends its CPU: plain turns or turns with one child, in a loop.

Run under a sampling profiler that sees every thread (the dispatcher's, the model loop's, the
store's), for example::

    py-spy record --format raw -o turns.txt -- python bench/profile_wire.py --kind plain
    python bench/profile_wire.py --top turns.txt

``--kind plain|child|wide`` picks the turns (``wide``: 256 at once through AsyncRuntime),
``--seconds`` how long to run them (new sessions each turn, a home on tmpfs,
bench/fake_llama.py in a process of its own). ``--top FILE`` reads py-spy's raw (collapsed)
output and prints the files and functions with the most samples: by themselves
(self) and with what they call (total), loopd's own code marked.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import tempfile
import time

from bench_wire import server_process

from actors import Config, ModelConfig, Runtime, SlotsConfig
from actors.aio import AsyncRuntime
from messages import TurnCompleted


async def wide(base_url: str, home: str, seconds: float) -> int:
    """256 concurrent turns from one loop through AsyncRuntime, again and again."""
    config = Config(
        home=home,
        model=ModelConfig(base_url=base_url, name="bench", retries=0, concurrency=256),
        slots=SlotsConfig(main=tuple(range(256))),
    )
    count = 0
    async with AsyncRuntime.start(config) as rt:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            outcomes = await asyncio.gather(
                *(rt.run_turn(f"w{count + i}", "hi", timeout=120) for i in range(256))
            )
            assert all(isinstance(o, TurnCompleted) for o in outcomes)
            count += 256
    return count


def run(kind: str, seconds: float) -> None:
    if kind == "wide":
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        with tempfile.TemporaryDirectory(dir=shm) as home, server_process() as (url, pipe):
            count = asyncio.run(wide(url, home, seconds))
            pipe.send("stop")
            pipe.recv()
        print(f"{count} turns, 256 at once, in {seconds:g} s")
        return
    text, expect = ("spawn", "all done") if kind == "child" else ("hi", "ok, that is done")
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with (
        tempfile.TemporaryDirectory(dir=shm) as home,
        server_process() as (base_url, pipe),
    ):
        config = Config(home=home, model=ModelConfig(base_url=base_url, name="bench", retries=0))
        with Runtime.start(config) as rt:
            count = 0
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                count += 1
                outcome = rt.run_turn(f"p{count}", text, timeout=60)
                assert isinstance(outcome, TurnCompleted) and outcome.content == expect, outcome
        pipe.send("stop")
        pipe.recv()
    print(f"{count} {kind} turns in {seconds:g} s")


def top(path: str, count: int) -> None:
    """The functions with the most samples in py-spy's raw output at ``path``."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    with open(path) as raw:
        for line in raw:
            stack, _, weight = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            n = int(weight)
            frames = [f.split(" (")[0] + " " + _where(f) for f in stack.split(";")[1:]]
            samples += n
            if frames:
                own[frames[-1]] += n
            for frame in set(frames):
                total[frame] += n
    files: collections.Counter[str] = collections.Counter()
    for frame, n in own.items():
        files[frame.split()[-1]] += n
    print(f"{samples} samples (all threads, idle ones left out)")
    for title, counter in (("self, by file", files), ("self", own), ("total", total)):
        print(f"top {count} by {title}:")
        for frame, n in counter.most_common(count):
            mark = "*" if frame.split()[-1].split("/")[0] in _OURS else " "
            print(f"  {mark} {n / samples:6.1%}  {frame}")


# The folders of loopd's own code, as _where names them.
_OURS = frozenset(
    {"messages", "actors", "core", "dispatcher", "models", "stores", "tools", "tracing"}
    | {"sessions", "services", "testing", "shells", "cluster"}
)


def _where(frame: str) -> str:
    """``file.py`` of a frame ``name (path/file.py:line)``, with its package folder."""
    inside = frame.partition(" (")[2].rstrip(")")
    path = inside.rpartition(":")[0]
    parts = path.split("/")
    return "/".join(parts[-2:]) if parts else path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kind", choices=("plain", "child", "wide"), default="plain")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--top", metavar="FILE", help="summarise py-spy raw output instead")
    parser.add_argument("--count", type=int, default=25)
    args = parser.parse_args()
    if args.top:
        top(args.top, args.count)
    else:
        run(args.kind, args.seconds)


if __name__ == "__main__":
    main()
