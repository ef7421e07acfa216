"""Benchmarks of a child's cost and of the store's group commit (issue 8, items 4 and 6).

Run: python bench/bench_store.py [--quick] (about 2 minutes; --quick about 20 s). Every figure
is a ratio of two things measured in the same run, so the machine's speed cancels out; each is
the median of interleaved repeats (five for the child cost, three for group commit), since the
machine may be shared:

- per-child cost / the plain-pykka floor, on tmpfs (/dev/shm): what loopd adds to a child
  (hold, baseline, one store request to create it, its turn, the answer routed back) against
  plain pykka actors doing the same spawn, one message each way, and stop;
- turns/s with 8, 64 and 256 concurrent sessions on disk, with group commit off
  (``StoreActor.max_batch = 1``: one transaction per request) and on.

Nothing here is asserted; the figures and the targets are in docs/performance.md.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pykka

from actors import Config, LoopConfig, Runtime
from actors.services.store import StoreActor
from actors.testing import ScriptedModel, calls, reply
from actors.testing.script import Answer
from messages import ModelRequest, TurnCompleted

TMPFS = "/dev/shm"


@contextmanager
def home_on(base: str | None) -> Iterator[str]:
    """A fresh home folder under ``base`` (None: the system's temporary folder, on disk)."""
    with tempfile.TemporaryDirectory(dir=base, prefix="loopd-bench-") as folder:
        yield os.path.join(folder, "home")


# --- (a) per-child cost against the plain-pykka floor ----------------------------------------


class _Child(pykka.ThreadingActor):
    def __init__(self, parent: pykka.ActorRef[Any]) -> None:
        super().__init__()
        self.parent = parent

    def on_receive(self, message: Any) -> None:
        self.parent.tell(("done", self.actor_ref))


class _Parent(pykka.ThreadingActor):
    """Spawns ``width`` children, tells each a task, stops each on its answer, then reports."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = 0
        self.report: threading.Event | None = None

    def on_receive(self, message: Any) -> None:
        if message[0] == "go":
            _, width, report = message
            self.waiting, self.report = width, report
            for i in range(width):
                _Child.start(self.actor_ref).tell(("task", i))
        elif message[0] == "done":
            message[1].stop(block=False)
            self.waiting -= 1
            if self.waiting == 0 and self.report is not None:
                self.report.set()


def pykka_round(parent: pykka.ActorRef[Any], width: int) -> float:
    """Seconds of one plain-pykka round: spawn ``width`` children, one message each way, stop."""
    done = threading.Event()
    start = time.perf_counter()
    parent.tell(("go", width, done))
    if not done.wait(60):
        raise RuntimeError("the pykka floor round did not finish")
    return time.perf_counter() - start


def fan_out(width: int, tool: str) -> Callable[[ModelRequest], Answer]:
    """A parent that makes ``width`` calls of ``tool`` in one answer; children answer at once."""

    def script(request: ModelRequest) -> Answer:
        if request.session.startswith("sub-"):
            return reply("child done")
        if request.messages[-1].role == "user":
            arguments = {"task": "part"} if tool == "subagent" else {}
            return calls(*[(tool, arguments)] * width)
        return reply("all done")

    return script


def loopd_runtime(home: str, width: int, tool: str) -> Runtime:
    """A runtime whose parent's one answer calls ``tool`` ``width`` times."""
    config = Config(home=home, loop=LoopConfig(max_children=width, max_children_total=width))
    # The script never blocks, so it answers on the model service's loop, as the HTTP client
    # does (a blocking script would run on a thread of the service's pool, a hop each way).
    return Runtime.start(config, model=ScriptedModel(fan_out(width, tool), blocking=False))


def loopd_turn(rt: Runtime, session: str) -> float:
    """Seconds of one turn of a new session ``session``."""
    start = time.perf_counter()
    outcome = rt.run_turn(session, "go", timeout=120)
    took = time.perf_counter() - start
    assert isinstance(outcome, TurnCompleted), outcome
    return took


def bench_child_cost(width: int, rounds: int, repeats: int) -> None:
    """Child cost / floor: ``repeats`` repeats of ``rounds`` rounds, each round a pykka round,
    a turn with children and a turn with clock calls, one after the other, so that the
    machine's other jobs slow all three alike; the median of the repeats' ratios."""
    costs, floors = [], []
    for _ in range(repeats):
        with home_on(TMPFS) as home:
            parent = _Parent.start()
            with_children = loopd_runtime(home + "c", width, "subagent")
            # The same turn with a local tool in each child's place: what the children add is
            # the difference, so the parent's own requests and commits do not count for them.
            with_clock = loopd_runtime(home + "t", width, "clock")
            try:
                gc.collect()
                times: dict[str, list[float]] = {"floor": [], "children": [], "clock": []}
                for i in range(rounds + 1):
                    floor = pykka_round(parent, width)
                    children = loopd_turn(with_children, f"c{i}")
                    clock = loopd_turn(with_clock, f"t{i}")
                    if i:  # the first round warms up
                        times["floor"].append(floor)
                        times["children"].append(children)
                        times["clock"].append(clock)
            finally:
                parent.stop()
                with_children.stop()
                with_clock.stop()
        median = {k: statistics.median(v) for k, v in times.items()}
        costs.append((median["children"] - median["clock"]) / width)
        floors.append(median["floor"] / width)
    ratio = statistics.median(c / f for c, f in zip(costs, floors, strict=True))
    print(
        f"child cost on tmpfs, {width:>3} children per answer: "
        f"{statistics.median(costs) * 1e3:6.3f} ms per child; pykka floor "
        f"{statistics.median(floors) * 1e3:6.3f} ms; ratio {ratio:5.2f}x (target <= 2x)"
    )


# --- (b) turns/s with and without group commit --------------------------------------------------


def turns_per_second(home: str, sessions: int, seconds: float) -> tuple[float, float]:
    """Turns/s and p50 latency (s) of ``sessions`` sessions each running turns back to back."""
    config = Config(home=home)
    with Runtime.start(config, model=ScriptedModel(lambda r: reply("ok"))) as rt:
        names = [f"s{i}" for i in range(sessions)]
        for name in names:  # created and live before the clock starts
            rt.run_turn(name, "warm", timeout=60)
        latencies: list[float] = []
        lock = threading.Lock()
        stop_at = time.perf_counter() + seconds

        def drive(name: str) -> None:
            mine = []
            while time.perf_counter() < stop_at:
                start = time.perf_counter()
                outcome = rt.run_turn(name, "go", timeout=120)
                assert isinstance(outcome, TurnCompleted), outcome
                mine.append(time.perf_counter() - start)
            with lock:
                latencies.extend(mine)

        threads = [threading.Thread(target=drive, args=(n,)) for n in names]
        began = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - began
    return len(latencies) / wall, statistics.median(latencies)


def bench_group_commit(sessions: int, seconds: float, repeats: int) -> None:
    """Off and on, ``repeats`` times interleaved; the medians (the disk is shared)."""
    results: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    for _ in range(repeats):
        for label, batch in (("off", 1), ("on", 256)):
            StoreActor.max_batch = batch
            try:
                with home_on(None) as home:
                    results[label].append(turns_per_second(home, sessions, seconds))
            finally:
                StoreActor.max_batch = 256
    off = statistics.median(r[0] for r in results["off"])
    on = statistics.median(r[0] for r in results["on"])
    off_p50 = statistics.median(r[1] for r in results["off"])
    on_p50 = statistics.median(r[1] for r in results["on"])
    print(
        f"turns on disk, {sessions:>3} sessions: group commit off {off:7.1f} turns/s "
        f"(p50 {off_p50 * 1e3:6.1f} ms), on {on:7.1f} turns/s (p50 {on_p50 * 1e3:6.1f} ms); "
        f"{on / off:4.2f}x the turns/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    args = parser.parse_args()
    rounds, seconds, repeats = (3, 1.0, 1) if args.quick else (10, 3.0, 3)
    for width in (1, 8, 32):
        # At least 200 children a side per repeat: a turn of one child is a few milliseconds,
        # and ten of them said more about the machine's other jobs than about the child.
        bench_child_cost(width, rounds if args.quick else max(rounds, 200 // width), repeats + 2)
    for sessions in (8, 64, 256):
        bench_group_commit(sessions, seconds, repeats)


if __name__ == "__main__":
    main()
