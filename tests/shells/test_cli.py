"""The ``loopd`` command line, run as a real subprocess (SPEC 10).

Every run gets ``HOME`` pointed at the test's temporary folder, so nothing touches ``~/.loopd``.
Model endpoints are the test kit's fake chat server on 127.0.0.1; ``loopd demo`` is offline.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors import Config, Runtime
from actors.stores.sqlite import SessionStore
from actors.testing import ChatServer, RawResponse, ScriptedModel, call, reply
from actors.testing.script import Answer

TIMEOUT_S = 60

# One rendered event line: "HH:MM:SS " + "│ " per depth + session + two spaces + what happened.
EVENT_LINE = re.compile(r"^\d\d:\d\d:\d\d (?P<indent>(?:│ )*)(?P<session>\S+)  (?P<what>.*)$")

Server = Callable[..., ChatServer]


def loopd(home: Path, *args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    """Run ``python -m actors.shells.cli ARGS`` with HOME (and the working folder) at ``home``."""
    env = dict(os.environ, HOME=str(home))
    return subprocess.run(
        [sys.executable, "-m", "actors.shells.cli", *map(str, args)],
        cwd=home,
        env=env,
        timeout=TIMEOUT_S,
        capture_output=True,
        text=True,
        check=False,
    )


def events(text: str) -> list[tuple[int, str, str]]:
    """The event lines of ``text`` as (depth, session, what), in order; other lines skipped."""
    found = []
    for line in text.splitlines():
        m = EVENT_LINE.match(line)
        if m:
            found.append((len(m["indent"]) // 2, m["session"], m["what"]))
    return found


def index_of(items: list[tuple[int, str, str]], depth: int, session: str, what: str) -> int:
    """The position of the first event of ``session`` at ``depth`` whose text starts ``what``."""
    for i, (d, s, w) in enumerate(items):
        if d == depth and s == session and w.startswith(what):
            return i
    raise AssertionError(f"no event {depth} {session} {what!r} in:\n" + "\n".join(map(str, items)))


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert "Traceback" not in result.stdout, result.stdout


def last_user(body: dict[str, Any]) -> str:
    users = [m for m in body["messages"] if m["role"] == "user"]
    return str(users[-1]["content"]) if users else ""


# --- loopd demo ---


@pytest.fixture(scope="module")
def demo_home(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One ``loopd demo --home D`` for the tests that read its output or its store."""
    base = tmp_path_factory.mktemp("demo")
    home = base / "D"
    result = loopd(base, "demo", "--home", home)
    assert result.returncode == 0, result.stderr
    no_traceback(result)
    return home, result.stdout


def test_demo_runs_offline_with_a_temporary_store(tmp_path: Path) -> None:
    result = loopd(tmp_path, "demo")
    assert result.returncode == 0, result.stderr
    no_traceback(result)
    assert "demo → you: " in result.stdout
    assert "sub-demo-1 completed" in result.stdout
    # The default demo keeps nothing: no ~/.loopd under HOME.
    assert not (tmp_path / ".loopd").exists()


def test_demo_shows_a_streamed_line_break_as_a_mark_never_as_x0a(
    demo_home: tuple[Path, str],
) -> None:
    # Issue 19 B2: the demo's streamed lines printed "reported:\\x0asub-demo-1 completed".
    _, out = demo_home
    assert "\\x0a" not in out
    streamed = [what for _, session, what in events(out) if what.startswith("✎ ")]
    assert len(streamed) == 3, out
    parent = next(w for _, s, w in events(out) if s == "demo" and w.startswith("✎ "))
    assert "My helper reported:⏎sub-demo-1 completed⏎There is time for a walk." in parent
    # The final answer, printed as text, keeps its real line breaks.
    assert "My helper reported:\nsub-demo-1 completed\n" in out


