"""Benchmarks of a cluster (issue 13): turns/s with 1 and 2 shards, and a cross-process hop.

Run: python bench/bench_cluster.py [--turns N] (needs PostgreSQL's initdb/pg_ctl and
``loopd[ray]``; about a minute). It starts its own PostgreSQL server, a local Ray instance and
an OpenAI-compatible fake model on 127.0.0.1 that answers at once, so what is measured is loopd,
Ray and PostgreSQL, not a model:

- hop: the median ``run_turn`` of one session, one turn after another, on one process over the
  same PostgreSQL store, and on a one-shard cluster; the difference is what the cross-process
  hop (driver to shard and back through Ray, the outcome as msgpack bytes) adds to a turn;
- turns/s: 16 sessions at once, each running turns back to back, on one process, on a cluster of
  1 shard and of 2 shards.

Nothing here is asserted; the figures are in docs/cluster.md. The machine may be shared, so
read ratios, not absolutes.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from typing import Any

import ray

from actors import Config, ModelConfig, Runtime
from actors.core.config import ClusterConfig, StoreConfig
from actors.testing import ChatServer, reply
from actors.testing.postgres import PostgresServer
from messages import TurnCompleted

SESSIONS = 16


def configure(url: str, base_url: str, shards: int | None) -> Config:
    cluster = ClusterConfig(engine="ray", shards=shards) if shards else ClusterConfig()
    return Config(
        home=tempfile.mkdtemp(prefix="loopd-bench-"),
        model=ModelConfig(base_url=base_url, name="bench", retries=2, concurrency=16),
        store=StoreConfig(url=url),
        cluster=cluster,
    )


def hop(rt: Runtime, turns: int) -> float:
    """The median seconds of one turn of one session, turns back to back."""
    rt.run_turn("hop", "warm up", timeout=60)
    times = []
    for _ in range(turns):
        start = time.perf_counter()
        outcome = rt.run_turn("hop", "again", timeout=60)
        times.append(time.perf_counter() - start)
        assert isinstance(outcome, TurnCompleted), outcome
    return statistics.median(times)


def throughput(rt: Runtime, turns_each: int) -> float:
    """Turns per second of SESSIONS sessions running turns back to back, all at once."""
    for n in range(SESSIONS):  # every session exists: the figure is turns, not creations
        rt.run_turn(f"load-{n}", "warm up", timeout=60)  # (again on a repeat: cheap)
    failures: list[Any] = []

    def run(n: int) -> None:
        for _ in range(turns_each):
            outcome = rt.run_turn(f"load-{n}", "go", timeout=120)
            if not isinstance(outcome, TurnCompleted):
                failures.append(outcome)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(SESSIONS)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    assert not failures, failures[:3]
    return SESSIONS * turns_each / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10, help="turns per session (load)")
    parser.add_argument("--hops", type=int, default=50, help="turns of the hop figure")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats")
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    with PostgresServer() as pg, ChatServer(lambda body: reply("ok")) as server:
        setups = (("one process", None), ("1 shard", 1), ("2 shards", 2))
        runtimes = {
            label: Runtime.start(
                configure(pg.create_database(f"bench_{n or 0}"), server.base_url, n)
            )
            for label, n in setups
        }
        try:
            hops: dict[str, list[float]] = {label: [] for label in runtimes}
            rates: dict[str, list[float]] = {label: [] for label in runtimes}
            for _ in range(args.repeats):  # interleaved, so a busy moment hits all alike
                for label, rt in runtimes.items():
                    hops[label].append(hop(rt, args.hops))
                    rates[label].append(throughput(rt, args.turns))
        finally:
            for rt in runtimes.values():
                rt.stop()
    ray.shutdown()
    base = statistics.median(hops["one process"])
    print(f"medians of {args.repeats} interleaved repeats")
    print(f"{'':12} {'turn (median)':>14} {'hop adds':>9} {'turns/s':>8}")
    for label in runtimes:
        turn, rate = statistics.median(hops[label]), statistics.median(rates[label])
        added = f"{(turn - base) * 1000:.1f} ms" if label != "one process" else "-"
        print(f"{label:12} {turn * 1000:11.1f} ms {added:>9} {rate:8.0f}")


if __name__ == "__main__":
    main()
