"""``loopd approvals --json`` and ``--wait [--timeout S]``, on a home a runtime in this test
holds (the store read directly) and on a served home (through the service), with the real
``loopd`` command in a subprocess; the ``--tools`` hint of a config naming an unknown tool."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from serve_process import ServeProcess

from actors import Config, Runtime, port_tool
from actors.testing import ChatServer, ScriptedModel, call, reply
from messages import ApprovalRequested

TIMEOUT_S = 60.0
TOKEN = "cli-wait-token-51c0"


@port_tool(approval=True)
def deploy(env: str) -> str:
    """Deploy.

    Args:
        env: Where to.
    """
    return f"deployed to {env}"


def deploy_script(request: Any) -> Any:
    """A deploy call for the user's message, then "done"."""
    return call("deploy", env="prod") if request.messages[-1].role == "user" else reply("done")


def loopd(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``loopd ARGS`` started (its output read by the caller)."""
    return subprocess.Popen(
        [sys.executable, "-m", "actors.shells.cli", *args],
        cwd=cwd,
        env=dict(os.environ, HOME=str(cwd), **(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    """The exit status, stdout and stderr of ``proc`` once it ends (within the deadline)."""
    out, err = proc.communicate(timeout=TIMEOUT_S)
    return proc.returncode, out, err


class Waited:
    """The ``ApprovalRequested`` events of a runtime, and a wait for the first."""

    def __init__(self, rt: Runtime) -> None:
        self.found: queue.Queue[ApprovalRequested] = queue.Queue()
        rt.subscribe(lambda e: self.found.put(e) if isinstance(e, ApprovalRequested) else None)

    def first(self) -> ApprovalRequested:
        return self.found.get(timeout=TIMEOUT_S)


@pytest.mark.timeout(120)
def test_approvals_json_and_wait_on_a_home_a_runtime_holds(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with Runtime.start(
        Config(home=str(home)), model=ScriptedModel(deploy_script), tools=[deploy]
    ) as rt:
        requested = Waited(rt)
        # Nothing waits yet: the wait runs out and says so, exit 124.
        code, out, err = finished(
            loopd(tmp_path, "approvals", "--home", str(home), "--wait", "--timeout", "0.5")
        )
        assert (code, out) == (124, ""), err
        assert "no call waited for a decision within 0.5 s (--timeout)" in err

        waiting = loopd(
            tmp_path, "approvals", "--home", str(home), "--wait", "--timeout", "60", "--json"
        )
        rt.send_turn("s", "ship it")
        event = requested.first()
        code, out, err = finished(waiting)
        assert code == 0, err
        (line,) = out.splitlines()
        # The line is the ApprovalRequested as GET /v1/approvals lists it (msgspec's JSON).
        assert json.loads(line) == json.loads(msgspec.json.encode(event))
        assert json.loads(line)["tool"] == "deploy" and json.loads(line)["session"] == "s"

        # Without --wait, --json lists the same at once; the table names it too.
        code, out, err = finished(loopd(tmp_path, "approvals", "--home", str(home), "--json"))
        assert code == 0 and out.splitlines() == [line], err
        code, out, err = finished(loopd(tmp_path, "approvals", "--home", str(home)))
        assert code == 0 and "deploy" in out and '{"env": "prod"}' in out, err
        rt.approve("s", event.call_id)


def test_approvals_timeout_needs_wait_and_a_wait_on_no_home_runs_out(tmp_path: Path) -> None:
    code, _, err = finished(loopd(tmp_path, "approvals", "--home", "h", "--timeout", "1"))
    assert code == 2 and "approvals --timeout goes with --wait" in err
    code, _, err = finished(loopd(tmp_path, "approvals", "--wait", "--timeout", "0"))
    assert code == 2 and "--timeout" in err
    code, out, err = finished(
        loopd(tmp_path, "approvals", "--home", "none", "--wait", "--timeout", "0.5", "--json")
    )
    assert (code, out) == (124, ""), err
    assert not (tmp_path / "none").exists()  # a wait creates no home


class Daemon(ServeProcess):
    """``loopd serve --listen 127.0.0.1:0`` on ``home``, approvals on the built-in remember."""

    def __init__(self, tmp: Path, base_url: str) -> None:
        self.tmp = tmp
        self.config = tmp / "loopd.toml"
        config = (
            f'home = "{tmp / "home"}"\n[model]\nbase_url = "{base_url}"\n'
            '[serve]\ntoken_env = "LOOPD_TEST_TOKEN"\n[approvals]\ntools = ["remember"]\n'
        )
        super().__init__(tmp, config, {"LOOPD_TEST_TOKEN": TOKEN}, TIMEOUT_S)

    def loopd(self, *args: str) -> subprocess.Popen[str]:
        return loopd(self.tmp, *args, "--config", str(self.config), env={"LOOPD_TEST_TOKEN": TOKEN})

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        sent = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(sent, timeout=TIMEOUT_S) as answer:
            return json.loads(answer.read())


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    def answer(body: dict[str, Any]) -> object:
        names = {t["function"]["name"] for t in body.get("tools", [])}
        if "final_answer" in names:  # a typed turn
            return call("final_answer", status="green")
        if body["messages"][-1]["role"] == "user":
            return call("remember", text="ship")
        return reply("done")

    with ChatServer(answer) as server:
        d = Daemon(tmp_path, server.base_url)
        try:
            yield d
        finally:
            d.stop()


@pytest.mark.timeout(120)
def test_approvals_json_and_wait_on_a_served_home_go_through_the_service(
    daemon: Daemon,
) -> None:
    code, out, err = finished(daemon.loopd("approvals", "--wait", "--timeout", "0.5"))
    assert (code, out) == (124, ""), err
    waiting = daemon.loopd("approvals", "--wait", "--timeout", "60", "--json")
    assert daemon.request("POST", "/v1/sessions/ops/turns", {"text": "time?", "wait": False}) == {
        "session": "ops"
    }
    code, out, err = finished(waiting)
    assert code == 0, err
    (line,) = out.splitlines()
    # The very item the service lists.
    assert [json.loads(line)] == daemon.request("GET", "/v1/approvals")["approvals"]
    assert json.loads(line)["tool"] == "remember" and json.loads(line)["session"] == "ops"
    code, out, err = finished(daemon.loopd("approvals", "--json"))
    assert code == 0 and out.splitlines() == [line], err
    call_id = str(json.loads(line)["call_id"])
    code, out, err = finished(daemon.loopd("approve", "ops", call_id))
    assert code == 0, err
    code, out, err = finished(daemon.loopd("sessions", "--json"))
    assert code == 0, err
    (row,) = [json.loads(x) for x in out.splitlines()]
    listed = daemon.request("GET", "/v1/sessions")["sessions"]
    # The service's row (its keys, its values) and ``id`` beside ``session``.
    assert row == {"id": "ops", **next(r for r in listed if r["session"] == "ops")}


def test_a_tool_no_one_loaded_names_the_tools_flag(tmp_path: Path) -> None:
    config = tmp_path / "loopd.toml"
    config.write_text(
        f'home = "{tmp_path / "home"}"\n[agents.default]\ntools = ["restart_service"]\n'
    )
    code, out, err = finished(
        loopd(tmp_path, "run", "--config", str(config), "--base-url", "http://127.0.0.1:9/v1", "hi")
    )
    assert code == 2 and out == ""
    assert "agents.default.tools: no such tool: restart_service" in err
    assert "port tools are loaded with --tools MODULE:NAME" in err
    assert "Traceback" not in err


@pytest.mark.timeout(120)
def test_run_with_an_output_schema_goes_through_the_service(daemon: Daemon) -> None:
    schema = daemon.tmp / "schema.json"
    schema.write_text('{"type": "object", "properties": {"status": {"type": "string"}}}')
    code, out, err = finished(
        daemon.loopd("run", "--session", "typed", "--output-schema", str(schema), "-q", "how?")
    )
    assert code == 0, err
    assert json.loads(out) == {"status": "green"}
