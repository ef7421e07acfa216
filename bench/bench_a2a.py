"""Benchmark of a child on a remote loopd (A2A) against the same child in-process.

One scripted model server (the test kit's ChatServer, instant answers) serves every model of
the run, in a process of its own (so its CPU is not the caller's). The calling runtime runs in
this process; its parent model calls ``subagent`` once per turn, then answers the tool's text:

- in-process: ``agent="near"``, a local profile; the child's model answers at once;
- remote: ``agent="far"``, a profile whose ``a2a_url`` is a ``loopd serve --listen`` process
  with ``[a2a] serve = true`` on 127.0.0.1, its model the same server.

The two sides run alternated in blocks (``--turns`` parent turns one after another, new
sessions each), so a machine that gets busier or quieter meets each alike; a first round warms
both up. With ``--concurrent K`` each round also runs K parent turns at once on each side.
Printed: per-turn latency p50/p99 of each side, the ratio remote/in-process, the overhead of a
remote call (remote p50 minus in-process p50), CPU per turn in this (the calling) process and in
the remote loopd, and the HTTP requests the caller sent to the remote per call (the agent
card's read, ``SendMessage``, ``GetTask`` polls), counted on the caller's transport.

Run: python bench/bench_a2a.py [--turns N] [--repeats R] [--concurrent K]. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import queue
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from actors import Config, Runtime
from actors.core.config import AgentConfig, ModelConfig
from messages import TurnCompleted

WAIT = 60.0
LISTEN = ("--listen", "127.0.0.1:0")


# --- the model server's process ----------------------------------------------------------------


def model_here() -> None:
    """The model server's child: every model of the run, instant answers; prints its base URL,
    then serves until stdin closes. ``parent`` calls ``subagent`` (the agent the user's text
    names) and then answers the tool's text; ``child`` answers ``ok`` at once."""
    from actors.testing import ChatServer, call, reply

    def parent(body: dict[str, Any]) -> Any:
        last = body["messages"][-1]
        if last["role"] == "user":
            agent = "far" if str(last["content"]).endswith("far") else "near"
            return call("subagent", task="say ok", agent=agent)
        return reply(str(last.get("content") or ""))

    with ChatServer({"parent": parent, "child": lambda body: reply("ok")}) as server:
        print(server.base_url, flush=True)
        sys.stdin.read()


