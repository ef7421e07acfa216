"""CPU and wall time per turn over real HTTP, for two or more versions of loopd, alternated.

Run: ``python bench/compare_turns.py [--kind plain|child] [--rounds N] [--block N]
[--home-dir DIR] TREE [TREE ...]``, each ``TREE`` a source tree of loopd (a checkout, or
``git archive COMMIT | tar -x -C DIR``). One ``bench/fake_llama.py`` server (a process of its
own) serves a runtime per tree, each in a process of its own with that tree first on its path;
the trees take turns, a block of turns each, so a machine that gets busier or quieter meets
each alike. Every turn is on a new session. A block's CPU is the whole process's (every thread:
the caller, the dispatcher, the store, the model loop), so a cut that moves work from one
thread to another shows as what it is. Printed: each tree's median per turn over the blocks,
and the median of its blocks' ratios to the first tree's blocks run beside them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench_wire import server_process


def worker(base_url: str, home_dir: str) -> None:
    """Run blocks of turns as the driver asks on stdin (``KIND COUNT``): one line each back,
    the CPU and wall milliseconds per turn."""
    from actors import Config, ModelConfig, Runtime
    from messages import TurnCompleted

    home = tempfile.mkdtemp(dir=home_dir)
    config = Config(home=home, model=ModelConfig(base_url=base_url, name="bench", retries=0))
    count = 0
    with Runtime.start(config) as rt:
        print("ready", flush=True)
        for line in sys.stdin:
            kind, turns = line.split()
            text, expect = ("spawn", "all done") if kind == "child" else ("hi", "ok, that is done")
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(int(turns)):
                count += 1
                outcome = rt.run_turn(f"s{count}", text, timeout=60)
                assert isinstance(outcome, TurnCompleted) and outcome.content == expect, outcome
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            print(f"{cpu / int(turns) * 1e3:.4f} {wall / int(turns) * 1e3:.4f}", flush=True)


def drive(trees: list[str], kind: str, rounds: int, block: int, home_dir: str) -> None:
    """Alternate blocks of ``kind`` turns between the runtimes of ``trees``; print the table."""
    here = os.path.abspath(__file__)
    with server_process() as (base_url, pipe):
        workers: dict[str, subprocess.Popen[str]] = {}
        for tree in trees:
            env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
            command = [sys.executable, here, "--worker", base_url, "--home-dir", home_dir]
            process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
            )
            assert process.stdout is not None and process.stdout.readline().strip() == "ready"
            workers[tree] = process
        figures: dict[str, list[tuple[float, float]]] = {tree: [] for tree in trees}
        for index in range(rounds + 1):
            for tree, process in workers.items():
                assert process.stdin is not None and process.stdout is not None
                process.stdin.write(f"{kind} {block}\n")
                process.stdin.flush()
                cpu, wall = map(float, process.stdout.readline().split())
                if index:  # the first round warms up (connections, the store, imports)
                    figures[tree].append((cpu, wall))
        for process in workers.values():
            assert process.stdin is not None
            process.stdin.close()
            process.wait()
        pipe.send("stop")
        pipe.recv()
    first = figures[trees[0]]
    load = os.getloadavg()[0]
    print(f"{kind} turns, {rounds} blocks of {block} per tree, load average {load:.1f} at the end")
    for tree in trees:
        mine = figures[tree]
        cpu = statistics.median(c for c, _ in mine)
        wall = statistics.median(w for _, w in mine)
        cpu_ratio = statistics.median(c / f for (c, _), (f, _) in zip(mine, first, strict=True))
        wall_ratio = statistics.median(w / f for (_, w), (_, f) in zip(mine, first, strict=True))
        print(
            f"  {tree}: CPU {cpu:.3f} ms, wall {wall:.3f} ms per turn; "
            f"÷ the first: CPU {cpu_ratio:.2f}x, wall {wall_ratio:.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("trees", nargs="*", help="loopd source trees to compare")
    parser.add_argument("--kind", choices=("plain", "child"), default="plain")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--block", type=int, default=40)
    parser.add_argument("--home-dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    parser.add_argument("--worker", metavar="BASE_URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    home_dir = args.home_dir or tempfile.gettempdir()
    if args.worker:
        worker(args.worker, home_dir)
    elif args.trees:
        drive(args.trees, args.kind, args.rounds, args.block, home_dir)
    else:
        parser.error("name at least one source tree")


if __name__ == "__main__":
    main()