def test_demo_prints_the_live_tree_in_order(demo_home: tuple[Path, str]) -> None:
    _, out = demo_home
    tree = events(out)

    parent_start = index_of(tree, 0, "demo", "turn started on slot 0")
    spawn_child = index_of(tree, 0, "demo", "┬ spawns sub-demo-1 for call 1")
    child_start = index_of(tree, 1, "sub-demo-1", "turn started on slot 1")
    spawn_grand = index_of(tree, 1, "sub-demo-1", "┬ spawns sub-sub-demo-1-1 for call 1")
    grand_start = index_of(tree, 2, "sub-sub-demo-1-1", "turn started on slot 1")
    clock_call = index_of(tree, 2, "sub-sub-demo-1-1", "  call 1 clock …")
    clock_done = index_of(tree, 2, "sub-sub-demo-1-1", "  call 1 clock done")
    grand_done = index_of(tree, 2, "sub-sub-demo-1-1", "turn completed")
    grand_reported = index_of(tree, 1, "sub-demo-1", "┴ sub-sub-demo-1-1 completed")
    child_done = index_of(tree, 1, "sub-demo-1", "turn completed")
    child_reported = index_of(tree, 0, "demo", "┴ sub-demo-1 completed")
    parent_done = index_of(tree, 0, "demo", "turn completed")
    assert (
        parent_start
        < spawn_child
        < child_start
        < spawn_grand
        < grand_start
        < clock_call
        < clock_done
        < grand_done
        < grand_reported
        < child_done
        < child_reported
        < parent_done
    )

    # Model requests name the session's slot: 0 for the parent, 1 for both children.
    index_of(tree, 0, "demo", "→ model request 1 (slot 0)")
    index_of(tree, 1, "sub-demo-1", "→ model request 1 (slot 1)")
    index_of(tree, 2, "sub-sub-demo-1-1", "→ model request 1 (slot 1)")

    # Each session's lines carry its own depth, never another.
    depths = {session: {d for d, s, _ in tree if s == session} for _, session, _ in tree}
    assert depths == {"demo": {0}, "sub-demo-1": {1}, "sub-sub-demo-1-1": {2}}

    # The final answer comes after the tree and carries the child's completion.
    lines = out.splitlines()
    answer_at = next(i for i, line in enumerate(lines) if line.startswith("demo → you: "))
    last_event_at = max(i for i, line in enumerate(lines) if EVENT_LINE.match(line))
    assert answer_at > last_event_at
    answer = "\n".join(lines[answer_at:])
    assert "sub-demo-1 completed" in answer
    assert "sub-sub-demo-1-1 completed" in answer
    assert re.search(r"The clock says \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\.", answer)


def test_sessions_lists_the_demo_store(demo_home: tuple[Path, str], tmp_path: Path) -> None:
    home, _ = demo_home
    result = loopd(tmp_path, "sessions", "--home", home)
    assert result.returncode == 0, result.stderr
    no_traceback(result)
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "SESSION", "AGENT", "STATE", "SLOT", "TURNS", "UNTRUSTED", "MESSAGES", "UPDATED",
    ]  # fmt: skip
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    assert set(rows) == {"demo", "sub-demo-1", "sub-sub-demo-1-1"}
    assert rows["demo"][:5] == ["default", "completed", "0", "1", "no"]
    assert rows["sub-demo-1"][:5] == ["default", "completed", "1", "1", "no"]
    assert rows["sub-sub-demo-1-1"][:5] == ["default", "completed", "1", "1", "no"]


def test_sessions_show_a_child_with_options_after_the_id(
    demo_home: tuple[Path, str], tmp_path: Path
) -> None:
    home, _ = demo_home
    result = loopd(tmp_path, "sessions", "show", "sub-demo-1", "--home", home)
    assert result.returncode == 0, result.stderr
    no_traceback(result)
    out = result.stdout
    assert re.search(r"^session\s+sub-demo-1$", out, re.M)
    assert re.search(r"^slot\s+1$", out, re.M)
    assert re.search(r"^turns\s+1$", out, re.M)
    assert re.search(r"^untrusted\s+no$", out, re.M)
    assert re.search(r"^children\s+sub-sub-demo-1-1$", out, re.M)
    # The transcript: the child's user text opens with the time, then its task.
    assert re.search(r"^\[1\] user$", out, re.M)
    assert re.search(r"^    It is \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\.$", out, re.M)
    assert "Find out what time it is" in out
    assert "subagent(" in out
    assert "sub-sub-demo-1-1 completed" in out


