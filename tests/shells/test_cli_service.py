"""The CLI as a client of ``loopd serve --listen``: on a served home ``loopd run`` and ``loopd
sessions`` go through the service (not ``HomeInUse``), ``--connect URL`` reaches one by its
address, a wrong or missing token is a clear error, and a stale home file is ignored. A real
daemon subprocess on a tmp home, its model the test kit's ChatServer on 127.0.0.1."""

from __future__ import annotations

import http.server
import io
import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from serve_process import ServeProcess

from actors.shells.served import SERVED_NAME, find_served, forget_served, record_served
from actors.stores.lock import HomeLock
from actors.testing import ChatServer, reply
from actors.testing.chat_server import Delayed

TIMEOUT_S = 30.0
TOKEN = "cli-service-token-7d21"


class Daemon(ServeProcess):
    """``loopd serve --listen 127.0.0.1:0`` on ``home``, its token in ``LOOPD_TEST_TOKEN``."""

    def __init__(self, tmp: Path, home: Path, base_url: str) -> None:
        self.home = home
        self.tmp = tmp
        self.config = tmp / "loopd.toml"
        config = (
            f'home = "{home}"\n[model]\nbase_url = "{base_url}"\n'
            '[serve]\ntoken_env = "LOOPD_TEST_TOKEN"\n'
        )
        super().__init__(tmp, config, {"LOOPD_TEST_TOKEN": TOKEN}, TIMEOUT_S)

    def loopd(
        self, *args: str, token: str | None = TOKEN, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, HOME=str(self.tmp))
        env.pop("LOOPD_TEST_TOKEN", None)
        env.pop("LOOPD_TOKEN", None)
        if token is not None:
            env["LOOPD_TEST_TOKEN"] = token
        return subprocess.run(
            [sys.executable, "-m", "actors.shells.cli", *args],
            cwd=self.tmp,
            env=env,
            timeout=TIMEOUT_S,
            capture_output=True,
            text=True,
            check=False,
            input=stdin,
        )


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[Daemon, ChatServer]]:
    def answer(body: dict) -> object:  # "slow" is answered after the test is over
        slow = "slow" in json.dumps(body["messages"][-1])
        return Delayed(reply("late"), 60) if slow else reply("served answer")

    with ChatServer(answer) as server:
        d = Daemon(tmp_path, tmp_path / "home", server.base_url)
        try:
            yield d, server
        finally:
            d.kill()


def test_run_and_sessions_on_a_served_home_go_through_the_service(
    daemon: tuple[Daemon, ChatServer],
) -> None:
    d, server = daemon
    record = d.home / SERVED_NAME
    assert stat.S_IMODE(record.stat().st_mode) == 0o600  # the owner's only
    written = json.loads(record.read_text())
    assert written == {"url": d.url, "pid": d.proc.pid, "token_env": "LOOPD_TEST_TOKEN"}
    assert TOKEN not in record.read_text()  # the variable's name, never the token

    ran = d.loopd("run", "--config", str(d.config), "--session", "cli", "hello")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "served answer\n"
    assert "cli  turn started" in ran.stderr and "cli  turn completed" in ran.stderr
    assert "in use" not in ran.stderr
    assert len(server.requests) == 1  # the daemon's runtime ran it

    as_json = d.loopd("run", "--config", str(d.config), "--session", "cli", "--json", "-q", "hi")
    assert as_json.returncode == 0, as_json.stderr
    outcome = json.loads(as_json.stdout)
    assert outcome["type"] == "TurnCompleted" and outcome["content"] == "served answer"

    listed = d.loopd("sessions", "--config", str(d.config))
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[0].split() == [
        "SESSION", "AGENT", "STATE", "SLOT", "TURNS", "UNTRUSTED", "MESSAGES", "UPDATED",
    ]  # fmt: skip
    assert listed.stdout.splitlines()[1].split()[:7] == [
        "cli", "default", "completed", "0", "2", "no", "4",
    ]  # fmt: skip
    rows = d.loopd("sessions", "--config", str(d.config), "--json")
    row = json.loads(rows.stdout.splitlines()[0])
    assert {k: row[k] for k in ("id", "turns", "messages", "agent")} == {
        "id": "cli", "turns": 2, "messages": 4, "agent": "default",
    }  # fmt: skip

    # --connect reaches the service by its address; the token from --token-env's variable.
    connect = ["--connect", d.url, "--token-env", "LOOPD_TEST_TOKEN"]
    remote = d.loopd("run", "--home", str(d.tmp / "elsewhere"), *connect, "-q", "again")
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout == "served answer\n"
    shown = d.loopd("sessions", "show", "cli", *connect)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("session   cli\n") and "turns     2" in shown.stdout

    assert d.stop() == 0
    assert not record.exists()  # removed at a clean stop


def test_a_wrong_or_missing_token_is_a_clear_error(daemon: tuple[Daemon, ChatServer]) -> None:
    d, server = daemon
    missing = d.loopd("run", "--config", str(d.config), "hello", token=None)
    assert missing.returncode == 2
    assert "LOOPD_TEST_TOKEN" in missing.stderr and "unset or empty" in missing.stderr
    wrong = d.loopd("sessions", "--config", str(d.config), token="not-the-token")
    assert wrong.returncode == 2
    assert "refused the request (401)" in wrong.stderr and "LOOPD_TEST_TOKEN" in wrong.stderr
    assert "not-the-token" not in wrong.stderr
    no_default = d.loopd("run", "--connect", d.url, "hello", token=None)
    assert no_default.returncode == 2 and "LOOPD_TOKEN" in no_default.stderr
    assert d.loopd("run", "--config", str(d.config), "--tools", "x:y", "hi").returncode == 2
    assert server.requests == []


