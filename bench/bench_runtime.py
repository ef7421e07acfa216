"""Benchmarks of loopd's own overhead, on the in-process scripted model (no HTTP, no LLM).

Run: python bench/bench_runtime.py [--quick]. Prints one line per measurement; the numbers in
docs/performance.md come from it. Nothing here is asserted: targets live in the docs, not tests.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import threading
import time
from collections.abc import Callable

from actors import Config, LoopConfig, Runtime
from actors.testing import ScriptedModel, calls, reply
from actors.testing.script import Answer
from messages import ModelRequest, TurnCompleted


def rss_mib() -> float:
    """The current resident set size (Linux /proc), in MiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed_turns(rt: Runtime, sessions: list[str], turns: int) -> list[float]:
    """Run ``turns`` turns on each session, sessions in parallel threads; per-turn latencies."""
    latencies: list[float] = []
    lock = threading.Lock()

    def drive(session: str) -> None:
        for i in range(turns):
            start = time.perf_counter()
            outcome = rt.run_turn(session, f"turn {i}", timeout=60)
            assert isinstance(outcome, TurnCompleted), outcome
            with lock:
                latencies.append(time.perf_counter() - start)

    threads = [threading.Thread(target=drive, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies


def bench_plain_turns(home: str, sessions: int, turns: int) -> None:
    rt = Runtime.start(Config(home=home), model=ScriptedModel(lambda r: reply("ok")))
    try:
        timed_turns(rt, ["warm"], 3)
        start = time.perf_counter()
        lat = timed_turns(rt, [f"s{i}" for i in range(sessions)], turns)
        wall = time.perf_counter() - start
    finally:
        rt.stop()
    print(
        f"plain turns      {sessions:>4} sessions x {turns} turns: {len(lat) / wall:7.1f} turns/s, "
        f"p50 {statistics.median(lat) * 1e3:6.2f} ms, "
        f"p95 {statistics.quantiles(lat, n=20)[18] * 1e3:6.2f} ms"
    )


def fan_out_script(width: int) -> Callable[[ModelRequest], Answer]:
    def script(request: ModelRequest) -> Answer:
        last = request.messages[-1]
        if request.session.startswith("sub-"):
            return reply("child done")
        if last.role == "user":
            return calls(*[("subagent", {"task": f"part {i}"}) for i in range(width)])
        done = [
            m for m in request.messages if m.role == "tool" and "completed" in (m.content or "")
        ]
        assert len(done) == width, f"only {len(done)} of {width} children completed"
        return reply("all done")

    return script


def bench_fan_out(home: str, width: int, rounds: int) -> None:
    # Raise the per-answer child limit (default 8) so every call really spawns a child.
    config = Config(home=home, loop=LoopConfig(max_children=width))
    rt = Runtime.start(config, model=ScriptedModel(fan_out_script(width)))
    try:
        lat = []
        for i in range(rounds):
            start = time.perf_counter()
            outcome = rt.run_turn(f"fan{i}", "go", timeout=120)
            assert isinstance(outcome, TurnCompleted), outcome
            lat.append(time.perf_counter() - start)
    finally:
        rt.stop()
    per_child = statistics.median(lat) / width * 1e3
    print(
        f"subagent fan-out {width:>4} children per turn:     "
        f"p50 {statistics.median(lat) * 1e3:7.1f} ms per turn, {per_child:5.2f} ms per child"
    )


def bench_live_sessions(home: str, count: int) -> None:
    rt = Runtime.start(Config(home=home), model=ScriptedModel(lambda r: reply("ok")))
    try:
        timed_turns(rt, ["warm"], 1)
        before = rss_mib()
        threads_before = threading.active_count()
        timed_turns(rt, [f"live{i}" for i in range(count)], 1)
        grown = rss_mib() - before
        threads = threading.active_count() - threads_before
    finally:
        rt.stop()
    print(
        f"live sessions    {count:>4} idle session actors:      "
        f"{grown * 1024 / count:6.1f} KiB RSS each, {threads} threads"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    args = parser.parse_args()
    scale = 1 if args.quick else 4
    with tempfile.TemporaryDirectory() as home:
        bench_plain_turns(home + "/a", sessions=1, turns=50 * scale)
        bench_plain_turns(home + "/b", sessions=8, turns=25 * scale)
        bench_fan_out(home + "/c", width=4, rounds=5 * scale)
        bench_fan_out(home + "/d", width=32, rounds=2 * scale)
        bench_live_sessions(home + "/e", count=100 * scale)


if __name__ == "__main__":
    main()