def test_sessions_show_with_options_before_the_action(
    demo_home: tuple[Path, str], tmp_path: Path
) -> None:
    home, _ = demo_home
    result = loopd(tmp_path, "sessions", "--home", home, "show", "sub-sub-demo-1-1")
    assert result.returncode == 0, result.stderr
    assert re.search(r"^session\s+sub-sub-demo-1-1$", result.stdout, re.M)
    assert re.search(r"^children\s+-$", result.stdout, re.M)
    assert "clock" in result.stdout


def test_sessions_show_unknown_id_fails_clearly(
    demo_home: tuple[Path, str], tmp_path: Path
) -> None:
    home, _ = demo_home
    result = loopd(tmp_path, "sessions", "show", "nope", "--home", home)
    assert result.returncode != 0
    no_traceback(result)
    assert "nope" in result.stderr
    assert result.stdout == ""


def test_sessions_show_unknown_id_fails_on_an_empty_home_too(tmp_path: Path) -> None:
    # Same question, no store yet: "nope" is no more stored than with a store; exit non-zero.
    empty = tmp_path / "empty"
    empty.mkdir()
    result = loopd(tmp_path, "sessions", "show", "nope", "--home", empty)
    no_traceback(result)
    assert result.returncode != 0, result.stdout
    assert "nope" in result.stderr


def test_sessions_show_invalid_id_is_refused(demo_home: tuple[Path, str], tmp_path: Path) -> None:
    home, _ = demo_home
    result = loopd(tmp_path, "sessions", "show", "../x", "--home", home)
    assert result.returncode == 2
    no_traceback(result)
    assert "../x" in result.stderr


def test_sessions_show_without_an_id_is_a_usage_error(tmp_path: Path) -> None:
    result = loopd(tmp_path, "sessions", "show", "--home", tmp_path)
    assert result.returncode == 2
    no_traceback(result)
    assert "usage:" in result.stderr


def test_sessions_on_an_empty_home_says_there_are_none(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = loopd(tmp_path, "sessions", "--home", empty)
    assert result.returncode == 0, result.stderr
    no_traceback(result)
    assert "no sessions" in result.stdout
    assert list(empty.iterdir()) == []


# --- loopd run ---


def test_run_one_turn_answer_on_stdout_events_on_stderr(
    chat_server: Server, tmp_path: Path
) -> None:
    server = chat_server([reply("Hello, human.")])
    home = tmp_path / "D"
    result = loopd(
        tmp_path,
        "run",
        "--base-url",
        server.base_url,
        "--model",
        "m",
        "--home",
        home,
        "--session",
        "s1",
        "hello",
    )
    assert result.returncode == 0, result.stderr
    no_traceback(result)
    assert result.stdout == "Hello, human.\n"
    tree = events(result.stderr)
    assert index_of(tree, 0, "s1", "turn started on slot 0") < index_of(
        tree, 0, "s1", "turn completed"
    )

    assert len(server.requests) == 1
    body = server.requests[0]
    assert body["model"] == "m"
    assert body["id_slot"] == 0
    assert body["cache_prompt"] is True
    assert body["messages"][-1] == {"role": "user", "content": "hello"}
    assert server.errors == []

    # The session is stored in --home, and nowhere else.
    assert (home / "loopd.db").exists()
    assert not (tmp_path / ".loopd").exists()
    shown = loopd(tmp_path, "sessions", "show", "s1", "--home", home)
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"^turns\s+1$", shown.stdout, re.M)
    assert "Hello, human." in shown.stdout


