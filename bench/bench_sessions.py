"""Many live sessions in one process: memory, threads, and a warm turn's latency as they grow.

Run: python bench/bench_sessions.py [--sessions 100000] [--base 1000] [--home DIR]. It starts a
runtime with passivation off (``sessions.idle_s = 0``, ``sessions.max_live = 0``) and makes
``--sessions`` sessions live (one turn each), while a second process does the same with
``--base`` sessions. Then it times warm turns (turns on random sessions whose actor is live) in
both, in alternate batches of 10, so that other load on the machine slows both alike, and
also gives the median of the batch pairs' ratios, which a burst of load skews least. It prints RSS
and the thread count of the big process and both p50s with their ratio. The targets (issue 8)
are RSS at most 2 GiB, at most ``runtime.threads`` + 32 threads, and p50 at the top at most 1.3
times p50 at the base. Nothing is asserted; docs/performance.md keeps the figures.

The homes default to a fresh folder under /dev/shm (tmpfs) when there is one: this measures
the runtime, not the disk's fsync. Pass ``--home`` to measure on a disk.
"""

from __future__ import annotations

import argparse
import faulthandler
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from actors import Config, Runtime
from actors.core.config import RuntimeConfig, SessionsConfig
from actors.dispatcher import default_threads
from messages import ModelAnswer, ModelRequest, TurnCompleted

IN_FLIGHT = 256
"""Turns started at once while growing: enough to keep every actor busy, few enough to keep
the inboxes short."""


class InstantModel:
    """An in-process model that answers "ok" at once, as a coroutine on the model service's
    loop, the way the HTTP client runs: no thread per request (a sync model such as the test
    kit's ``ScriptedModel`` runs on up to ``model.concurrency`` threads of its own)."""

    async def acomplete(self, request: ModelRequest) -> ModelAnswer:
        return ModelAnswer(request.session, request.request_id, "ok")

    async def aclose(self) -> None:
        """Nothing to release."""

    def close(self) -> None:
        """Nothing to release."""


