"""The kill loop: SIGKILL a loopd process at random instants, restart it, check what it promised.

    python tests/killloop/killloop.py [--iterations N] [--seed S] [--home DIR] [--postgres]

Each iteration starts ``killloop_driver.py work`` on one home with a new seed and kills it with
SIGKILL, either at a random instant (0.05 to 1.5 s into its work) or right after a chosen thing
was told (the k-th model answer, tool result, decision, child's end, turn start or approval
request: the driver prints each journal line once it is durable). Then ``killloop_driver.py
settle`` starts on the same home, decides what waits for a person, waits until every family is
idle and stops. Then the store, the two journals and the side-effect log are checked
(``killloop_check``), and no MCP server a driver started may outlive it. The seed of every
iteration derives from the loop's seed, so a failing iteration is repeated by its one-line
repro (the kill instant still depends on timing).

``--postgres`` (or :func:`run` given a :class:`Postgres`) runs the same loop on a PostgreSQL store
(``LOOPD_KILLLOOP_STORE_URL`` in the drivers' environment) and adds three faults, each in about
one iteration of five: the server restarts while the work run runs (then the kill); a second
process (``probe``, on a second home) starts and stops while the work run holds its sessions;
the settling run starts on a second home (a new process on the same store, not the dead one's
machine).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from killloop_check import (  # noqa: E402
    GUARANTEES,
    StoreView,
    Violation,
    check_iteration,
    check_probe,
    read_journal,
)

DRIVER = HERE / "killloop_driver.py"
MCP_SERVER = HERE / "effects_mcp.py"
ORPHAN_WAIT_S = 5.0
"""How long an MCP server may take to end after its driver did (its stdin closed)."""
CHOSEN = (
    "event ModelAnswered",
    "event ToolCallFinished",
    "decision ApprovalSettled",
    "event SubagentFinished",
    "event TurnStarted",
    "event ApprovalRequested",
    "outcome TurnCompleted",
    "event Compacted",
)
START_WAIT_S = 60.0
SETTLE_S = 90.0
PROBE_WAIT_S = 60.0
STORE_URL_ENV = "LOOPD_KILLLOOP_STORE_URL"
FAULTS = ("kill", "restart PostgreSQL", "second process while running", "settle on a second home")
FAULT_WEIGHTS = (0.4, 0.2, 0.2, 0.2)


@dataclass
class Postgres:
    """A PostgreSQL store for the loop: its url, and how to restart its server (``None``: the
    restart fault is not drawn)."""

    url: str
    restart: Callable[[], None] | None = None


@dataclass
class Tally:
    """The loop's figures."""

    iterations: int = 0
    kill_points: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    violations: list[tuple[int, int, Violation]] = field(default_factory=list)
    told: Counter[str] = field(default_factory=Counter)
    untold_ends: int = 0
    """Turns whose end was stored with their outcome just before the kill, not yet told."""
    mcp: Counter[str] = field(default_factory=Counter)
    """MCP calls: run in the killed runs, results told, calls the kill cut off."""
    orphans: list[tuple[int, str]] = field(default_factory=list)
    """(iteration, command line) of each MCP server found running after its driver ended."""

    def by_guarantee(self) -> dict[str, tuple[int, int]]:
        """guarantee -> (iterations that broke it, cases)."""
        out = {}
        for g in GUARANTEES:
            cases = [(i, v) for i, _, v in self.violations if v.guarantee == g]
            out[g] = (len({i for i, _ in cases}), len(cases))
        return out


class Process:
    """One driver process; a thread reads the kinds of what it journals."""

    def __init__(self, args: list[str], stderr: Path, url: str | None = None) -> None:
        env = dict(os.environ)
        env.pop(STORE_URL_ENV, None)
        if url is not None:
            env[STORE_URL_ENV] = url
        with stderr.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(DRIVER), *args],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=env,
            )
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.eof = False
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line.strip())
                self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def count(self, kind: str) -> int:
        """How many lines of ``kind`` were journalled so far."""
        with self.cond:
            return sum(1 for x in self.lines if x.startswith(kind))

    def wait_for(self, kind: str, count: int, timeout: float) -> bool:
        """Block until the ``count``-th line of ``kind`` was journalled (or exit, or timeout)."""
        with self.cond:
            return (
                self.cond.wait_for(
                    lambda: sum(1 for x in self.lines if x.startswith(kind)) >= count or self.eof,
                    timeout,
                )
                and not self.eof
            )

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.reader.join(timeout=30)