def test_run_quiet_prints_only_the_answer(chat_server: Server, tmp_path: Path) -> None:
    server = chat_server([reply("ok")])
    result = loopd(
        tmp_path, "run", "-q", "--base-url", server.base_url, "--home", tmp_path / "D", "hi"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ok\n"
    assert result.stderr == ""


def test_run_defaults_to_session_main_under_home_dot_loopd(
    chat_server: Server, tmp_path: Path
) -> None:
    server = chat_server([reply("ok")])
    result = loopd(tmp_path, "run", "--base-url", server.base_url, "hi")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ok\n"
    # HOME is tmp_path, so the default home is tmp_path/.loopd, and the session is "main".
    assert (tmp_path / ".loopd" / "loopd.db").exists()
    assert "main  turn started on slot 0" in result.stderr
    listed = loopd(tmp_path, "sessions")
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == ["main"]


def test_run_with_a_subagent(chat_server: Server, tmp_path: Path) -> None:
    def script(body: dict[str, Any]) -> Answer:
        last = body["messages"][-1]
        if body["id_slot"] == 1:
            assert last_user(body).startswith("It is ")
            return reply("child says the sky is blue")
        if last["role"] == "user":
            return call("subagent", task="look at the sky")
        assert last["role"] == "tool"
        return reply(f"parent got: {last['content']}")

    server = chat_server(script)
    home = tmp_path / "D"
    result = loopd(
        tmp_path,
        "run",
        "--base-url",
        server.base_url,
        "--model",
        "m",
        "--home",
        home,
        "--session",
        "s1",
        "hello",
    )
    assert result.returncode == 0, result.stderr
    no_traceback(result)
    assert server.errors == []
    assert "sub-s1-1 completed" in result.stdout
    assert result.stdout == "parent got: sub-s1-1 completed\nchild says the sky is blue\n"

    requests = server.requests
    assert [r["id_slot"] for r in requests] == [0, 1, 0]
    child = requests[1]
    assert last_user(child).startswith("It is ")
    assert last_user(child).endswith("\n\nlook at the sky")
    assert all("hello" not in str(m.get("content")) for m in child["messages"])
    # The parent's second request extends its first: the server's prompt cache stays valid.
    first, second = requests[0]["messages"], requests[2]["messages"]
    assert second[: len(first)] == first

    tree = events(result.stderr)
    assert (
        index_of(tree, 0, "s1", "┬ spawns sub-s1-1 for call 1")
        < index_of(tree, 1, "sub-s1-1", "turn started on slot 1")
        < index_of(tree, 1, "sub-s1-1", "turn completed")
        < index_of(tree, 0, "s1", "┴ sub-s1-1 completed")
        < index_of(tree, 0, "s1", "turn completed")
    )


def test_run_model_http_500_exits_1(chat_server: Server, tmp_path: Path) -> None:
    server = chat_server([RawResponse(status=500, body=b'{"error": "boom"}')] * 3)
    result = loopd(
        tmp_path, "run", "--base-url", server.base_url, "--home", tmp_path / "D", "hello"
    )
    assert result.returncode == 1
    no_traceback(result)
    assert result.stdout == ""
    assert "model_error" in result.stderr
    assert "HTTP 500" in result.stderr
    # model.retries defaults to 2: a 5xx is tried three times, and the error says so.
    assert "(after 3 attempts)" in result.stderr
    assert len(server.requests) == 3


def test_run_model_unreachable_exits_1(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    result = loopd(tmp_path, "run", "--base-url", url, "--home", tmp_path / "D", "hello")
    assert result.returncode == 1
    no_traceback(result)
    assert result.stdout == ""
    assert "model_error" in result.stderr
    assert "cannot reach the model" in result.stderr
    assert url in result.stderr


def test_run_invalid_session_id_exits_2_and_stores_nothing(tmp_path: Path) -> None:
    home = tmp_path / "D"
    result = loopd(tmp_path, "run", "--home", home, "--session", "../x", "hi")
    assert result.returncode == 2
    no_traceback(result)
    assert "../x" in result.stderr
    assert "invalid session id" in result.stderr
    # Refused before anything is stored: no store file in --home.
    assert not (home / "loopd.db").exists()


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("[model]\nbogus = 1\n", "bogus"),
        ("surprise = true\n", "surprise"),
        ('[loop]\nmax_steps = "many"\n', "max_steps"),
    ],
)
def test_run_bad_config_exits_2_naming_the_key(tmp_path: Path, toml: str, key: str) -> None:
    config = tmp_path / "loopd.toml"
    config.write_text(toml)
    home = tmp_path / "D"
    result = loopd(tmp_path, "run", "--config", config, "--home", home, "hi")
    assert result.returncode == 2
    no_traceback(result)
    assert key in result.stderr
    assert not home.exists()


def test_run_missing_config_file_exits_2(tmp_path: Path) -> None:
    result = loopd(tmp_path, "run", "--config", tmp_path / "nope.toml", "hi")
    assert result.returncode == 2
    no_traceback(result)
    assert "nope.toml" in result.stderr


