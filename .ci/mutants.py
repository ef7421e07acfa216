"""The mutation lane (`tox -e mutants`): mutmut over actors/core against the fast tests.

Runs mutmut (its configuration is setup.cfg's [mutmut]: what it mutates, which tests it runs),
then turns its results into one row per module of actors/core (mutants, killed, survived, not
covered, set aside as equivalent, score) and lists the survivors.

    python .ci/mutants.py                        # every module, every mutant (the whole lane)
    python .ci/mutants.py --modules budget,slots # some modules only
    python .ci/mutants.py --sample               # one mutant in ten (numbers ending in 7)
    python .ci/mutants.py --report               # the table of the last run, running nothing

The same choices can come from the environment: MUTANTS_MODULES, MUTANTS_SAMPLE=1,
MUTANTS_WORKERS (default 2). mutmut copies the tree into ./mutants and runs the tests there; the
tests' subprocesses import from that copy too (PYTHONPATH is set to it), so a test that starts
`loopd` or a driver sees the mutant. The score counts a timeout as killed (the tests noticed)
and a mutant no selected test reaches as not killed. Mutants listed in
.ci/mutants-equivalent.txt (one `name fingerprint reason` a line) are set aside from the score
when they survive. A mutant's name is its number within its function, so a changed function
renumbers its mutants: the fingerprint (the first 8 hex digits of the SHA-256 of the mutant's
changed lines) must still match, or the line is reported stale and sets nothing aside.
mutmut's own output goes to mutants/mutmut.log.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "actors" / "core"
MUTANTS = ROOT / "mutants"
EQUIVALENT = ROOT / ".ci" / "mutants-equivalent.txt"

# The modules of the core that take decisions: the score the lane is held to.
DECISIONS = (
    "approval_steps",
    "approvals",
    "background",
    "budget",
    "compaction_steps",
    "context_state",
    "dispatch",
    "ending_steps",
    "output",
    "remote",
    "slots",
    "spawn",
    "turn",
)

KILLED = {1, 3, -24, 24, 152, 255, 36, -11, -9}  # failed, or timed out / crashed
SURVIVED = {0}
NO_TESTS = {33, 5}


def parse_args() -> argparse.Namespace:
    """The command line, with the environment's defaults."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--modules",
        default=os.environ.get("MUTANTS_MODULES", ""),
        help="comma-separated modules of actors/core (default: all)",
    )
    parser.add_argument(
        "--decisions",
        action="store_true",
        help="the decision modules only: " + ", ".join(DECISIONS),
    )
    parser.add_argument(
        "--sample",
        action="store_true",
        default=os.environ.get("MUTANTS_SAMPLE", "") not in ("", "0"),
        help="one mutant in ten: those whose number ends in 7",
    )
    parser.add_argument("--workers", type=int, default=int(os.environ.get("MUTANTS_WORKERS", "2")))
    parser.add_argument(
        "--report", action="store_true", help="print the last run's table, run nothing"
    )
    parser.add_argument("--show", action="store_true", help="print each survivor's diff")
    parser.add_argument(
        "--fail-under",
        type=float,
        default=None,
        help="exit 1 when a decision module scores under this percentage",
    )
    return parser.parse_args()


def chosen_modules(args: argparse.Namespace) -> list[str]:
    """The modules of actors/core to report (and to run)."""
    if args.modules:
        names = [m.strip().removesuffix(".py") for m in args.modules.split(",") if m.strip()]
        unknown = [m for m in names if not (CORE / f"{m}.py").is_file()]
        if unknown:
            raise SystemExit(f"mutants: no module actors/core/{unknown[0]}.py")
        return names
    if args.decisions:
        return list(DECISIONS)
    return sorted(p.stem for p in CORE.glob("*.py") if p.stem != "__init__")


