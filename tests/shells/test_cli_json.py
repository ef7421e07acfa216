"""The command line for scripts and services: --version, --json, pipes, --timeout, --tools,
and ``loopd serve`` as a real daemon process stopped by a real signal."""

from __future__ import annotations

import importlib.metadata
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec
import pytest

from actors.shells.cli import main
from actors.testing import ChatServer, call, reply
from actors.testing.script import Answer
from messages import TurnEvent

TIMEOUT_S = 60


def loopd(home: Path, *args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    """Run ``python -m actors.shells.cli ARGS`` with HOME (and the working folder) at ``home``."""
    return subprocess.run(
        [sys.executable, "-m", "actors.shells.cli", *map(str, args)],
        cwd=home,
        env=dict(os.environ, HOME=str(home)),
        timeout=TIMEOUT_S,
        capture_output=True,
        text=True,
        check=False,
    )


def start_loopd(home: Path, *args: str | os.PathLike[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "actors.shells.cli", *map(str, args)],
        cwd=home,
        env=dict(os.environ, HOME=str(home)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class Lines:
    """The lines of a child's pipe, read by a thread, waited for with a deadline."""

    def __init__(self, stream) -> None:
        self.queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream) -> None:
        for line in stream:
            self.queue.put(line)

    def next(self, deadline: float) -> str:
        """The next line; AssertionError at ``deadline`` (time.monotonic())."""
        try:
            return self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError("no line from the process in time") from None


def test_version_names_the_installed_distribution(tmp_path: Path) -> None:
    done = loopd(tmp_path, "--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"loopd {importlib.metadata.version('loopd')}"


def test_run_json_prints_the_outcome_and_the_events_as_json_lines(tmp_path: Path) -> None:
    with ChatServer([reply("four")]) as server:
        done = loopd(tmp_path, "run", "--base-url", server.base_url, "--json", "2+2?")
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    outcome = json.loads(line)
    assert outcome.pop("usage")["type"] == "Usage"  # the turn's tokens (none reported here)
    assert outcome == {
        "type": "TurnCompleted",
        "session": "main",
        "content": "four",
        "truncated": False,
        "output": None,  # an untyped turn's (a typed one's holds its JSON value)
    }
    events = [msgspec.json.decode(e, type=TurnEvent) for e in done.stderr.splitlines()]
    assert type(events[0]).__name__ == "TurnStarted"
    assert type(events[-1]).__name__ == "TurnEnded" and events[-1].completed


def test_sessions_and_sessions_show_as_json_lines(tmp_path: Path) -> None:
    with ChatServer([call("subagent", task="t"), reply("child done"), reply("ok")]) as server:
        assert loopd(tmp_path, "run", "-q", "--base-url", server.base_url, "go").returncode == 0
    listed = loopd(tmp_path, "sessions", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert {r["id"] for r in rows} == {"main", "sub-main-1"}
    # A GET /v1/sessions row, and ``id`` beside ``session``.
    assert set(rows[0]) == {
        "id", "session", "agent", "parent", "state", "background", "slot", "turns",
        "untrusted", "messages", "created_at", "updated_at",
    }  # fmt: skip
    assert {r["id"]: r["state"] for r in rows} == {"main": "completed", "sub-main-1": "completed"}
    assert rows[1]["parent"] == "main" and rows[1]["session"] == rows[1]["id"]
    shown = loopd(tmp_path, "sessions", "show", "main", "--json")
    assert shown.returncode == 0, shown.stderr
    head, *lines = [json.loads(line) for line in shown.stdout.splitlines()]
    assert head["id"] == "main" and head["children"] == ["sub-main-1"] and head["turns"] == 1
    assert [m["message"]["role"] for m in lines] == ["user", "assistant", "tool", "assistant"]
    assert lines[0]["message"]["content"] == "go" and lines[0]["compacted"] is False


def test_a_reader_that_goes_away_ends_loopd_quietly_with_0(tmp_path: Path) -> None:
    # A transcript far longer than a pipe's buffer, so loopd is still writing when head leaves.
    long_answer = "\n".join(f"line {n} " + "x" * 60 for n in range(5000))
    with ChatServer([reply(long_answer)]) as server:
        assert loopd(tmp_path, "run", "-q", "--base-url", server.base_url, "hi").returncode == 0
    shown = start_loopd(tmp_path, "sessions", "show", "main")
    first = shown.stdout.readline()  # blocks until loopd writes; the test's timeout bounds it
    assert first.startswith("session")
    shown.stdout.close()  # what `| head -1` does
    err = shown.stderr.read()
    assert shown.wait(TIMEOUT_S) == 0
    assert err == ""


def test_run_timeout_cancels_the_turn_says_so_and_exits_124(tmp_path: Path) -> None:
    release = threading.Event()

    def hold(body: dict) -> Answer:
        release.wait(TIMEOUT_S)
        return reply("too late")

    with ChatServer(hold) as server:
        try:
            done = loopd(
                tmp_path, "run", "--json", "-q", "--timeout", "0.5", "--base-url",
                server.base_url, "slow?",
            )  # fmt: skip
        finally:
            release.set()
    assert done.returncode == 124
    said = (
        "no answer within 0.5 s (--timeout): the turn of main was cancelled; what it stored "
        "so far stays stored"
    )
    assert done.stderr.strip() == f"loopd: {said}"
    failed = json.loads(done.stdout)
    assert failed.pop("usage")["type"] == "Usage"
    assert failed == {
        "type": "TurnFailed",
        "session": "main",
        "reason": "timeout",
        "detail": said,
    }
    # The user's message was stored before the wait ran out, and stays.
    shown = loopd(tmp_path, "sessions", "show", "main", "--json")
    assert json.loads(shown.stdout.splitlines()[1])["message"]["content"] == "slow?"


TOOLS = """
from actors import port_tool

@port_tool("shout", "Say it loud.", {"type": "object", "properties": {"text": {"type": "string"}}})
def shout(args):
    return args["text"].upper()

@port_tool("whisper", "Say it softly.")
def whisper(args):
    return "psst"

ALL = [shout, whisper]
NOT_A_TOOL = 42
"""


def test_run_loads_tools_by_import_path(tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text(TOOLS)
    with ChatServer([call("shout", text="hi"), reply("done")]) as server:
        done = loopd(
            tmp_path, "run", "-q", "--base-url", server.base_url, "--tools", "mytools:ALL", "go"
        )
    assert done.returncode == 0, done.stderr
    second = server.requests[1]
    assert second["messages"][-1]["content"] == "HI"
    assert {t["function"]["name"] for t in second["tools"]} >= {"shout", "whisper"}


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("mytools", "expected package.module:name"),
        ("nosuchmodule:x", "cannot import nosuchmodule"),
        ("mytools:missing", "mytools has no missing"),
        ("mytools:NOT_A_TOOL", "NOT_A_TOOL is not a port tool or a list of them"),
    ],
)
def test_a_bad_tools_flag_exits_2_naming_it(
    tmp_path: Path, spec: str, said: str, monkeypatch, capsys
) -> None:
    (tmp_path / "mytools.py").write_text(TOOLS)
    monkeypatch.syspath_prepend(str(tmp_path))
    home = tmp_path / "home"
    code = main(["run", "--home", str(home), "--base-url", "http://127.0.0.1:9/v1",
                 "--tools", spec, "hi"])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert said in err and f"--tools {spec}" in err
    assert not home.exists()  # refused before anything was made


@pytest.mark.parametrize(("sig", "json_lines"), [(signal.SIGTERM, True), (signal.SIGINT, False)])
def test_serve_runs_the_heartbeat_until_a_signal_then_stops_cleanly_with_0(
    tmp_path: Path, sig: signal.Signals, json_lines: bool
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "HEARTBEAT.md").write_text("Anything new?")
    with ChatServer(lambda body: reply("all quiet")) as server:
        config = tmp_path / "loopd.toml"
        config.write_text(
            f'home = "{home}"\n[model]\nbase_url = "{server.base_url}"\n'
            '[heartbeat]\nsession = "watch"\nevery_s = 0.2\n'
        )
        args = ["serve", "--config", config] + (["--json"] if json_lines else [])
        daemon = start_loopd(tmp_path, *args)
        try:
            deadline = time.monotonic() + TIMEOUT_S
            lines: list[str] = []
            pipe = Lines(daemon.stdout)
            # Two heartbeat turns end: it keeps running on its schedule.
            while sum("TurnEnded" in line or "turn completed" in line for line in lines) < 2:
                lines.append(pipe.next(deadline))
            daemon.send_signal(sig)
            err = daemon.stderr.read()  # until the process closes it, as it exits
            daemon.wait(TIMEOUT_S)
        finally:
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait(TIMEOUT_S)
    assert daemon.returncode == 0, err
    assert "loopd serve: stopped" in err and "Traceback" not in err
    if json_lines:
        events = [msgspec.json.decode(line, type=TurnEvent) for line in lines]
        ended = [e for e in events if type(e).__name__ == "TurnEnded"]
        assert all(e.session == "watch" and e.completed for e in ended)
    else:
        assert any("watch" in line for line in lines)
    assert len(server.requests) >= 2
