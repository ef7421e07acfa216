"""One runtime per home: a second one is refused with HomeInUse, readers still read, and a
crash releases the home."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors import Config, HomeInUse, Runtime
from actors.stores.lock import LOCK_NAME, HomeLock
from actors.stores.sqlite import DB_NAME
from actors.testing import ScriptedModel, reply
from messages import TurnCompleted

WAIT = 30.0

HOLDER = textwrap.dedent(
    """
    import sys
    from actors import Config, Runtime
    from actors.testing import ScriptedModel, reply

    rt = Runtime.start(Config(home=sys.argv[1]), model=ScriptedModel(lambda r: reply("ok")))
    print(rt.run_turn("held", "hi", timeout=30).content, flush=True)
    sys.stdin.read()  # hold the home until the test closes our stdin (or kills us)
    rt.stop()
    """
)


def scripted() -> ScriptedModel:
    return ScriptedModel(lambda request: reply("ok"))


def loopd(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "actors.shells.cli", *args],
        cwd=home.parent,
        env=dict(os.environ, HOME=str(home.parent)),
        timeout=WAIT,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        check=False,
    )


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """Another process with a runtime started on ``tmp_path/home``, after one turn."""
    home = tmp_path / "home"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(home)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], WAIT)
        assert ready and proc.stdout is not None, "the holder did not start"
        assert proc.stdout.readline() == "ok\n", proc.stderr.read() if proc.stderr else ""
        yield home, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=WAIT)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_a_second_runtime_in_another_process_is_refused_naming_home_and_pid(holder) -> None:
    home, proc = holder
    with pytest.raises(HomeInUse) as info:
        Runtime.start(Config(home=str(home)), model=scripted())
    assert isinstance(info.value, RuntimeError)
    assert str(home) in str(info.value)
    assert f"pid {proc.pid}" in str(info.value)
    assert (info.value.home, info.value.pid) == (home, proc.pid)


@pytest.mark.parametrize("command", ["run", "repl"])
def test_loopd_run_and_repl_on_a_locked_home_exit_2_with_the_reason(holder, command) -> None:
    home, proc = holder
    args = ["--base-url", "http://127.0.0.1:9/v1", "--model", "m"]
    done = loopd(home, command, "--home", str(home), *args, *(["hi"] if command == "run" else []))
    assert done.returncode == 2, done.stderr
    assert f"the home {home} is in use by another loopd runtime (pid {proc.pid})" in done.stderr
    assert "Traceback" not in done.stderr


def test_loopd_sessions_reads_while_a_runtime_holds_the_home(holder) -> None:
    home, _ = holder
    done = loopd(home, "sessions", "--home", str(home))
    assert done.returncode == 0, done.stderr
    assert "held" in done.stdout


def test_a_crash_releases_the_home(holder) -> None:
    home, proc = holder
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=WAIT)
    with Runtime.start(Config(home=str(home)), model=scripted()) as rt:
        assert rt.run_turn("held", "again", timeout=WAIT) == TurnCompleted("held", "ok")


def test_a_second_runtime_in_the_same_process_is_refused_until_the_first_stops(
    tmp_path: Path,
) -> None:
    config = Config(home=str(tmp_path / "home"))
    first = Runtime.start(config, model=scripted())
    try:
        with pytest.raises(
            HomeInUse, match=rf"in use by another loopd runtime \(pid {os.getpid()}\)"
        ):
            Runtime.start(config, model=scripted())
        # The refused start changed nothing: the first runtime goes on.
        assert first.run_turn("s", "hi", timeout=WAIT) == TurnCompleted("s", "ok")
    finally:
        first.stop()
    with Runtime.start(config, model=scripted()) as second:
        assert second.run_turn("s", "again", timeout=WAIT) == TurnCompleted("s", "ok")


def test_a_start_that_fails_lets_the_home_go(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / DB_NAME).write_bytes(b"not a database" * 100)
    with pytest.raises(Exception, match="cannot open the store"):
        Runtime.start(Config(home=str(home)), model=scripted())
    HomeLock.acquire(home).release()  # free again


def test_the_lock_file_names_the_holder_and_stays_after_release(tmp_path: Path) -> None:
    lock = HomeLock.acquire(tmp_path)
    assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    with pytest.raises(HomeInUse):
        HomeLock.acquire(tmp_path)
    lock.release()
    lock.release()  # twice is fine
    assert not lock.held
    assert (tmp_path / LOCK_NAME).exists()
    HomeLock.acquire(tmp_path).release()
