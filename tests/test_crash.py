"""Crash safety, for real: SIGKILL a runtime at random points of its turns, many times over.

Each round starts tests/crash_driver.py on the same home (turns on three sessions at once, with
children and grandchildren in flight), lets it end a few turns, waits a random moment more and
kills it with SIGKILL. After each kill the store is opened as it is (no repair by hand) and every
session is checked:

1. every message seen at the previous check is still there, with the same seq and the same
   bytes, and every turn the driver reported completed has its answer stored;
2. call ids are unique and strictly increasing over a session's whole history (1, 2, 3...), and
   its ``next_call_id`` is above every id used;
3. every tool message answers a call of the assistant message before it, once (an answer's
   results in any order: each is stored as it comes);
4. only a session's last assistant message may have calls without results (a cut-off turn).

A cut-off top-level turn must be repaired by the next turn on that session: a child that was in
flight answers ``<child> failed``, any other call the interrupted denial. The last step runs one
turn on every top-level session in this process and checks that nothing is left unanswered.

``LOOPD_CRASH_ROUNDS`` sets the number of kills (default 15); ``LOOPD_CRASH_SEED`` replays the
random choices of the test side (the kill points still depend on timing). Run with ``-s`` to
see the figures.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

from actors.core.dispatch import child_id
from actors.core.turn import SUMMARY_PREFIX
from actors.stores.base import StoredMessage
from actors.stores.sqlite import DB_NAME, SessionStore
from actors.testing import reply
from messages import ChatMessage, DenyReason, ModelRequest, TurnCompleted, denial_message

DRIVER = Path(__file__).with_name("crash_driver.py")
ROUNDS = int(os.environ.get("LOOPD_CRASH_ROUNDS", "15"))
PROGRESS_WAIT = 30.0
"""Seconds a driver may take to start and end its first turns before the test gives up."""
INTERRUPTED = denial_message(DenyReason.INTERRUPTED)
_encode = msgspec.json.Encoder().encode


@dataclass
class CutOff:
    """A turn found cut off after a kill: its assistant message has calls without results."""

    session: str
    seq: int
    calls: tuple[tuple[int, str], ...]
    end: int  # the last stored message then: results that came before the kill go before
    repaired: bool = False


@dataclass
class Ledger:
    """What the checks remember from one kill to the next, and the figures they report."""

    seen: dict[str, dict[int, tuple[bytes, bool]]] = field(default_factory=dict)
    cut_offs: dict[tuple[str, int], CutOff] = field(default_factory=dict)
    children_at_kill: dict[str, str] = field(default_factory=dict)
    kill_points: Counter[str] = field(default_factory=Counter)
    kills: int = 0
    turns_reported: int = 0
    turns_failed: Counter[str] = field(default_factory=Counter)
    checked: int = 0
    lost: int = 0
    children_failed: int = 0

    def top_cut_offs(self) -> list[CutOff]:
        return [c for c in self.cut_offs.values() if not is_child(c.session)]


class Driver:
    """One crash_driver.py process, with a thread collecting the lines it prints."""

    def __init__(self, home: Path, seed: int, log: Path) -> None:
        self.log = log
        with log.open("ab") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, str(DRIVER), str(home), str(seed)],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self.lines: list[str] = []
        self.eof = False
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()
        with self.changed:
            self.eof = True
            self.changed.notify_all()

    def wait_for_turns(self, k: int, timeout: float) -> None:
        """Block until the driver has ended ``k`` turns, with a deadline."""
        with self.changed:
            self.changed.wait_for(lambda: len(self.lines) >= k or self.eof, timeout)
            n = len(self.lines)
        if n < k:
            self.fail(f"only {n} of {k} turns ended within {timeout} s")

    def keep_running(self, seconds: float) -> None:
        """Let the driver run ``seconds`` more (a wait with a deadline); it must not exit."""
        try:
            self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return
        self.fail("the driver exited by itself")

    def kill(self) -> list[dict[str, Any]]:
        """SIGKILL the driver; return every line it printed."""
        os.kill(self.proc.pid, signal.SIGKILL)
        assert self.proc.wait(timeout=10) == -signal.SIGKILL
        self.reader.join(timeout=10)
        assert self.eof, "the driver's stdout did not close after the kill"
        return [json.loads(line) for line in self.lines]

    def stop(self) -> None:
        """Kill the driver if it still runs (a failed round)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def fail(self, why: str) -> None:
        self.stop()
        stderr = self.log.read_text(errors="replace")[-4000:]
        pytest.fail(f"{why} (exit {self.proc.returncode}); driver stderr:\n{stderr}")