def test_run_uses_the_config_file(chat_server: Server, tmp_path: Path) -> None:
    server = chat_server([reply("from the file")])
    home = tmp_path / "configured"
    config = tmp_path / "loopd.toml"
    config.write_text(
        f'home = "{home}"\n\n[model]\nbase_url = "{server.base_url}"\nname = "file-model"\n'
    )
    result = loopd(tmp_path, "run", "--config", config, "--session", "c1", "hi")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "from the file\n"
    assert [r["model"] for r in server.requests] == ["file-model"]
    assert (home / "loopd.db").exists()


def test_run_waits_for_background_children_and_shows_them(
    chat_server: Server, tmp_path: Path
) -> None:
    def script(body: dict[str, Any]) -> Any:
        last = body["messages"][-1]
        if body["messages"][1]["content"].startswith("It is "):
            return reply("Saturday.")
        if last.get("name") == "subagent":
            return reply("noted")
        if last["role"] == "user":
            return call("subagent", task="find a day", background=True)
        return reply("asked a helper")

    server = chat_server(script)
    config = tmp_path / "loopd.toml"
    config.write_text(
        f'home = "{tmp_path / "bg"}"\n\n[model]\nbase_url = "{server.base_url}"\n'
        "\n[subagents]\nbackground = true\n"
    )
    result = loopd(tmp_path, "run", "--config", config, "--session", "b1", "plan")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "asked a helper\n"
    assert "┬ spawns sub-b1-1 for call 1 (background)" in result.stderr
    assert server.requests[-1]["messages"][-1] == {
        "role": "user",
        "content": "sub-b1-1 completed\nSaturday.",
        "name": "subagent",
    }


def test_run_agent_picks_the_profile_and_a_stored_session_keeps_it(
    chat_server: Server, tmp_path: Path
) -> None:
    server = chat_server({"big": [reply("planned")], "small": [reply("read"), reply("again")]})
    home = tmp_path / "profiled"
    config = tmp_path / "loopd.toml"
    config.write_text(
        f'home = "{home}"\n\n[model]\nbase_url = "{server.base_url}"\nname = "big"\n\n'
        '[agents.researcher]\nmodel = "small"\nsystem = "You read."\n'
    )
    result = loopd(
        tmp_path, "run", "--config", config, "--agent", "researcher", "--session", "r", "hi"
    )
    assert (result.returncode, result.stdout) == (0, "read\n"), result.stderr
    assert server.requests[0]["messages"][0] == {"role": "system", "content": "You read."}
    # Resumed without --agent: the stored profile.
    result = loopd(tmp_path, "run", "--config", config, "--session", "r", "more")
    assert (result.returncode, result.stdout) == (0, "again\n"), result.stderr
    # Another profile for the stored session: refused, exit 2, nothing sent.
    result = loopd(tmp_path, "run", "--config", config, "--agent", "default", "--session", "r", "x")
    assert result.returncode == 2
    assert "runs the agent profile researcher, not default" in result.stderr
    no_traceback(result)
    result = loopd(tmp_path, "run", "--config", config, "--agent", "poet", "x")
    assert result.returncode == 2 and "no agent profile is named 'poet'" in result.stderr
    assert [r["model"] for r in server.requests] == ["small", "small"]
    show = loopd(tmp_path, "sessions", "--config", config, "show", "r")
    assert show.returncode == 0, show.stderr
    assert "agent     researcher\n" in show.stdout


