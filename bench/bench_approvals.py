"""Many sessions waiting for a person at once: memory and threads (issue 20).

Run: python bench/bench_approvals.py [--sessions 10000] [--passivate] [--home DIR]. It starts a
runtime whose
model answers every user message with one call of ``deploy`` (a port tool marked
``approval=True``), starts ``--sessions`` turns, waits until every call waits for a decision
(each stored, then announced), and prints the RSS and thread count before and after, the time
it took, and what one waiting session costs. With ``--passivate`` it then has the Context's idle
sweep park every waiting session (a ``Tick`` a day on), so each actor stops and each decision
resumes its turn from the store. Then it approves them all and times the turns to the end.
Nothing is asserted; docs/performance.md keeps the figures.

The home defaults to a fresh folder under /dev/shm (tmpfs) when there is one: this measures the
runtime, not the disk's fsync. Pass ``--home`` to measure on a disk.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from actors import Config, Runtime, port_tool
from actors.core.config import SessionsConfig
from messages import (
    ApprovalRequested,
    ModelAnswer,
    ModelRequest,
    ProposedCall,
    Tick,
    TurnEnded,
)


@port_tool(approval=True)
def deploy(env: str) -> str:
    """Deploy.

    Args:
        env: Where to.
    """
    return f"deployed to {env}"


class DeployModel:
    """Answers a user message with a ``deploy`` call and a tool result with "done", at once,
    on the model service's loop (no thread per request)."""

    async def acomplete(self, request: ModelRequest) -> ModelAnswer:
        if request.messages[-1].role == "user":
            call = ProposedCall("deploy", '{"env": "prod"}')
            return ModelAnswer(request.session, request.request_id, None, tool_calls=(call,))
        return ModelAnswer(request.session, request.request_id, "done")

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


class Counter:
    """Counts events of one kind; ``wait(n)`` blocks until ``n`` came (with a deadline)."""

    def __init__(self, kind: type) -> None:
        self.kind = kind
        self.count = 0
        self.changed = threading.Condition()

    def __call__(self, event: Any) -> None:
        if isinstance(event, self.kind):
            with self.changed:
                self.count += 1
                self.changed.notify_all()

    def wait(self, n: int, timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.count >= n, timeout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--home")
    parser.add_argument("--passivate", action="store_true", help="park the waiting sessions")
    args = parser.parse_args()
    base = "/dev/shm" if Path("/dev/shm").is_dir() else None
    home = args.home or tempfile.mkdtemp(prefix="loopd-bench-approvals-", dir=base)
    # Passivation off unless asked: every waiting session keeps its actor.
    idle_s = 3600.0 if args.passivate else 0.0  # the sweep itself is told below
    config = Config(home=home, sessions=SessionsConfig(idle_s=idle_s, max_live=0))
    rt = Runtime.start(config, model=DeployModel(), tools=[deploy])
    requested, ended = Counter(ApprovalRequested), Counter(TurnEnded)
    rt.subscribe(requested)
    rt.subscribe(ended)
    n = args.sessions
    try:
        rss0, threads0 = rss_mib(), threading.active_count()
        start = time.perf_counter()
        for i in range(n):
            rt.send_turn(f"wait-{i}", "ship it")
        if not requested.wait(n, 600):
            print(f"only {requested.count} of {n} calls waited in time", file=sys.stderr)
            return 1
        waited_s = time.perf_counter() - start
        rss1, threads1 = rss_mib(), threading.active_count()
        if args.passivate:
            start = time.perf_counter()
            rt.context.tell(Tick(now=datetime.now(UTC) + timedelta(days=1)))
            while len(rt.live(timeout=60)) > 0:  # a bench may look again; a test would not
                time.sleep(0.05)
            parked_s = time.perf_counter() - start
            print(f"  parked and passivated: {parked_s:.1f} s; RSS {rss_mib():.0f} MiB")
        pending = rt.pending_approvals(timeout=60)
        start = time.perf_counter()
        for request in pending:
            rt.approve(request.session, request.call_id, timeout=60)
        settled_s = time.perf_counter() - start
        if not ended.wait(n, 600):
            print(f"only {ended.count} of {n} turns ended in time", file=sys.stderr)
            return 1
        done_s = time.perf_counter() - start
        print(f"sessions waiting for a person: {len(pending)} of {n} (home {home})")
        print(f"  to stored and announced: {waited_s:.1f} s ({n / waited_s:,.0f} calls/s)")
        each = (rss1 - rss0) * 1024 / n
        print(f"  RSS {rss0:.0f} MiB before, {rss1:.0f} MiB waiting: {each:.1f} KiB each")
        print(f"  threads {threads0} before, {threads1} waiting (pid {os.getpid()})")
        print(f"  approve all (one Runtime.approve each): {settled_s:.1f} s")
        print(f"  all turns ended: {done_s:.1f} s")
    finally:
        rt.stop(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
