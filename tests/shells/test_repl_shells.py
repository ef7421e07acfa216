"""``loopd repl`` as a person meets it, through a pseudo-terminal: IPython or the plain console,
Ctrl-C during a turn, helpers that return data, and a mistake in one line."""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pexpect
import pytest

from actors.shells.cli import main
from actors.testing import ChatServer, reply
from actors.testing.script import Answer

PLAIN = re.escape(">>> ")
IPYTHON = r"In \[\d+\]: "
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

Spawn = Callable[..., Any]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """Start ``loopd repl ARGS`` in a pty; killed at the end if a test leaves it running."""
    children: list[Any] = []

    def start(*args: str) -> Any:
        env = dict(os.environ, HOME=str(tmp_path), TERM="dumb", PROMPT_TOOLKIT_NO_CPR="1")
        env.pop("PYTHONSTARTUP", None)
        child = pexpect.spawn(
            sys.executable,
            ["-m", "actors.shells.cli", "repl", "--home", str(tmp_path / "home"), *args],
            cwd=str(tmp_path),
            env=env,
            encoding="utf-8",
            timeout=30,
            dimensions=(50, 250),
        )
        children.append(child)
        return child

    yield start
    for child in children:
        if child.isalive():
            child.terminate(force=True)
        child.close()


def run(child: Any, line: str, prompt: str) -> str:
    """Send ``line``; what it printed before the next prompt, without the echo or colours.

    A terminal line editor (IPython's) may redraw the line as it is typed, so every line that
    is the command, a piece of it, or a prompt counts as echo.
    """
    child.sendline(line)
    child.expect(prompt)
    out = ANSI.sub("", child.before).replace("\r\n", "\n").replace("\r", "\n")

    def echo(text: str) -> bool:
        bare = re.sub(rf"^(?:{PLAIN}|{IPYTHON}|\.\.\.: )", "", text.strip()).strip()
        return not bare or line.startswith(bare) or line in text

    return "\n".join(t for t in out.split("\n") if not echo(t)).strip("\n")


@pytest.mark.parametrize(("flag", "prompt"), [("--plain", PLAIN), ("--ipython", IPYTHON)])
def test_a_mistake_shows_one_line(spawn: Spawn, flag: str, prompt: str) -> None:
    child = spawn(flag, "--scripted")
    child.expect(prompt)
    assert run(child, 'turn("bad id!", "hi")', prompt) == (
        "ValueError: invalid session id 'bad id!': only ASCII letters, digits, '.', '_' and '-' "
        "are allowed"
    )
    assert run(child, 'show("nobody")', prompt) == (
        "SessionNotFound: session 'nobody': is not stored"
    )
    assert run(child, 'ask("ghost", Inspect())', prompt).startswith(
        "AddressError: no actor at address 'session:ghost'"
    )
    assert run(child, "sesions()", prompt) == "NameError: name 'sesions' is not defined"
    child.sendline("exit()")
    child.expect("loopd: runtime stopped")


@pytest.mark.parametrize(("flag", "prompt"), [("--plain", PLAIN), ("--ipython", IPYTHON)])
def test_show_and_sessions_return_data_that_prints_well(
    spawn: Spawn, flag: str, prompt: str
) -> None:
    child = spawn(flag, "--scripted")
    child.expect(prompt)
    child.sendline('turn("demo", "Plan a short walk for this afternoon.")')
    child.expect("TurnCompleted")
    child.expect(prompt)
    assert run(child, 'view = show("demo")', prompt) == ""  # data, nothing printed
    assert run(child, "print(view.record.turns, view.children, len(view.history))", prompt) == (
        "1 ('sub-demo-1',) 4"
    )
    shown = run(child, "view", prompt)
    assert re.search(r"^(Out\[\d+\]: )?session   demo$", shown, re.M), shown
    assert "children  sub-demo-1" in shown
    table = run(child, "sessions()", prompt)
    assert re.search(r"^(Out\[\d+\]: )?SESSION +SLOT +TURNS", table, re.M), table
    assert re.search(r"^sub-demo-1 +\d+ +1 +no +\d+ +-$", table, re.M), table
    assert run(child, "print([row.id for row in sessions()])", prompt) == (
        "['demo', 'sub-demo-1', 'sub-sub-demo-1-1']"
    )
    child.sendline("exit()")
    child.expect("loopd: runtime stopped")


@pytest.mark.parametrize(("flag", "prompt"), [("--plain", PLAIN), ("--ipython", IPYTHON)])
def test_ctrl_c_during_a_turn_cancels_it_and_returns_to_the_prompt(
    spawn: Spawn, flag: str, prompt: str
) -> None:
    release = threading.Event()
    first = threading.Event()

    def script(body: dict[str, Any]) -> Answer:
        if not first.is_set():
            first.set()
            release.wait(30)  # the first request hangs until the test ends
            return reply("too late")
        return reply("quick")

    with ChatServer(script) as server:
        try:
            child = spawn(flag, "--base-url", server.base_url)
            child.expect(prompt)
            child.sendline('turn("slow", "hi")')
            child.expect(r"slow  → model request 1")
            assert first.wait(30)
            child.sendintr()
            child.expect(prompt)
            said = ANSI.sub("", child.before)
            assert "Ctrl-C: cancelled slow" in said
            assert "reason=<FailReason.CANCELLED" in said
            assert "Traceback" not in said and "KeyboardInterrupt" not in said
            assert run(child, "held()", prompt).endswith("()")
            # The session is free: the next turn runs and completes.
            assert "content='quick'" in run(child, 'turn("slow", "again")', prompt)
            child.sendline("exit()")
            child.expect("loopd: runtime stopped")
        finally:
            release.set()


def test_ipython_is_the_default_when_installed_and_plain_is_on_request(spawn: Spawn) -> None:
    child = spawn("--scripted")
    child.expect(IPYTHON)
    child.sendline("exit()")
    child.expect("loopd: runtime stopped")
    plain = spawn("--plain", "--scripted")
    plain.expect(PLAIN)
    plain.sendline("exit()")
    plain.expect("loopd: runtime stopped")


def test_ipython_asked_for_but_missing_is_bad_input(monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setattr("actors.shells.repl.ipython_available", lambda: False)
    home = tmp_path / "home"
    assert main(["repl", "--ipython", "--scripted", "--home", str(home)]) == 2
    assert "IPython is not installed" in capsys.readouterr().err
    assert not home.exists()  # refused before the runtime started