def is_child(session: str) -> bool:
    return session.startswith("sub-")


def parent_of(child: str) -> tuple[str, int]:
    """``sub-<parent>-<n>`` gives ``(parent, n)``."""
    parent, _, n = child.removeprefix("sub-").rpartition("-")
    return parent, int(n)


def is_summary(message: ChatMessage) -> bool:
    """True for the user message a compaction leaves in place of the history."""
    return message.role == "user" and (message.content or "").startswith(SUMMARY_PREFIX)


def repair_text(session: str, call_id: int, name: str) -> str:
    """What a cut-off call must be answered on the session's next turn."""
    if name == "subagent":
        return f"{child_id(session, call_id)} failed"
    return INTERRUPTED


def describe(history: list[StoredMessage]) -> str:
    """A session's history, one line a message: a failure's evidence."""
    lines = []
    for stored in history:
        m = stored.message
        calls = [(c.id, c.name) for c in m.tool_calls]
        flag = " compacted" if stored.compacted else ""
        lines.append(
            f"  {stored.seq}{flag} {m.role} id={m.tool_call_id} calls={calls} {m.content!r}"
        )
    return "\n".join(lines)


def kill_point(session: str, history: list[StoredMessage]) -> str:
    """Where the kill left a session: what its history ends with."""
    kind = "child" if is_child(session) else "top-level"
    if not history:
        return f"{kind}: created, nothing stored yet"
    last = history[-1].message
    if last.role == "assistant":
        return f"{kind}: calls in flight" if last.tool_calls else f"{kind}: turn done"
    return f"{kind}: model request in flight"