@contextlib.contextmanager
def model_server() -> Iterator[str]:
    """The model server's process; its base URL."""
    process = subprocess.Popen(
        [sys.executable, __file__, "--model"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        yield process.stdout.readline().strip()
    finally:
        assert process.stdin is not None
        process.stdin.close()
        process.wait(WAIT)


# --- the remote loopd ---------------------------------------------------------------------------


class FarLoopd:
    """``loopd serve --listen 127.0.0.1:0`` with ``[a2a] serve = true``, its model ``child`` at
    ``model_url``; ``cpu()`` its CPU seconds so far (``/proc``)."""

    def __init__(self, home: Path, model_url: str) -> None:
        config = home / "far.toml"
        config.write_text(
            f'home = "{home / "far"}"\n[model]\nbase_url = "{model_url}"\nname = "child"\n'
            "[a2a]\nserve = true\n"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "actors.shells.cli", "serve", "--config", str(config), *LISTEN],
            cwd=home,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.url = self._until("loopd serve: listening on ").rsplit(" ", 1)[1].strip()
        self._until("loopd serve: running on")

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)

    def _until(self, text: str) -> str:
        deadline = time.monotonic() + WAIT
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if text in line:
                return line
        raise RuntimeError(f"loopd serve never said {text!r}")

    def cpu(self) -> float:
        """The process's user and system CPU seconds so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(WAIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(WAIT)


# --- what the caller sends to the remote ------------------------------------------------------

_sent: collections.Counter[str] = collections.Counter()
_sent_lock = threading.Lock()


def count_requests() -> None:
    """Count each HTTP request the A2A service sends (the card's GET, each JSON-RPC method):
    its transport is wrapped here, in the bench only, to read what goes out."""
    from actors.services import a2a

    inner = a2a.BoundedTransport.handle_async_request

    async def counted(self: Any, request: Any) -> Any:
        what = request.method + " " + request.url.path.rsplit("/", 1)[-1]
        if request.method == "POST":
            with contextlib.suppress(ValueError, KeyError, TypeError):
                what = str(json.loads(request.content)["method"])
        with _sent_lock:
            _sent[what] += 1
        return await inner(self, request)

    a2a.BoundedTransport.handle_async_request = counted  # type: ignore[method-assign]


# --- the blocks ---------------------------------------------------------------------------------


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _p99(latencies: list[float]) -> float:
    return sorted(latencies)[max(0, int(len(latencies) * 0.99) - 1)]


def one_turn(rt: Runtime, session: str, agent: str) -> float:
    """One parent turn that calls ``agent`` once; its latency in seconds."""
    start = time.perf_counter()
    outcome = rt.run_turn(session, f"ask {agent}", timeout=WAIT)
    took = time.perf_counter() - start
    assert isinstance(outcome, TurnCompleted), outcome
    assert outcome.content == f"sub-{session}-1 completed\nok", outcome.content
    return took


def block(
    rt: Runtime, far: FarLoopd, agent: str, prefix: str, count: int, concurrent: bool
) -> dict[str, Any]:
    """``count`` parent turns calling ``agent``, one after another or all at once: their
    latencies, this process's and the remote loopd's CPU seconds."""
    latencies: list[float] = []
    cpu, far_cpu = _cpu(), far.cpu()
    if concurrent:
        lock = threading.Lock()

        def run(i: int) -> None:
            took = one_turn(rt, f"{prefix}{i}", agent)
            with lock:
                latencies.append(took)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
    else:
        latencies = [one_turn(rt, f"{prefix}{i}", agent) for i in range(count)]
    return {"lat": latencies, "cpu": _cpu() - cpu, "far_cpu": far.cpu() - far_cpu}


def summary(name: str, blocks: list[dict[str, Any]]) -> dict[str, float]:
    """The side's figures over its blocks, printed; returned for the ratio."""
    lat = [x for b in blocks for x in b["lat"]]
    n = len(lat)
    figures = {
        "p50": statistics.median(lat),
        "p99": _p99(lat),
        "cpu": sum(b["cpu"] for b in blocks) / n,
        "far_cpu": sum(b["far_cpu"] for b in blocks) / n,
    }
    print(
        f"{name:<34} {n:>4} turns: p50 {figures['p50'] * 1e3:6.1f} ms, p99 "
        f"{figures['p99'] * 1e3:6.1f} ms; CPU a turn: this process {figures['cpu'] * 1e3:5.2f}"
        f" ms, the remote loopd {figures['far_cpu'] * 1e3:5.2f} ms",
        flush=True,
    )
    return figures


def compare(what: str, near: dict[str, float], far: dict[str, float]) -> None:
    added = (far["p50"] - near["p50"]) * 1e3
    print(
        f"{what}: remote/in-process p50 {far['p50'] / near['p50']:.2f}x, p99 "
        f"{far['p99'] / near['p99']:.2f}x; a remote call adds {added:.1f} ms (p50) and "
        f"{(far['cpu'] - near['cpu']) * 1e3:.2f} ms of this process's CPU",
        flush=True,
    )


def run(turns: int, repeats: int, concurrent: int) -> None:
    count_requests()
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        model_url = stack.enter_context(model_server())
        far = FarLoopd(tmp, model_url)
        stack.callback(far.stop)
        agents = {
            "near": AgentConfig(description="a local child", model="child"),
            "far": AgentConfig(description="a child on a remote loopd", a2a_url=f"{far.url}/a2a"),
        }
        config = Config(
            home=str(tmp / "near"),
            model=ModelConfig(base_url=model_url, name="parent"),
            agents=agents,
        )
        rt = stack.enter_context(Runtime.start(config))
        sides: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
        for repeat in range(repeats + 1):
            warm = repeat == 0
            order = ("near", "far") if repeat % 2 else ("far", "near")
            for agent in order:
                before = sum(_sent.values())
                got = block(rt, far, agent, f"{agent}{repeat}-", turns, False)
                if not warm:
                    sides[agent].append(got)
                assert agent == "far" or sum(_sent.values()) == before
            if concurrent:
                for agent in order:
                    got = block(rt, far, agent, f"{agent}{repeat}c-", concurrent, True)
                    if not warm:
                        sides[agent + "+"].append(got)
        with _sent_lock:
            sent = dict(_sent)
    calls = (repeats + 1) * (turns + concurrent)
    near = summary(f"in-process child, {turns} turns in a row", sides["near"])
    remote = summary(f"remote loopd child, {turns} in a row", sides["far"])
    compare("one after another", near, remote)
    if concurrent:
        near_c = summary(f"in-process child, {concurrent} at once", sides["near+"])
        remote_c = summary(f"remote loopd child, {concurrent} at once", sides["far+"])
        compare(f"{concurrent} at once", near_c, remote_c)
    per_call = ", ".join(f"{what} {n / calls:.2f}" for what, n in sorted(sent.items()))
    print(f"requests to the remote per call ({calls} calls): {per_call}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=40, help="parent turns in a row a block")
    parser.add_argument("--repeats", type=int, default=5, help="rounds, after one to warm up")
    parser.add_argument(
        "--concurrent", type=int, default=10, help="parent turns at once a round (0: none)"
    )
    parser.add_argument("--model", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.model:
        model_here()
        return
    if args.turns < 1 or args.repeats < 1 or args.concurrent < 0:
        parser.error("--turns and --repeats must be 1 or more, --concurrent 0 or more")
    run(args.turns, args.repeats, args.concurrent)


if __name__ == "__main__":
    main()
