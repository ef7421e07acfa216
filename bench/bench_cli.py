"""How fast the ``loopd`` command starts: each command's wall time against ``python -c pass``.

Run: python bench/bench_cli.py [--runs 15] [--home DIR]. It makes a small home (the demo's
three sessions and one call waiting for a person), then runs each command ``--runs`` times as a
new process, the commands interleaved round by round (so a burst of load on the machine falls
on all of them alike), and prints each one's median wall time and its median above ``python
-c pass`` measured in the same run, beside the target (``--version`` and ``--help`` within
0.25 s above it, ``sessions`` and ``approvals`` within 0.5 s). Nothing is asserted: the figures
go to docs/performance.md.

The command runs as the ``loopd`` console script does (``from actors.shells.cli import main``),
with the interpreter running this bench; set PYTHONPATH to measure a source tree.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

LOOPD = "import sys; from actors.shells.cli import main; sys.exit(main())"
"""What the ``loopd`` console script runs."""

COMMANDS: list[tuple[str, list[str], float | None]] = [
    ("python -c pass", [], None),
    ("loopd --version", ["--version"], 0.25),
    ("loopd --help", ["--help"], 0.25),
    ("loopd sessions", ["sessions"], 0.5),
    ("loopd sessions --json", ["sessions", "--json"], 0.5),
    ("loopd sessions show demo", ["sessions", "show", "demo"], 0.5),
    ("loopd approvals", ["approvals"], 0.5),
    ("loopd approvals --json", ["approvals", "--json"], 0.5),
]
"""(label, loopd's arguments, target in s above ``python -c pass``); no arguments: the floor."""


def small_home(home: Path) -> None:
    """The demo's sessions, and a call of ``deploy`` waiting for a person, stored in ``home``."""
    subprocess.run(
        [sys.executable, "-c", LOOPD, "demo", "--home", str(home)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    from actors.stores.sqlite import DB_NAME, SessionStore
    from messages import ApprovalRequested, StoredApproval

    store = SessionStore(home / DB_NAME)
    try:
        now = datetime.now(UTC)
        request = ApprovalRequested("demo", 7, "deploy", '{"env": "prod"}', at=now)
        entry = StoredApproval(request, deadline=now + timedelta(days=1))
        store.run_batch([("demo", lambda cur: store.add_approval_in(cur, entry))])
    finally:
        store.close()


def command(args: list[str], home: Path) -> list[str]:
    """The process to run for ``args`` (none: ``python -c pass``)."""
    if not args:
        return [sys.executable, "-c", "pass"]
    at_home = [] if args[0] in ("--version", "--help") else ["--home", str(home)]
    return [sys.executable, "-c", LOOPD, *args, *at_home]


def main() -> None:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="runs of each command")
    parser.add_argument("--home", type=Path, help="the home to use (default: a fresh one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="loopd-bench-cli-") as scratch:
        home = args.home or Path(scratch)
        if not any(home.iterdir()):
            small_home(home)
        times: dict[str, list[float]] = {label: [] for label, _, _ in COMMANDS}
        failed: dict[str, int] = {}  # a command this loopd does not have (an older one)
        for _ in range(args.runs):
            for label, argv, _ in COMMANDS:
                if label in failed:
                    continue
                start = time.perf_counter()
                done = subprocess.run(command(argv, home), capture_output=True, check=False)
                times[label].append(time.perf_counter() - start)
                if done.returncode != 0:
                    failed[label] = done.returncode
    floor = statistics.median(times["python -c pass"])
    print(f"loopd start-up, median of {args.runs} runs ({sys.executable})")
    print("| command | median | above python -c pass | target above |")
    print("|---|---|---|---|")
    for label, _, target in COMMANDS:
        if label in failed:
            print(f"| `{label}` | exit {failed[label]} | | |")
            continue
        median = statistics.median(times[label])
        above = "" if target is None else f"{median - floor:.3f} s"
        aim = "" if target is None else f"{target:g} s"
        print(f"| `{label}` | {median:.3f} s | {above} | {aim} |")


if __name__ == "__main__":
    main()