def check_session(
    store: SessionStore, session: str, ledger: Ledger
) -> tuple[list[StoredMessage], list[str]]:
    """Check one session against the invariants; returns its history and the problems found."""
    history = store.history(session)
    record = store.open(session)
    ledger.checked += len(history)
    problems: list[str] = []
    problem = problems.append

    # The store's own view: seqs 1..n, and open() gives the history that is not compacted.
    if [s.seq for s in history] != list(range(1, len(history) + 1)):
        problem("seqs are not 1..n")
    live = [s.message for s in history if not s.compacted]
    if list(record.transcript) != live:
        problem("open() does not give the history that is not compacted")

    # 1. Nothing committed before is lost or changed (compaction may only mark a message).
    by_seq = {s.seq: s for s in history}
    seen = ledger.seen.setdefault(session, {})
    for seq, (body, compacted) in seen.items():
        now = by_seq.get(seq)
        if now is None or _encode(now.message) != body or (compacted and not now.compacted):
            ledger.lost += 1
            problem(f"message {seq} was committed, and is now {now}")
    seen.update({s.seq: (_encode(s.message), s.compacted) for s in history})

    # 2, 3 and 4: walk the whole history as the model API reads a transcript.
    used: list[int] = []
    pending: list[tuple[int, str]] = []
    pending_seq = 0
    for s in history:
        m = s.message
        if m.role == "tool":
            # An answer's results are stored as they come, in any order (the model reads
            # them in call order): each answers one of the calls still open, once.
            open_ids = [c for c, _ in pending]
            if m.tool_call_id in open_ids:
                pending.pop(open_ids.index(m.tool_call_id))
            elif m.tool_call_id in used:
                problem(f"{s.seq} answers call {m.tool_call_id} twice")
            else:
                problem(f"{s.seq} answers call {m.tool_call_id}, which was never made")
            continue
        if pending:
            problem(f"{s.seq} ({m.role}) comes after calls {pending} of {pending_seq} unanswered")
            pending = []
        for c in m.tool_calls:
            if used and c.id <= used[-1]:
                problem(f"call id {c.id} at {s.seq} is not above the previous {used[-1]}")
            used.append(c.id)
        if m.tool_calls:
            pending, pending_seq = [(c.id, c.name) for c in m.tool_calls], s.seq
    if used != list(range(1, len(used) + 1)):
        problem(f"the call ids are not 1, 2, 3...: {used}")
    if used and record.next_call_id <= used[-1]:
        problem(f"next_call_id {record.next_call_id} is not above the used id {used[-1]}")

    # A cut-off turn: remember it; and a turn found cut off before must be repaired exactly.
    if pending:
        key = (session, pending_seq)
        ledger.cut_offs.setdefault(
            key, CutOff(session, pending_seq, tuple(pending), history[-1].seq)
        )
    for cut in ledger.cut_offs.values():
        if cut.session != session or cut.repaired or cut.end + 1 not in by_seq:
            continue
        expected = [
            ChatMessage(role="tool", content=repair_text(session, i, name), tool_call_id=i)
            for i, name in cut.calls
        ]
        after = range(cut.end + 1, cut.end + 1 + len(expected))
        got = [by_seq[q].message if q in by_seq else None for q in after]
        following = by_seq.get(cut.end + 1 + len(expected))
        # Repaired by the next start (nothing after it yet) or before the session's next turn.
        if got != expected or (following is not None and following.message.role != "user"):
            problem(f"the turn cut off at {cut.seq} was not repaired as expected: {got}")
        cut.repaired = True
        ledger.children_failed += sum(1 for _, name in cut.calls if name == "subagent")

    # A child ran one turn at most (a second one would mean its call id was used twice).
    if is_child(session):
        users = [s for s in history if s.message.role == "user" and not is_summary(s.message)]
        if record.turns > 1 or len(users) > 1:
            problem("a child ran more than one turn (its call id was used twice?)")

    if problems:
        problems = [f"{session}: {p}" for p in problems] + [describe(history)]
    return history, problems


def check_home(
    db: Path, ledger: Ledger, reported: list[dict[str, Any]], *, after_kill: bool = True
) -> set[str]:
    """Check every session of the store at ``db``; returns the session ids."""
    problems: list[str] = []
    with SessionStore(db) as store:
        sessions = {info.id for info in store.list_sessions()}
        answers: dict[str, set[str | None]] = {}
        subagent_calls: set[tuple[str, int]] = set()
        states: dict[str, str] = {}
        for session in sorted(sessions):
            history, found = check_session(store, session, ledger)
            problems += found
            answers[session] = {s.message.content for s in history if s.message.role == "assistant"}
            subagent_calls.update(
                (session, c.id)
                for s in history
                for c in s.message.tool_calls
                if c.name == "subagent"
            )
            states[session] = kill_point(session, history)
            if after_kill and not is_child(session):
                ledger.kill_points[states[session]] += 1
    # The children whose parent's call the kill cut off: where each of them was.
    for cut in ledger.cut_offs.values():
        if not cut.repaired:
            for call_id, name in cut.calls:
                if name == "subagent":
                    child = child_id(cut.session, call_id)
                    ledger.children_at_kill.setdefault(child, states.get(child, "not stored yet"))
    # Every child was made by a stored subagent call of its parent, with that call's id.
    orphans = [s for s in sessions if is_child(s) and parent_of(s) not in subagent_calls]
    if orphans:
        problems.append(f"children that no stored subagent call made: {sorted(orphans)}")
    missing = sorted(set(ledger.seen) - sessions)
    if missing:
        ledger.lost += sum(len(ledger.seen[s]) for s in missing)
        problems.append(f"sessions gone from the store: {missing}")
    for line in reported:
        if line["completed"] and line["content"] not in answers.get(line["session"], set()):
            ledger.lost += 1
            problems.append(f"the driver reported {line}, and that answer is not stored")
    assert not problems, "\n".join(problems)
    return sessions


