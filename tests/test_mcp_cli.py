"""``loopd mcp``: the configured MCP servers started briefly, each one's state printed, with
the real test server (tests/mcp_servers) over stdio and a command that cannot start."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from mcp_helpers import SERVER, process_alive

from actors.shells.cli import main

pytestmark = pytest.mark.timeout(60)


def config_file(tmp_path: Path, *, broken: bool) -> Path:
    text = (
        "[mcp.files]\n"
        f"command = [{json.dumps(sys.executable)}, {json.dumps(SERVER)}]\n"
        'tools = ["read", "pid"]\n'
        "timeout_s = 20\n"
    )
    if broken:
        text += '[mcp.gone]\ncommand = ["/nonexistent/loopd-no-such-server"]\ntimeout_s = 20\n'
    path = tmp_path / "loopd.toml"
    path.write_text(text)
    return path


def test_it_shows_each_server_up_or_down_and_exits_1_for_a_down_one(tmp_path, capsys) -> None:
    path = config_file(tmp_path, broken=True)
    assert main(["mcp", "--config", str(path), "--home", str(tmp_path / "home")]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "STATE", "TOOLS", "/", "WHY", "SKIPPED"]
    assert lines[1].split()[:2] == ["files", "up"]
    assert "files__pid, files__read" in lines[1]
    assert lines[2].split()[:2] == ["gone", "down"]
    assert "No such file or directory" in lines[2]
    assert not (tmp_path / "home").exists()  # no runtime, no store


def test_json_lines_and_exit_0_when_all_are_up(tmp_path, capsys) -> None:
    path = config_file(tmp_path, broken=False)
    assert main(["mcp", "--config", str(path), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows == [
        {"server": "files", "state": "up", "tools": ["files__pid", "files__read"], "skipped": []}
    ]


def test_it_leaves_no_server_running(tmp_path, capsys) -> None:
    # A server that never answers (it is mute before any import, so a busy machine changes
    # nothing): the 1 s is what is tested. Its processes are found by a tag on their command
    # line, so no pid needs to be read while it runs.
    tag = f"loopd-test-{uuid.uuid4()}"
    path = tmp_path / "loopd.toml"
    command = [sys.executable, SERVER, "--mute", "--tag", tag]
    path.write_text(f"[mcp.files]\ncommand = {json.dumps(command)}\ntimeout_s = 1\n")
    assert main(["mcp", "--config", str(path), "--json"]) == 1
    row = json.loads(capsys.readouterr().out)
    assert row == {"server": "files", "state": "down", "why": "it gave no answer within 1 s"}
    assert running_with(tag) == []


def running_with(tag: str) -> list[int]:
    """The live processes whose command line holds ``tag``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if tag.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return [pid for pid in found if process_alive(pid)]


def test_no_servers_configured(tmp_path, capsys) -> None:
    assert main(["mcp", "--home", str(tmp_path / "home")]) == 0
    assert capsys.readouterr().out == "no MCP servers: the config has no [mcp.NAME] table\n"
