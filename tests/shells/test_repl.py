"""``loopd repl``: the real console driven through a pseudo-terminal (SPEC 10).

Each test spawns ``python -m actors.shells.cli repl --scripted`` (the demo's scripted model,
offline)
with ``HOME`` and the store in the test's temporary folder, and talks to it as a user would:
lines at the ``>>> `` prompt, a TAB for completion, ``exit()`` or Ctrl-D to leave.
"""

from __future__ import annotations

import io
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pexpect
import pytest

from actors.core.config import Config
from actors.shells.repl import resolve_address, run_repl

PROMPT = ">>> "
DEMO_TURN = 'turn("demo", "Plan a short walk for this afternoon.")'
HELPERS = ("sessions()", "held()", "live()", "turn(", "send(", "tell(", "ask(", "show(", "tail(")


def event(session: str, what: str) -> str:
    """A regex for one rendered event line of ``session`` (at any depth) starting ``what``."""
    return rf"\d\d:\d\d:\d\d (?:│ )*{re.escape(session)}  {re.escape(what)}"


@pytest.fixture
def repl(tmp_path: Path) -> Iterator[Any]:
    """A started ``loopd repl --scripted``, at its first prompt; killed if a test leaves it."""
    env = dict(os.environ, HOME=str(tmp_path), TERM="dumb")
    env.pop("PYTHONSTARTUP", None)
    child = pexpect.spawn(
        sys.executable,
        ["-m", "actors.shells.cli", "repl", "--plain", "--scripted", "--home", str(tmp_path)],
        cwd=str(tmp_path),
        env=env,
        encoding="utf-8",
        timeout=20,
        dimensions=(50, 250),
    )
    try:
        child.expect_exact(PROMPT)
        yield child
    finally:
        if child.isalive():
            child.terminate(force=True)
        child.close()


def run(child: Any, line: str) -> str:
    """Send ``line``; return what it printed before the next prompt (echo included)."""
    child.sendline(line)
    child.expect_exact(PROMPT)
    before: str = child.before
    return before.replace("\r\n", "\n")


def sync(child: Any) -> None:
    """Wait until everything printed so far is read, prompts from before included."""
    child.sendline("print('SYNC' + 'MARK')")
    child.expect_exact("SYNCMARK")
    child.expect_exact(PROMPT)


def run_demo_turn(child: Any) -> str:
    """The demo's turn, with the live events checked in order; returns its output."""
    child.sendline(DEMO_TURN)
    for pattern in (
        event("demo", "turn started"),
        event("sub-demo-1", "turn started"),
        event("sub-sub-demo-1-1", "turn started"),
        event("sub-sub-demo-1-1", "turn completed"),
        event("sub-demo-1", "┴ sub-sub-demo-1-1 completed"),
        event("sub-demo-1", "turn completed"),
        event("demo", "┴ sub-demo-1 completed"),
        event("demo", "turn completed"),
        r"TurnCompleted\(session='demo', content='[^\r\n]*sub-demo-1 completed",
    ):
        child.expect(pattern)
    child.expect_exact(PROMPT)
    return str(child.before)


def test_banner_lists_the_helpers_then_prompts(repl: Any, tmp_path: Path) -> None:
    banner = repl.before
    for name in (*HELPERS, "rt, ctx", "messages", "Inspect", "StartTurn"):
        assert name in banner, f"{name} missing from the banner:\n{banner}"
    assert "scripted" in banner
    assert str(tmp_path) in banner


def test_turn_prints_the_live_tree_and_returns_the_outcome(repl: Any) -> None:
    out = run_demo_turn(repl)
    # The turn's own events all printed before the outcome, and nothing is left over.
    assert out.rstrip().endswith("')"), out
    assert run(repl, "1 + 1").endswith("2\n")


def test_sessions_held_ask_and_show_after_a_turn(repl: Any) -> None:
    run_demo_turn(repl)

    table = run(repl, "sessions()").splitlines()
    rows = {line.split()[0]: line.split() for line in table[2:] if line.strip()}
    assert table[1].split() == ["SESSION", "SLOT", "TURNS", "UNTRUSTED", "MESSAGES", "STATE"]
    assert set(rows) == {"demo", "sub-demo-1", "sub-sub-demo-1-1"}
    assert rows["demo"][-1] == "live"  # the user's session stays live, idle
    assert rows["sub-demo-1"][-1] == "-"  # a child's actor goes after its one turn
    assert all(r[2] == "1" for r in rows.values())

    assert run(repl, "held()").endswith("\n()\n")
    assert run(repl, "live()").endswith("\n('demo',)\n")
    assert run(repl, 'ask("demo", Inspect()).turns').endswith("\n1\n")
    assert "ContextStatus(held=(), live=('demo',))" in run(repl, 'ask("context", Inspect())')

    shown = run(repl, 'show("sub-demo-1")')
    assert "session   sub-demo-1" in shown
    assert "children  sub-sub-demo-1-1" in shown
    assert re.search(r"^    It is \d{4}-\d\d-\d\dT", shown, re.M), shown
    assert "→ #1 subagent(" in shown