def mcp_servers_of(effects: Path) -> dict[int, str]:
    """The loop's MCP servers still running (pid -> command line): those writing to
    ``effects``. Read from /proc; a process that ends meanwhile is skipped."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv if a]
        if str(MCP_SERVER) in words and str(effects) in words:
            try:  # a zombie has ended: its parent has not reaped it yet
                if (proc / "stat").read_text().rpartition(")")[2].split()[0] == "Z":
                    continue
            except OSError:
                continue
            found[int(proc.name)] = " ".join(words)
    return found


def orphans_after(effects: Path) -> dict[int, str]:
    """The loop's MCP servers still running :data:`ORPHAN_WAIT_S` after every driver ended
    (each has had that long to see its stdin close); each is killed once found."""
    deadline = time.monotonic() + ORPHAN_WAIT_S
    left = mcp_servers_of(effects)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = mcp_servers_of(effects)
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return left


def run(
    iterations: int,
    seed: int,
    home_root: Path,
    out=sys.stdout,
    postgres: Postgres | None = None,
) -> Tally:
    """The loop; returns its tally. Prints one line per iteration that broke a guarantee.

    With ``postgres`` the drivers share its database, and each iteration draws a fault."""
    rng = random.Random(seed)
    home, journal_dir = home_root / "home", home_root / "journals"
    second_home = home_root / "home-2"
    journal_dir.mkdir(parents=True, exist_ok=True)
    effects = home_root / "effects.log"
    stderr = home_root / "driver.stderr"
    url = postgres.url if postgres is not None else None
    tally = Tally()
    for i in range(1, iterations + 1):
        work_seed = rng.randrange(1 << 30)
        fault = "kill"
        if postgres is not None:
            fault = rng.choices(FAULTS, FAULT_WEIGHTS)[0]
            if fault == "restart PostgreSQL" and postgres.restart is None:
                fault = "kill"
        work_j, settle_j = journal_dir / f"{i}-work.jsonl", journal_dir / f"{i}-settle.jsonl"
        probe_j = journal_dir / f"{i}-probe.jsonl"
        worker = Process(
            ["work", str(home), str(work_j), str(effects), str(work_seed), "120"], stderr, url
        )
        probe: list[dict] | None = None
        try:
            if not worker.wait_for("started", 1, START_WAIT_S):
                raise RuntimeError(f"iteration {i}: the work run did not start; see {stderr}")
            if fault == "restart PostgreSQL":
                assert postgres is not None and postgres.restart is not None
                threading.Event().wait(rng.uniform(0.05, 1.0))
                postgres.restart()
            elif fault == "second process while running":
                threading.Event().wait(rng.uniform(0.05, 0.8))
                prober = Process(
                    ["probe", str(second_home), str(probe_j), str(effects), str(work_seed + 2)],
                    stderr,
                    url,
                )
                try:
                    prober.proc.wait(timeout=PROBE_WAIT_S)
                except subprocess.TimeoutExpired:
                    pass
                finally:
                    prober.kill()
                # Only a probe that began and ended while the work run lived is checked.
                if worker.proc.poll() is None:
                    probe = read_journal(probe_j)
            if rng.random() < 0.5:
                point = "random instant"
                threading.Event().wait(rng.uniform(0.05, 1.5))
            else:
                kind, k = rng.choice(CHOSEN), rng.randint(1, 6)
                point = f"after {kind.split()[1]}"
                if not worker.wait_for(kind, worker.count(kind) + k, 5.0):
                    point = "random instant (chosen event not reached)"
        finally:
            worker.kill()
        tally.kill_points[point] += 1
        tally.faults[fault] += 1
        settle_home = second_home if fault == "settle on a second home" else home
        settler = Process(
            ["settle", str(settle_home), str(settle_j), str(effects), str(work_seed + 1), "60"],
            stderr,
            url,
        )
        try:
            settler.proc.wait(timeout=SETTLE_S)
        except subprocess.TimeoutExpired:
            pass
        finally:
            settler.kill()
        work, settle = read_journal(work_j), read_journal(settle_j)
        settled = any(line["kind"] == "settled" for line in settle)
        tally.told.update(line["tag"] for line in work if line["kind"] in ("event", "decision"))
        effect_lines = read_journal(effects)
        view = StoreView(home / "loopd.db", url)
        found = check_iteration(work, settle, effect_lines, view, settled)
        if probe is not None:
            found += check_probe(probe)
        tally.untold_ends += len(view.untold_ends)
        tally.mcp.update(view.mcp)
        for command in orphans_after(effects).values():
            tally.orphans.append((i, command))
            print(f"iteration {i}: an MCP server outlived its driver: {command}", file=out)
        tally.iterations += 1
        for v in found:
            tally.violations.append((i, work_seed, v))
        if found:
            print(
                f"iteration {i} (work seed {work_seed}, {fault}, killed {point}): {len(found)} "
                f"violation(s); first: {found[0]}",
                file=out,
                flush=True,
            )
    return tally


def report(tally: Tally, seed: int, elapsed: float, postgres: bool = False) -> str:
    """The table of the loop's figures, and the first violation's repro line."""
    store = "PostgreSQL" if postgres else "SQLite"
    rows = [
        f"kill loop on {store}, seed {seed}: {tally.iterations} iterations in {elapsed:.0f} s",
        "kill points: " + ", ".join(f"{n} {p}" for p, n in tally.kill_points.most_common()),
        "faults: " + ", ".join(f"{n} {f}" for f, n in tally.faults.most_common()),
        "| guarantee | iterations that broke it | cases |",
        "| --- | --- | --- |",
    ]
    for g, (its, cases) in tally.by_guarantee().items():
        rows.append(f"| {g} | {its} of {tally.iterations} | {cases} |")
    rows.append(
        f"turns whose end was stored with their outcome just before the kill, never told "
        f"ended (the start finds nothing running): {tally.untold_ends}"
    )
    rows.append(
        f"MCP calls: {tally.mcp['ran']} ran in the killed runs, {tally.mcp['told finished']} "
        f"results told, {tally.mcp['cut off']} cut off by the kill and answered interrupted "
        f"({tally.mcp['cut off after it ran']} after the server ran them, "
        f"{tally.mcp['cut off, approved']} approved by a person); MCP servers left running "
        f"after their driver ended: {len(tally.orphans)}"
    )
    if tally.violations:
        i, _work_seed, v = tally.violations[0]
        flag = " --postgres" if postgres else ""
        rows.append(
            f"first violation: iteration {i}: {v}\nrepro: python tests/killloop/killloop.py "
            f"--seed {seed} --iterations {i}{flag}"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--home", type=Path, default=None)
    parser.add_argument(
        "--postgres",
        action="store_true",
        help="on a throwaway PostgreSQL server (initdb/pg_ctl), with its faults",
    )
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    root = args.home or Path(tempfile.mkdtemp(prefix="killloop-"))
    started = time.monotonic()
    if args.postgres:
        from actors.testing.postgres import PostgresServer

        with PostgresServer() as server:
            url = server.create_database("loopd_killloop")
            tally = run(args.iterations, seed, root, postgres=Postgres(url, restart_of(server)))
    else:
        tally = run(args.iterations, seed, root)
    print(report(tally, seed, time.monotonic() - started, postgres=args.postgres))
    print(f"home, journals and logs kept in {root}")
    return 1 if tally.violations or tally.orphans else 0


def restart_of(server: Any) -> Callable[[], None]:
    """Restart a :class:`~actors.testing.postgres.PostgresServer`: a fast stop (every
    connection ended), then a start on the same port and data."""

    def restart() -> None:
        server.stop()
        server.start()

    return restart


if __name__ == "__main__":
    sys.exit(main())