def test_run_timeout_through_the_service_cancels_the_turn(
    daemon: tuple[Daemon, ChatServer],
) -> None:
    d, _ = daemon
    late = d.loopd("run", "--config", str(d.config), "--timeout", "0.5", "-q", "slow")
    assert late.returncode == 124, late.stderr
    assert "the turn of main was cancelled" in late.stderr
    listed = d.loopd("sessions", "--config", str(d.config), "--json")
    assert json.loads(listed.stdout.splitlines()[0])["id"] == "main"


def test_a_stale_home_file_is_ignored(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    record_served(home, "http://0.0.0.0:5", "T")
    lock = HomeLock.acquire(home)  # this process holds the home and wrote the file
    try:
        found = find_served(home)
        assert found is not None and found.url == "http://127.0.0.1:5"  # reachable locally
    finally:
        lock.release()
    # A crashed server: its pid is gone (a child that has exited), the lock names it still.
    code = "import os; print(os.getpid())"
    gone = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=TIMEOUT_S
    )
    pid = int(gone.stdout)
    (home / "loopd.lock").write_text(f"{pid}\n")
    (home / SERVED_NAME).write_text(json.dumps({"url": "http://127.0.0.1:5", "pid": pid}))
    assert find_served(home) is None
    # The lock names another holder than the file: stale too.
    record_served(home, "http://127.0.0.1:5", None)
    (home / "loopd.lock").write_text("1\n")
    assert find_served(home) is None
    forget_served(home)
    assert not (home / SERVED_NAME).exists()
    (home / SERVED_NAME).write_text("not json")
    assert find_served(home) is None


class _Approvals(http.server.BaseHTTPRequestHandler):
    """The approval endpoints as the service answers them: call 3 of ``notes`` waits."""

    decided: ClassVar[list[dict]] = []

    def _send(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.headers.get("authorization") != f"Bearer {TOKEN}":
            return self._send(401, {"error": "this service needs a token"})
        waiting = {
            "type": "ApprovalRequested",
            "session": "notes",
            "call_id": 3,
            "tool": "rm",
            "arguments": '{"path": "x"}',
            "untrusted": True,
            "at": "2026-01-02T03:04:05Z",
        }
        self._send(200, {"approvals": [waiting]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.decided.append({"path": self.path, **body})
        if self.path == "/v1/approvals/notes/3":
            settled = {"type": "ApprovalSettled", "session": "notes", "call_id": 3,
                       "approved": body["approve"], "at": "2026-01-02T03:04:06Z"}  # fmt: skip
            return self._send(200, settled)
        detail = "call 9 of session notes is not waiting for a decision"
        self._send(409, {"type": "ApprovalRefused", "session": "notes", "call_id": 9,
                         "detail": detail})  # fmt: skip

    def log_message(self, *args: object) -> None:
        pass


def test_approvals_approve_and_deny_go_through_the_service(tmp_path: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Approvals)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    d = Daemon.__new__(Daemon)  # only its loopd(): no daemon runs here
    d.tmp = tmp_path
    try:
        connect = ["--connect", url, "--token-env", "LOOPD_TEST_TOKEN"]
        listed = d.loopd("approvals", *connect)
        assert listed.returncode == 0, listed.stderr
        assert "notes" in listed.stdout and "UNTRUSTED" in listed.stdout and "rm" in listed.stdout
        yes = d.loopd("approve", *connect, "notes", "3", "--note", "ok")
        assert yes.returncode == 0, yes.stderr
        assert yes.stdout == "call 3 of session notes approved; its turn resumes now\n"
        no = d.loopd("deny", *connect, "notes", "9", "--reason", "not now")
        assert no.returncode == 1  # refused: the detail, exit 1
        assert no.stdout == "call 9 of session notes is not waiting for a decision\n"
        assert _Approvals.decided == [
            {"path": "/v1/approvals/notes/3", "approve": True, "note": "ok", "reason": ""},
            {"path": "/v1/approvals/notes/9", "approve": False, "note": "", "reason": "not now"},
        ]
        unauthorised = d.loopd("approvals", *connect, token="wrong")
        assert unauthorised.returncode == 2 and "(401)" in unauthorised.stderr
    finally:
        server.shutdown()
        server.server_close()


def test_repl_connect_is_a_thin_console_over_the_service(
    daemon: tuple[Daemon, ChatServer], capsys: pytest.CaptureFixture[str]
) -> None:
    from actors.shells.client import ServiceClient
    from actors.shells.repl_client import run_remote_repl

    d, server = daemon
    lines = [
        'out = turn("r", "hello")',
        "print(out.content)",
        "sessions()",
        'show("r")["turns"]',
        "exit(3)",
    ]
    client = ServiceClient(d.url, TOKEN, "LOOPD_TEST_TOKEN")
    try:
        assert run_remote_repl(client, stdin=io.StringIO("\n".join(lines) + "\n")) == 3
    finally:
        client.close()
    out, err = capsys.readouterr()
    assert f"connected to {d.url}" in err  # the banner, as the console writes it
    assert "Traceback" not in err
    assert "r  turn completed" in out  # the family's events, as the local turn() prints them
    assert "served answer\n" in out
    assert "SESSION" in out and "STATE" in out and "completed" in out  # its last turn completed
    assert ">>> 1\n" in out  # show("r")["turns"]
    assert len(server.requests) == 1
    connect = ["--connect", d.url, "--token-env", "LOOPD_TEST_TOKEN"]
    console = d.loopd("repl", *connect, "--plain", stdin="print(sessions()[0].id)\n")
    assert console.returncode == 0, console.stderr
    assert ">>> r\n" in console.stdout and "connected to" in console.stderr