@pytest.mark.timeout(max(180, 3 * ROUNDS))
def test_sigkill_during_turns_loses_nothing_and_resumes_cleanly(
    loopd_runtime, loopd_config, tmp_path
) -> None:
    seed = int(os.environ.get("LOOPD_CRASH_SEED") or random.randrange(1 << 30))
    rng = random.Random(seed)
    home = loopd_config.home_path
    db = home / DB_NAME
    log = tmp_path / "driver.stderr"
    ledger = Ledger()
    started = time.monotonic()
    for round_ in range(1, ROUNDS + 1):
        driver = Driver(home, rng.randrange(1 << 30), log)
        try:
            driver.wait_for_turns(rng.randint(1, 3), PROGRESS_WAIT)
            driver.keep_running(rng.uniform(0.0, 0.3))
            reported = driver.kill()
        finally:
            driver.stop()
        ledger.kills += 1
        ledger.turns_reported += len(reported)
        ledger.turns_failed.update(line["content"] for line in reported if not line["completed"])
        try:
            sessions = check_home(db, ledger, reported)
        except AssertionError as exc:
            raise AssertionError(f"after kill {round_} (test seed {seed}):\n{exc}") from None

    # One last start, in this process: a turn on every top-level session repairs what is left.
    def resume(request: ModelRequest):
        return reply(f"{request.session} resumed")

    rt = loopd_runtime(resume)
    tops = sorted(s for s in sessions if not is_child(s))
    for session in tops:
        outcome = rt.run_turn(session, "resume", timeout=30)
        assert outcome == TurnCompleted(session, f"{session} resumed")
    rt.stop()
    try:
        sessions = check_home(db, ledger, [], after_kill=False)
    except AssertionError as exc:
        raise AssertionError(f"after the last start (test seed {seed}):\n{exc}") from None
    compactions = 0
    with SessionStore(db) as store:
        for session in tops:
            history = store.history(session)
            assert history[-1].message == ChatMessage(
                role="assistant", content=f"{session} resumed"
            )
            compactions += sum(1 for s in history if is_summary(s.message))
    top_cut = ledger.top_cut_offs()
    assert [c for c in top_cut if not c.repaired] == [], "cut-off turns left unanswered"
    elapsed = time.monotonic() - started

    children = ", ".join(
        f"{n} {p.removeprefix('child: ')}"
        for p, n in sorted(Counter(ledger.children_at_kill.values()).items())
    )
    points = ", ".join(f"{n} {p}" for p, n in sorted(ledger.kill_points.items()))
    print(
        f"\ncrash suite, test seed {seed}: {ledger.kills} kills in {elapsed:.1f} s; "
        f"{ledger.checked} messages checked, {ledger.lost} lost; "
        f"{len(sessions)} sessions ({len(tops)} top level); "
        f"{ledger.turns_reported} turns reported ended before the kills "
        f"({ledger.turns_failed.total()} of them failed on a scripted model error); "
        f"{compactions} compactions of top-level sessions.\n"
        f"cut-off top-level turns: {len(top_cut)} found, {sum(c.repaired for c in top_cut)} "
        f"repaired, {ledger.children_failed} in-flight child calls answered '<child> failed'; "
        f"{len(ledger.children_at_kill)} children in flight at the kills: {children}.\n"
        f"top-level sessions at the kills: {points}."
    )
    # The driver's model fails now and then on purpose; no turn may fail any other way.
    assert set(ledger.turns_failed) <= {"model_error"}, ledger.turns_failed
    assert ledger.kills == ROUNDS
    assert ledger.lost == 0