def test_run_flags_override_the_config_file(chat_server: Server, tmp_path: Path) -> None:
    server = chat_server([reply("overridden")])
    file_home = tmp_path / "configured"
    flag_home = tmp_path / "flagged"
    config = tmp_path / "loopd.toml"
    config.write_text(
        f'home = "{file_home}"\n\n[model]\nbase_url = "{server.base_url}"\nname = "file-model"\n'
    )
    result = loopd(
        tmp_path, "run", "--config", config, "--model", "cli-model", "--home", flag_home, "hi"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "overridden\n"
    assert [r["model"] for r in server.requests] == ["cli-model"]
    assert (flag_home / "loopd.db").exists()
    assert not file_home.exists()


def test_run_base_url_flag_overrides_the_config_file(chat_server: Server, tmp_path: Path) -> None:
    server = chat_server([reply("from the flag's server")])
    config = tmp_path / "loopd.toml"
    dead = f"http://127.0.0.1:{free_port()}/v1"
    config.write_text(f'[model]\nbase_url = "{dead}"\nname = "file-model"\n')
    result = loopd(
        tmp_path,
        "run",
        "--config",
        config,
        "--base-url",
        server.base_url,
        "--home",
        tmp_path / "D",
        "hi",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "from the flag's server\n"
    assert [r["model"] for r in server.requests] == ["file-model"]


def test_no_command_is_a_usage_error(tmp_path: Path) -> None:
    result = loopd(tmp_path)
    assert result.returncode == 2
    no_traceback(result)
    assert "usage:" in result.stderr


def test_a_home_that_cannot_be_made_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    result = loopd(tmp_path, "run", "--home", blocker / "home", "--base-url", "http://x", "hi")
    assert result.returncode == 2
    no_traceback(result)
    assert str(blocker / "home") in result.stderr or "file" in result.stderr


# --- the doors of the command line (issue 9) ---


def run_in_process(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``loopd ARGV`` in this process, for refusals that come before any runtime starts."""
    from actors.shells.cli import main

    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("value", ["inf", "1e308", "-1", "0", "nan", "soon"])
def test_run_refuses_a_timeout_that_is_not_finite_seconds(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, value: str
) -> None:
    home = tmp_path / "D"
    code, _, err = run_in_process(capsys, "run", "--home", str(home), "--timeout", value, "hi")
    assert code == 2
    assert "argument --timeout" in err and "Traceback" not in err
    assert not home.exists()


def test_run_refuses_a_childs_session_id(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    home = tmp_path / "D"
    code, _, err = run_in_process(capsys, "run", "--home", str(home), "--session", "sub-p-1", "x")
    assert code == 2
    assert "children are opened only by their parents" in err
    assert not home.exists()


@pytest.mark.parametrize("command", ["run", "sessions"])
def test_an_empty_home_is_refused_not_replaced_by_the_default(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str
) -> None:
    args = ["--home", "", "hi"] if command == "run" else ["--home", ""]
    code, _, err = run_in_process(capsys, command, *args)
    assert code == 2
    assert "home must not be empty" in err
    assert not (tmp_path / ".loopd").exists()


@pytest.mark.parametrize(
    "url", ["http://[::1", "http://a\r\nX-Evil: 1", "http://" + "h" * 5000, "127.0.0.1:8080"]
)
def test_run_refuses_an_unusable_base_url_naming_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, url: str
) -> None:
    code, _, err = run_in_process(capsys, "run", "--home", str(tmp_path), "--base-url", url, "x")
    assert code == 2
    assert "model.base_url" in err and "is not a usable URL" in err
    assert "\r" not in err and len(err) < 400


def test_sessions_on_a_home_that_is_a_file_is_an_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a home")
    code, out, err = run_in_process(capsys, "sessions", "--home", str(a_file))
    assert code == 2
    assert f"the home {a_file} is not a folder" in err
    assert "no sessions" not in out


@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
def test_a_config_that_is_not_a_regular_file_is_refused_at_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str
) -> None:
    path = Path("/dev/zero")
    if kind == "fifo":
        path = tmp_path / "loopd.toml"
        os.mkfifo(path)
    code, _, err = run_in_process(capsys, "sessions", "--config", str(path))
    assert code == 2
    assert "not a regular file" in err


def test_a_config_with_a_utf8_bom_is_read(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    home = tmp_path / "bom-home"
    path = tmp_path / "loopd.toml"
    path.write_bytes(b"\xef\xbb\xbf" + f'home = "{home}"\n'.encode())
    code, out, err = run_in_process(capsys, "sessions", "--config", str(path))
    assert code == 0, err
    assert f"no sessions: {home / 'loopd.db'} does not exist" in out


def test_a_bad_api_key_stops_run_naming_the_variable_not_the_value(tmp_path: Path) -> None:
    env = dict(os.environ, HOME=str(tmp_path), LOOPD_TEST_KEY="sk-secret-\x01-value")
    config = tmp_path / "loopd.toml"
    config.write_text('[model]\napi_key_env = "LOOPD_TEST_KEY"\n')
    result = subprocess.run(
        [sys.executable, "-m", "actors.shells.cli", "run", "--config", str(config), "hi"],
        cwd=tmp_path,
        env=env,
        timeout=TIMEOUT_S,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    no_traceback(result)
    assert "LOOPD_TEST_KEY" in result.stderr and "control character" in result.stderr
    assert "secret" not in result.stderr


def test_run_never_runs_a_scheduled_job(chat_server: Server, tmp_path: Path) -> None:
    # A one-shot command used to start the scheduler and use up the due heartbeat.
    server = chat_server([reply("answer"), reply("heartbeat answer")])
    home = tmp_path / "D"
    home.mkdir()
    (home / "HEARTBEAT.md").write_text("Anything new?")
    config = tmp_path / "loopd.toml"
    config.write_text(
        f'home = "{home}"\n[heartbeat]\nsession = "watch"\nevery_s = 1\n'
        '[[cron]]\nsession = "morning"\nschedule = "* * * * *"\nprompt = "go"\n'
    )
    result = loopd(tmp_path, "run", "--config", config, "--base-url", server.base_url, "hi")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "answer\n"
    assert len(server.requests) == 1
    assert not (home / "scheduler.json").exists()
    assert "watch" not in result.stderr and "morning" not in result.stderr


def test_model_text_reaches_the_terminal_escaped_and_the_store_unchanged(
    chat_server: Server, tmp_path: Path
) -> None:
    hostile = "\x1b]0;PWNED\x07\x1b[2Jdone\x9b1m"
    server = chat_server([call("\x1b[31mclock"), reply(hostile)])
    home = tmp_path / "D"
    result = loopd(tmp_path, "run", "--base-url", server.base_url, "--home", home, "go")
    assert result.returncode == 0, result.stderr
    for text in (result.stdout, result.stderr):
        assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text
    assert result.stdout == "\\x1b]0;PWNED\\x07\\x1b[2Jdone\\x9b1m\n"
    assert "← model calls \\x1b[31mclock" in result.stderr
    shown = loopd(tmp_path, "sessions", "show", "main", "--home", home)
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout
    assert "    \\x1b]0;PWNED\\x07\\x1b[2Jdone\\x9b1m" in shown.stdout
    with SessionStore(home / "loopd.db") as store:
        assert store.history("main")[-1].message.content == hostile


def test_sessions_reads_a_home_it_may_not_write(tmp_path: Path) -> None:
    home = tmp_path / "D"
    with Runtime.start(Config(home=home), model=ScriptedModel([reply("hi")])) as rt:
        rt.run_turn("kept", "hello", timeout=TIMEOUT_S)
    before = sorted(p.name for p in home.iterdir())
    # Root ignores file modes, so make the folder and the store immutable instead.
    flagged = [home / "loopd.db", home]
    done = [p for p in flagged if subprocess.run(["chattr", "+i", p], check=False).returncode == 0]
    try:
        if done != flagged:
            pytest.skip("chattr +i is not available here to make a folder read-only")
        listed = loopd(tmp_path, "sessions", "--home", home)
        shown = loopd(tmp_path, "sessions", "show", "kept", "--home", home)
    finally:
        for p in done:
            subprocess.run(["chattr", "-i", p], check=False)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[1].split()[0] == "kept"
    assert shown.returncode == 0, shown.stderr
    assert "hello" in shown.stdout
    assert sorted(p.name for p in home.iterdir()) == before


def test_sessions_never_writes_the_store(tmp_path: Path) -> None:
    home = tmp_path / "D"
    with Runtime.start(Config(home=home), model=ScriptedModel([reply("hi")])) as rt:
        rt.run_turn("kept", "hello", timeout=TIMEOUT_S)
    db = home / "loopd.db"
    stamp = (db.stat().st_mtime_ns, db.read_bytes())
    assert loopd(tmp_path, "sessions", "--home", home).returncode == 0
    assert (db.stat().st_mtime_ns, db.read_bytes()) == stamp
    from actors.stores.base import StoreError
    from actors.stores.reader import StoreReader

    with StoreReader(db) as reader, pytest.raises(StoreError, match="readonly"):
        reader.append("kept", (), turns=9, next_call_id=9, untrusted=False)


FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
flag_text = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["inf", "-inf", "nan", "1e308", "-1", "0", "0.5", "", "http://[::1", "~"]),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(timeout=flag_text, session=st.text(max_size=20), base_url=flag_text, model=flag_text)
def test_any_run_flags_are_refused_cleanly(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    timeout: str,
    session: str,
    base_url: str,
    model: str,
) -> None:
    # The session is a child's id, so every run is refused before a runtime starts; whichever
    # flag is refused first, the refusal is an exit 2 with a line, never a traceback.
    monkeypatch.chdir(tmp_path)
    argv = ["run", "--home", str(tmp_path / "D"), "--session", f"sub-{session}"]
    argv += ["--timeout", timeout, "--base-url", base_url, "--model", model, "hi"]
    code, _, err = run_in_process(capsys, *argv)
    assert code == 2
    assert "Traceback" not in err and err.strip()
    assert not (tmp_path / "D").exists()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(home=st.text(max_size=30), show=st.one_of(st.none(), st.text(max_size=10)))
def test_any_sessions_home_lists_or_is_refused_cleanly(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    home: str,
    show: str | None,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("x")
    argv = ["sessions", "--home", home] + (["show", show] if show is not None else [])
    code, _, err = run_in_process(capsys, *argv)
    assert code in (0, 2), (code, err)
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # it only reads


def test_demo_refuses_an_empty_home_too(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_in_process(capsys, "demo", "--home", "")
    assert code == 2
    assert "home must not be empty" in err


def test_run_text_that_is_not_unicode_is_refused(tmp_path: Path) -> None:
    # Bytes that are not UTF-8 on the command line arrive as lone surrogates.
    env = dict(os.environ, HOME=str(tmp_path))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "actors.shells.cli",
            "run",
            "--home",
            str(tmp_path / "D"),
            b"caf\xe9",
        ],
        cwd=tmp_path,
        env=env,
        timeout=TIMEOUT_S,
        capture_output=True,
        check=False,
    )
    assert result.returncode == 2
    assert b"the turn text is not valid Unicode text" in result.stderr
    assert b"Traceback" not in result.stderr
    assert not (tmp_path / "D").exists()


def test_sessions_show_prints_unparseable_arguments_as_the_model_wrote_them(
    tmp_path: Path,
) -> None:
    # The wire gets {} (a server refuses the history otherwise); a person sees the model's text.
    home = tmp_path / "home"
    script = [call("clock", "{not json"), reply("done")]
    with Runtime.start(Config(home=str(home)), model=ScriptedModel(script)) as rt:
        rt.run_turn("raw", "go", timeout=30)
    result = loopd(tmp_path, "sessions", "show", "raw", "--home", home)
    assert result.returncode == 0, result.stderr
    assert "clock({not json)" in result.stdout
    assert "clock({})" not in result.stdout


def test_sessions_show_prints_no_slot_for_a_profile_of_the_openai_backend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 19 B12: an openai-backend profile has no slots; "slot 1" there pointed nowhere.
    from actors.shells.cli import main

    config = tmp_path / "loopd.toml"
    config.write_text(
        f'home = "{tmp_path / "home"}"\n\n[agents.cloud]\nbackend = "openai"\n\n'
        '[agents.local]\ndescription = "on the llama.cpp server"\n'
    )
    script = ScriptedModel([call("subagent", task="t", agent="cloud"), reply("c"), reply("p")])
    with Runtime.start(Config.load(config), model=script) as rt:
        assert rt.run_turn("main", "go", timeout=TIMEOUT_S).session == "main"
    shown = {}
    for session in ("main", "sub-main-1"):
        assert main(["sessions", "show", session, "--config", str(config)]) == 0
        shown[session] = capsys.readouterr().out
    assert re.search(r"^slot\s+0$", shown["main"], re.M)
    assert re.search(r"^agent\s+cloud$", shown["sub-main-1"], re.M)
    assert re.search(r"^slot\s+-$", shown["sub-main-1"], re.M)
    # The whole config on the openai backend: no session has a slot.
    config.write_text(f'home = "{tmp_path / "home"}"\n\n[model]\nbackend = "openai"\n')
    assert main(["sessions", "show", "main", "--config", str(config)]) == 0
    assert re.search(r"^slot\s+-$", capsys.readouterr().out, re.M)