def run_mutmut(modules: list[str], sample: bool, workers: int) -> None:
    """A fresh mutmut run of the chosen mutants; its output goes to mutants/mutmut.log."""
    if MUTANTS.exists():
        shutil.rmtree(MUTANTS)
    MUTANTS.mkdir()
    tail = "*__mutmut_*7" if sample else "*"
    globs = [f"actors.core.{m}.{tail}" for m in modules]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(MUTANTS)  # the tests' subprocesses import the mutated copy
    mutmut = mutmut_command()
    log = MUTANTS / "mutmut.log"
    print(f"mutants: mutmut on {len(modules)} module(s), sample={sample}, workers={workers}")
    with log.open("w") as out:
        code = subprocess.call(
            [mutmut, "run", "--max-children", str(workers), *globs],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    if code != 0:
        print(log.read_text(errors="replace")[-4000:])
        raise SystemExit(f"mutants: mutmut exited {code} (its output: {log})")


def mutmut_command() -> str:
    """The mutmut beside this Python (tox's environment), or on the PATH."""
    return shutil.which("mutmut") or str(Path(sys.executable).with_name("mutmut"))


def mutant_diff(name: str) -> str:
    """``mutmut show NAME``: the mutant's diff against the code it mutates."""
    shown = subprocess.run(
        [mutmut_command(), "show", name], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return shown.stdout


def fingerprint(diff: str) -> str:
    """The first 8 hex digits of the SHA-256 of a diff's changed lines, stripped."""
    changed = [
        line[1:].strip()
        for line in diff.splitlines()
        if line[:1] in ("+", "-") and not line.startswith(("+++", "---"))
    ]
    return hashlib.sha256("\n".join(changed).encode()).hexdigest()[:8]


def load_equivalent() -> dict[str, tuple[str, str]]:
    """The mutants set aside as equivalent: name -> (fingerprint, reason)."""
    found: dict[str, tuple[str, str]] = {}
    if not EQUIVALENT.is_file():
        return found
    for line in EQUIVALENT.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.partition(" ")
        mark, _, reason = rest.partition(" ")
        found[name] = (mark, reason.strip())
    return found


def still_equivalent(names: list[str], equivalent: dict[str, tuple[str, str]]) -> set[str]:
    """Those of ``names`` (survivors listed as equivalent) whose code is still the one the
    list's line was written for; the others are printed as stale."""
    kept: set[str] = set()
    for name in names:
        now = fingerprint(mutant_diff(name))
        if now == equivalent[name][0]:
            kept.add(name)
        else:
            print(
                f"mutants: stale line in {EQUIVALENT.name}: {name} is now another mutant "
                f"(fingerprint {now}); it is counted. Check it, then write its line again."
            )
    return kept


def report(modules: list[str], sample: bool, show: bool, fail_under: float | None) -> int:
    """Print the per-module table and the survivors; the exit code of the gate."""
    equivalent = load_equivalent()
    rows = []
    survivors: list[str] = []
    low: list[str] = []
    totals: Counter[str] = Counter()
    for module in modules:
        meta = MUTANTS / "actors" / "core" / f"{module}.py.meta"
        if not meta.is_file():
            continue
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        listed = [
            n
            for n, c in codes.items()
            if n in equivalent
            and c is not None
            and c not in KILLED
            and not (sample and not n.endswith("7"))
        ]
        set_aside = still_equivalent(listed, equivalent)
        count: Counter[str] = Counter()
        for name, code in codes.items():
            if sample and not name.endswith("7"):
                continue
            if code is None:
                continue  # not run (outside the chosen sample)
            if name in set_aside:
                count["equivalent"] += 1
            elif code in KILLED:
                count["killed"] += 1
            elif code in SURVIVED:
                count["survived"] += 1
                survivors.append(name)
            elif code in NO_TESTS:
                count["no tests"] += 1
                survivors.append(name)
            else:
                count["other"] += 1
                survivors.append(name)
        counted = count["killed"] + count["survived"] + count["no tests"] + count["other"]
        score = 100.0 * count["killed"] / counted if counted else 100.0
        totals.update(count)
        rows.append((module, count, score))
        if fail_under is not None and module in DECISIONS and score < fail_under:
            low.append(module)

    print()
    head = f"{'module':<16}{'mutants':>8}{'killed':>8}{'survived':>9}{'no tests':>9}"
    print(head + f"{'equiv.':>7}{'score':>8}")
    for module, count, score in rows:
        total = sum(count.values())
        print(
            f"{module:<16}{total:>8}{count['killed']:>8}{count['survived'] + count['other']:>9}"
            f"{count['no tests']:>9}{count['equivalent']:>7}{score:>7.1f}%"
        )
    counted = sum(totals.values()) - totals["equivalent"]
    overall = 100.0 * totals["killed"] / counted if counted else 100.0
    print(f"{'all':<16}{sum(totals.values()):>8}{totals['killed']:>8}", end="")
    print(
        f"{totals['survived'] + totals['other']:>9}{totals['no tests']:>9}"
        f"{totals['equivalent']:>7}{overall:>7.1f}%"
    )
    if survivors:
        print(f"\nsurvivors ({len(survivors)}; `mutmut show NAME` prints one's diff):")
        for name in sorted(survivors):
            print("  " + name)
            if show:
                print("    " + mutant_diff(name).replace("\n", "\n    "))
    print(f"\nmutation score: {overall:.1f}% of {counted} mutants killed")
    if low:
        print(f"mutants: under {fail_under}%: {', '.join(low)}")
        return 1
    return 0


def main() -> int:
    """Run the lane (or only report) and print the table."""
    args = parse_args()
    modules = chosen_modules(args)
    if not args.report:
        run_mutmut(modules, args.sample, args.workers)
    return report(modules, args.sample, args.show, args.fail_under)


if __name__ == "__main__":
    sys.exit(main())