def test_tab_completes_helper_names(repl: Any) -> None:
    repl.send("sessi\t")
    # rlcompleter adds "(" to a callable, and ")" too when it takes no arguments (3.10+).
    repl.expect(r"sessions\((\)?)")
    closing = repl.match.group(1)
    out = run(repl, "" if closing else ")")
    assert out.endswith("\nno sessions\n"), out  # it ran: nothing is stored yet


def test_errors_are_clear_and_the_console_goes_on(repl: Any) -> None:
    out = run(repl, 'ask("nope-x", Inspect())')
    assert "AddressError: no actor at address 'session:nope-x'" in out, out

    out = run(repl, 'turn("../x", "hi")')
    assert "ValueError: invalid session id '../x'" in out, out

    out = run(repl, 'ask("bad id", Inspect())')
    assert "ValueError: invalid session id 'bad id'" in out, out

    assert run(repl, "held()").endswith("\n()\n")  # still answering


def test_tail_and_send(repl: Any) -> None:
    assert "tail on" in run(repl, "tail()")
    repl.sendline('send("walk", "Plan a short walk for this afternoon.")')
    repl.expect(event("sub-sub-walk-1-1", "turn completed"))
    # The last event (bus thread) and the outcome (Context thread) may print in either order.
    last, outcome = event("walk", "turn completed"), r"send: TurnCompleted\(session='walk'"
    first = repl.expect([last, outcome])
    repl.expect([last, outcome][1 - first])
    sync(repl)
    assert "tail off" in run(repl, "tail(False)")
    out = run(repl, 'turn("walk", "Again.")')  # printed once, by turn, not twice
    assert len(re.findall(event("walk", "turn completed"), out)) == 1, out


@pytest.mark.parametrize("how", ["exit()", "eof"])
def test_exit_stops_the_runtime_with_status_0(repl: Any, how: str) -> None:
    if how == "eof":
        repl.sendeof()
    else:
        repl.sendline(how)
    repl.expect_exact("loopd: runtime stopped")
    repl.expect(pexpect.EOF)
    repl.close()
    assert repl.exitstatus == 0


def test_exit_right_after_send_stops_cleanly(repl: Any) -> None:
    repl.sendline('send("demo", "Plan a short walk for this afternoon.")')
    repl.expect_exact(PROMPT)
    repl.sendeof()
    repl.expect_exact("loopd: runtime stopped")
    repl.expect(pexpect.EOF)
    repl.close()
    assert repl.exitstatus == 0


# In process.


@pytest.mark.parametrize(
    ("target", "address"),
    [
        ("demo", "session:demo"),
        ("sub-demo-1", "session:sub-demo-1"),
        ("context", "context"),
        ("store", "store"),
        ("session:context", "session:context"),
        ("waiter:3", "waiter:3"),
    ],
)
def test_resolve_address(target: str, address: str) -> None:
    assert resolve_address(target) == address


@pytest.mark.parametrize("bad", ["", "../x", "a b", "-x", "x" * 65])
def test_resolve_address_refuses_invalid_ids(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid session id"):
        resolve_address(bad)


def test_run_repl_from_a_stream(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = [
        'outcome = turn("demo", "Plan a short walk for this afternoon.")',
        "print('REASON', type(outcome).__name__)",
        'print("TURNS", ask("demo", Inspect()).turns)',
        'tell("demo", Inspect())',
        'ask("nope-x", Inspect())',
        "print('HELD', held())",
        "raise SystemExit(3)",
    ]
    status = run_repl(
        Config(home=str(tmp_path)), scripted=True, stdin=io.StringIO("\n".join(lines) + "\n")
    )
    out, err = capsys.readouterr()
    assert status == 3
    assert "REASON TurnCompleted" in out
    assert "TURNS 1" in out
    assert "HELD ()" in out
    assert "AddressError: no actor at address 'session:nope-x'" in err
    assert out.rstrip().endswith("loopd: runtime stopped")