def rss_mib() -> float:
    """The resident set size now (Linux /proc), in MiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Completions:
    """A mailbox at an address that counts turn outcomes and lets ``IN_FLIGHT`` run at once."""

    def __init__(self) -> None:
        self.slots = threading.Semaphore(IN_FLIGHT)
        self.failed: list[Any] = []
        self._lock = threading.Lock()
        self._done = 0
        self._all = threading.Condition(self._lock)

    def tell(self, outcome: Any) -> None:
        with self._lock:
            self._done += 1
            if not isinstance(outcome, TurnCompleted):
                self.failed.append(outcome)
            self._all.notify_all()
        self.slots.release()

    def wait_for(self, count: int, timeout: float) -> None:
        with self._lock:
            if not self._all.wait_for(lambda: self._done >= count, timeout):
                raise TimeoutError(f"only {self._done} of {count} turns ended in {timeout} s")


def grow(
    rt: Runtime, done: Completions, start: int, stop: int, expected: int, *, quiet: bool = False
) -> float:
    """Make sessions ``s<start>`` .. ``s<stop - 1>`` live with one turn each; seconds taken."""
    began = time.perf_counter()
    for i in range(start, stop):
        done.slots.acquire()
        rt.send_turn(f"s{i}", "hello", reply_to="bench:done")
        if not quiet and i % 10_000 == 9_999:
            print(f"  {i + 1} sessions started, RSS {rss_mib():.0f} MiB", flush=True)
    done.wait_for(expected, timeout=3600)
    if done.failed:
        raise RuntimeError(f"{len(done.failed)} turns failed, first: {done.failed[0]!r}")
    return time.perf_counter() - began


def warm_turns(rt: Runtime, live: int, count: int, rng: random.Random) -> list[float]:
    """The times of ``count`` turns on random live sessions, one after another."""
    times = []
    for _ in range(count):
        session = f"s{rng.randrange(live)}"
        began = time.perf_counter()
        outcome = rt.run_turn(session, "again", timeout=60)
        times.append(time.perf_counter() - began)
        assert isinstance(outcome, TurnCompleted), outcome
    return times


def start_runtime(home: str, threads: int | None) -> tuple[Runtime, Completions]:
    """A runtime with passivation off, and the mailbox ``grow`` reports to."""
    config = Config(
        home=home,
        runtime=RuntimeConfig(threads=threads),
        sessions=SessionsConfig(idle_s=0, max_live=0),  # passivation off
    )
    rt = Runtime.start(config, model=InstantModel())
    done = Completions()
    rt.directory.register("bench:done", done)
    return rt, done


def base_process(conn: Connection, home: str, base: int, threads: int | None) -> None:
    """The base: a runtime with ``base`` live sessions in a process of its own, timing a batch
    of warm turns whenever the parent asks, so both sizes are timed under the same load."""
    rt, done = start_runtime(home, threads)
    rng = random.Random(1)
    try:
        grow(rt, done, 0, base, base, quiet=True)
        warm_turns(rt, base, 20, rng)  # warm up the code paths
        conn.send("ready")
        while (count := conn.recv()) is not None:
            conn.send(warm_turns(rt, base, count, rng))
    finally:
        rt.stop(timeout=60)


BATCH = 10
"""Warm turns timed in one go in one process before the other process takes its turn."""


def interleaved_p50s(
    rt: Runtime, live: int, conn: Connection, samples: int, rng: random.Random
) -> tuple[float, float, float]:
    """p50 of warm turns at the base (the other process) and here, timed in alternate batches,
    and the median over the batch pairs of (p50 here / p50 there): other load on the machine
    comes in bursts, and a burst then skews one pair, not the whole figure."""
    base: list[float] = []
    top: list[float] = []
    ratios: list[float] = []
    warm_turns(rt, live, 20, rng)
    while len(top) < samples:
        conn.send(BATCH)
        there = conn.recv()
        here = warm_turns(rt, live, BATCH, rng)
        base += there
        top += here
        ratios.append(statistics.median(here) / statistics.median(there))
    return statistics.median(base), statistics.median(top), statistics.median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100_000, help="live sessions at the top")
    parser.add_argument("--base", type=int, default=1_000, help="live sessions at the base")
    parser.add_argument("--samples", type=int, default=400, help="warm turns timed at each size")
    parser.add_argument("--threads", type=int, default=None, help="runtime.threads")
    parser.add_argument("--home", default=None, help="the runtimes' parent folder (default: tmpfs)")
    parser.add_argument(
        "--max-s", type=float, default=1800, help="give up (exit 1, with tracebacks) after this"
    )
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.max_s, exit=True)  # a bench run must end
    if args.base > args.sessions:
        parser.error("--base must not be larger than --sessions")

    shm = Path("/dev/shm")
    parent = args.home or (str(shm) if shm.is_dir() else None)
    with tempfile.TemporaryDirectory(prefix="loopd-bench-", dir=parent) as tmp:
        threads = args.threads or default_threads()
        print(
            f"bench_sessions: {args.sessions} live sessions against {args.base}, "
            f"runtime.threads {threads}, homes under {tmp}, {os.cpu_count()} CPUs, "
            f"Python {sys.version.split()[0]}",
            flush=True,
        )
        conn, child_conn = multiprocessing.Pipe()
        child = multiprocessing.get_context("spawn").Process(
            target=base_process, args=(child_conn, f"{tmp}/base", args.base, args.threads)
        )
        child.start()
        rng = random.Random(8)
        rss_empty = rss_mib()
        rt, done = start_runtime(f"{tmp}/top", args.threads)
        try:
            took = grow(rt, done, 0, args.sessions, args.sessions)
            live = len(rt.live(timeout=60))
            rss_top = rss_mib()
            thread_count = threading.active_count()
            assert conn.recv() == "ready"
            p50_base, p50_top, ratio = interleaved_p50s(rt, args.sessions, conn, args.samples, rng)
        finally:
            conn.send(None)
            child.join(120)
            began = time.perf_counter()
            rt.stop(timeout=600)
            stop_s = time.perf_counter() - began
        per_session_kib = (rss_top - rss_empty) * 1024 / args.sessions
        print(f"live sessions           {live}")
        print(
            f"RSS                     {rss_top:.0f} MiB ({rss_empty:.0f} MiB before the start, "
            f"{per_session_kib:.1f} KiB per live session); target <= 2048 MiB"
        )
        print(f"threads                 {thread_count}; target <= {threads + 32}")
        print(
            f"warm turn p50           {p50_base * 1e3:.2f} ms at {args.base}, "
            f"{p50_top * 1e3:.2f} ms at {args.sessions}: {p50_top / p50_base:.2f}x; "
            f"median of the batch pairs' ratios {ratio:.2f}x; target <= 1.3x"
        )
        print(
            f"growing                 {args.sessions} sessions in {took:.0f} s "
            f"({args.sessions / took:.0f} new sessions/s)"
        )
        print(f"stop                    {stop_s:.1f} s with {live} live sessions")


if __name__ == "__main__":
    main()
