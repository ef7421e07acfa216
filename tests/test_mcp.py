"""MCP servers as tools, with real servers on the SDK's server side (tests/mcp_servers):
listing, calls, errors, trust, profiles, list changes, cancel, time limits, supervision."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp_helpers import (
    WAIT,
    HttpServer,
    LogWatch,
    calls_what_it_is_told,
    process_alive,
    stdio,
)

from actors import Config, Runtime
from actors.core.config import AgentConfig, PortConfig
from actors.core.mcp_config import McpServerConfig
from actors.core.mcp_tools import McpCatalog
from actors.dispatcher.directory import Directory, session_address
from actors.services.mcp import McpService
from actors.testing import Probe, ScriptedModel, calls, reply
from actors.tools.typed import port_tool
from messages import (
    FailReason,
    Inspect,
    McpServerDown,
    McpServerUp,
    ToolCallFinished,
    ToolProgress,
    TurnCompleted,
    TurnFailed,
)

pytestmark = pytest.mark.timeout(120)


def start(home: Path, mcp: dict[str, McpServerConfig], **config: Any) -> tuple[Runtime, Any]:
    model = ScriptedModel(calls_what_it_is_told)
    rt = Runtime.start(Config(home=str(home), **config), model=model, mcp=mcp)
    return rt, model


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Runtime, Any]]:
    """One runtime with the test server over stdio, for the tests that do not break it."""
    rt, model = start(tmp_path_factory.mktemp("mcp") / "home", {"files": stdio()})
    yield rt, model
    rt.stop()


def text_of(rt: Runtime, session: str, text: str) -> str:
    outcome = rt.run_turn(session, text, timeout=WAIT)
    assert isinstance(outcome, TurnCompleted), outcome
    return outcome.content


def tools_listed(model: ScriptedModel, session: str) -> list[str]:
    request = [r for r in model.requests if r.session == session][-1]
    return [spec.name for spec in request.tools]


def untrusted(rt: Runtime, session: str) -> bool:
    actor = rt.directory.get(session_address(session))
    return bool(actor.ask(Inspect(), timeout=WAIT).untrusted)  # type: ignore[union-attr]


# Listing and calls.


def test_the_start_lists_the_servers_tools_with_their_description_and_schema(shared) -> None:
    rt, model = shared
    up = rt.mcp_servers()["files"]
    assert isinstance(up, McpServerUp)
    assert "files__read" in up.tools and "files__slow" in up.tools
    assert up.skipped == ("t" * 70,)  # files__ttt... is longer than 64: left out and named
    assert text_of(rt, "lister", "say:hello") == "hello"
    request = next(r for r in model.requests if r.session == "lister")
    read = next(spec for spec in request.tools if spec.name == "files__read")
    assert read.description == "Read a file by its path."
    assert read.parameters["properties"]["path"]["type"] == "string"
    assert read.parameters["required"] == ["path"]


def test_a_call_answers_the_servers_text_and_taints_the_session(shared) -> None:
    rt, _ = shared
    assert text_of(rt, "reader", 'files__read {"path": "notes.txt"}') == "contents of notes.txt"
    assert untrusted(rt, "reader")
    assert text_of(rt, "searcher", 'files__search {"word": "w", "limit": 2}') == "w 0\nw 1"


def test_the_repl_shows_each_servers_state(shared) -> None:
    from actors.shells.repl import Helpers

    shown = repr(Helpers(shared[0]).mcp()).splitlines()
    assert shown[0].split() == ["NAME", "STATE", "TOOLS", "/", "WHY"]
    assert shown[1].split()[:3] == ["files", "up", "files__broken,"]


def test_the_taint_reaches_the_parent_through_its_child(shared) -> None:
    rt, _ = shared
    task = json.dumps({"task": 'files__read {"path": "mail"}'})
    text = text_of(rt, "parent", f"subagent {task}")
    assert text == "sub-parent-1 completed\ncontents of mail"
    assert untrusted(rt, "parent")  # the child read an untrusted result, so the parent did


def test_an_error_result_and_other_content(shared) -> None:
    rt, _ = shared
    assert text_of(rt, "broken", "files__broken") == (
        "Error: Error executing tool broken: the disk is on fire"
    )
    assert text_of(rt, "picture", "files__picture") == "[image/png, 100 bytes]"


def test_arguments_are_checked_against_the_input_schema_before_sending(shared) -> None:
    rt, _ = shared
    seen: list[Any] = []
    done = threading.Event()

    def watch(event: Any) -> None:
        if isinstance(event, ToolCallFinished) and event.session == "checked":
            seen.append(event)
            done.set()

    stop = rt.subscribe(watch)
    try:
        assert text_of(rt, "checked", 'files__read {"path": 3}') == (
            "Denied: the arguments are not valid for this tool: path: 3 is not of type 'string'."
        )
        assert done.wait(WAIT) and seen[0].denied
    finally:
        stop()
    assert text_of(rt, "missing", "files__read {}") == (
        "Denied: the arguments are not valid for this tool: 'path' is a required property."
    )
    assert not untrusted(rt, "missing")  # nothing was sent, nothing came back


def test_a_stdio_server_gets_env_but_never_the_api_key(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LOOPD_TEST_API_KEY", "sk-secret")
    rt, _ = start(
        tmp_path / "home",
        {"files": stdio(env={"ROOT": "/srv/data"})},
        model={"api_key_env": "LOOPD_TEST_API_KEY"},
    )
    try:
        assert text_of(rt, "a", 'files__getenv {"name": "ROOT"}') == "/srv/data"
        assert text_of(rt, "b", 'files__getenv {"name": "LOOPD_TEST_API_KEY"}') == ""
        assert text_of(rt, "c", 'files__getenv {"name": "PATH"}') == os.environ["PATH"]
    finally:
        rt.stop()


def test_a_trusted_servers_results_leave_the_session_trusted(tmp_path) -> None:
    rt, _ = start(tmp_path / "home", {"files": stdio(trusted=True, tools=("read",))})
    try:
        assert text_of(rt, "s", 'files__read {"path": "a"}') == "contents of a"
        assert not untrusted(rt, "s")
        up = rt.mcp_servers()["files"]
        assert isinstance(up, McpServerUp) and up.tools == ("files__read",)  # the allow list
    finally:
        rt.stop()


def test_a_profile_allows_some_tools_by_name_or_by_server(tmp_path) -> None:
    agents = {
        "reader": AgentConfig(tools=("clock", "files__read")),
        "any": AgentConfig(tools=("files__*",)),
    }
    rt, model = start(tmp_path / "home", {"files": stdio()}, agents=agents)
    try:
        assert rt.run_turn("r", "say:hi", agent="reader", timeout=WAIT).content == "hi"
        assert tools_listed(model, "r") == ["clock", "files__read"]
        outcome = rt.run_turn("r2", 'files__search {"word": "x"}', agent="reader", timeout=WAIT)
        assert outcome.content == "Denied: there is no tool with this name: files__search."
        assert rt.run_turn("a", "say:hi", agent="any", timeout=WAIT).content == "hi"
        listed = tools_listed(model, "a")
        assert "files__search" in listed and all(n.startswith("files__") for n in listed)
    finally:
        rt.stop()


def test_a_tool_list_change_reaches_new_sessions_only(tmp_path) -> None:
    rt, model = start(tmp_path / "home", {"files": stdio()})
    ups: list[McpServerUp] = []
    grown = threading.Event()

    def watch(event: Any) -> None:
        if isinstance(event, McpServerUp) and "files__extra" in event.tools:
            ups.append(event)
            grown.set()

    rt.subscribe(watch)
    try:
        assert text_of(rt, "old", "files__grow") == "grown"
        assert grown.wait(WAIT)
        assert "files__extra" in rt.mcp_servers()["files"].tools  # type: ignore[union-attr]
        assert text_of(rt, "old", "say:again") == "again"
        assert "files__extra" not in tools_listed(model, "old")  # its list is its baseline's
        assert text_of(rt, "new", "files__extra") == "extra answers"
        assert "files__extra" in tools_listed(model, "new")
    finally:
        rt.stop()


def test_progress_notifications_are_events_of_the_calling_session(shared) -> None:
    rt, _ = shared
    seen: list[ToolProgress] = []
    done = threading.Event()

    def watch(event: Any) -> None:
        if isinstance(event, ToolProgress) and event.session == "stepper":
            seen.append(event)
        if isinstance(event, ToolCallFinished) and event.session == "stepper":
            done.set()

    stop = rt.subscribe(watch)
    try:
        assert text_of(rt, "stepper", "files__steps") == "three steps"
        assert done.wait(WAIT)
    finally:
        stop()
    assert [(e.call_id, e.name, e.progress, e.total, e.message) for e in seen] == [
        (1, "files__steps", float(n), 3.0, f"step {n}") for n in (1, 2, 3)
    ]


def test_a_call_takes_no_port_worker(tmp_path) -> None:
    mcp_done = threading.Event()

    @port_tool
    def hold() -> str:
        """Holds the one port worker until the MCP call has its result."""
        return "held" if mcp_done.wait(WAIT) else "the MCP call waited for the port"

    model = ScriptedModel([calls(("hold", {}), ("files__read", {"path": "a"})), reply("done")])
    config = Config(home=str(tmp_path / "home")).replace(port=PortConfig(concurrency=1))
    rt = Runtime.start(config, model=model, tools=[hold], mcp={"files": stdio()})
    rt.subscribe(
        lambda e: (
            mcp_done.set() if isinstance(e, ToolCallFinished) and e.name == "files__read" else None
        )
    )
    try:
        assert rt.run_turn("s", "go", timeout=WAIT) == TurnCompleted("s", "done")
        results = [m.content for m in model.requests[-1].messages if m.role == "tool"]
        assert results == ["held", "contents of a"]
    finally:
        rt.stop()


# Time, cancel, supervision.


def test_cancelling_the_turn_cancels_the_call_on_the_server(shared) -> None:
    rt, _ = shared
    probe = Probe.start(rt.directory)
    with LogWatch() as log:
        rt.send_turn("cancelled", "files__slow", reply_to=probe.address)
        log.wait_for("slow started")
        assert rt.cancel("cancelled") == ("cancelled",)
        assert probe.expect(TurnFailed, timeout=WAIT).reason is FailReason.CANCELLED
        log.wait_for("slow cancelled")  # notifications/cancelled reached the server
    probe.stop()


def test_a_call_past_timeout_s_is_answered_and_cancelled(tmp_path) -> None:
    # timeout_s bounds the start too, so it is the generous WAIT (the server's imports alone
    # take seconds on a busy machine); the call is one that never answers within it.
    rt, _ = start(tmp_path / "home", {"files": stdio()})
    try:
        assert isinstance(rt.mcp_servers()["files"], McpServerUp)
        with LogWatch() as log:
            outcome = rt.run_turn("s", 'files__slow {"seconds": 86400}', timeout=3 * WAIT)
            assert outcome == TurnCompleted(
                "s", f"Error: files__slow gave no answer within {WAIT:g} s"
            )
            log.wait_for("slow cancelled")
    finally:
        rt.stop()


def test_a_server_that_never_answers_does_not_hold_up_the_start(tmp_path) -> None:
    rt, _ = start(tmp_path / "home", {"mute": stdio("--mute", timeout_s=0.5)})
    try:
        down = rt.mcp_servers()["mute"]
        assert down == McpServerDown(
            server="mute", detail="it gave no answer within 0.5 s", at=down.at
        )
        # Its tools were never listed: a call of one is told why it cannot run, and since when.
        text = text_of(rt, "s", "mute__read")
        assert re.fullmatch(
            r"Error: MCP server mute is not running: it gave no answer within 0\.5 s "
            r"\(since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\)",
            text,
        ), text
    finally:
        rt.stop()


def test_a_server_that_exits_at_start_is_reported_and_retried(tmp_path) -> None:
    with LogWatch() as log:
        rt, _ = start(tmp_path / "home", {"files": stdio("--exit-at-start")})
        try:
            down = rt.mcp_servers()["files"]
            assert isinstance(down, McpServerDown), down
            assert down.detail == "its process exited before it was up"
            log.wait_for("MCP server files: exiting at start")  # its stderr, in loopd's log
            log.wait_for(r"MCP server files: starting it again in 1 s")
            text = text_of(rt, "s", 'files__read {"path": "a"}')  # never listed
            assert text.startswith(
                "Error: MCP server files is not running: its process exited before it was up "
                "(since "
            ), text
        finally:
            rt.stop()


def test_a_server_that_cannot_start_is_tried_again_with_doubling_backoff() -> None:
    directory = Directory()
    service = McpService(
        {"files": stdio("--exit-at-start")},
        McpCatalog(["files"]),
        directory,
        result_cap=1000,
        backoff=(0.05, 0.2),
    )
    with LogWatch() as log:
        service.start()
        try:
            for wait in ("0.05", "0.1", "0.2"):
                log.wait_for(rf"MCP server files: starting it again in {re.escape(wait)} s")
            log.wait_for_count(r"starting it again in 0\.2 s", 2)
        finally:
            assert service.stop(WAIT)


def test_a_server_that_was_up_is_started_again_after_the_shortest_wait() -> None:
    # The backoff doubles while a server cannot start; one that came up and died later waits
    # the shortest time again, so a server that crashes now and then never waits 60 s.
    service = McpService(
        {"files": stdio()},
        McpCatalog(["files"]),
        Directory(),
        result_cap=1000,
        backoff=(0.05, 0.2),
    )
    with LogWatch() as log:
        service.start()
        try:
            for life in (1, 2, 3):
                log.wait_for_count(r"MCP server files is up", life)
                log.wait_for_count(r"serving stdio in \d+", life)
                pids = re.findall(r"serving stdio in (\d+)", "\n".join(log.lines))
                os.kill(int(pids[life - 1]), signal.SIGKILL)  # this life's process
                log.wait_for_count(r"starting it again in 0\.05 s", life)
            assert not [line for line in log.lines if "starting it again in 0.1 s" in line]
        finally:
            assert service.stop(WAIT)


def test_a_server_killed_mid_call_answers_the_call_and_comes_back(tmp_path) -> None:
    rt, _ = start(tmp_path / "home", {"files": stdio()})
    events: list[Any] = []
    back = threading.Event()

    def watch(event: Any) -> None:
        if isinstance(event, McpServerDown | McpServerUp):
            events.append(event)
            if isinstance(event, McpServerUp):
                back.set()

    rt.subscribe(watch)
    probe = Probe.start(rt.directory)
    try:
        with LogWatch() as log:
            rt.send_turn("s", "files__slow", reply_to=probe.address)
            pid = int(log.wait_for(r"slow started in (\d+)").group(1))
            os.kill(pid, signal.SIGKILL)
            outcome = probe.expect(TurnCompleted, timeout=WAIT)
        assert outcome.content.startswith("Error: MCP server files stopped during the call")
        assert back.wait(WAIT)  # started again after 1 s
        assert isinstance(events[0], McpServerDown) and events[0].detail == "its process exited"
        assert text_of(rt, "t", 'files__read {"path": "b"}') == "contents of b"
    finally:
        probe.stop()
        rt.stop()


def test_a_call_while_the_server_is_down_is_answered_at_once(tmp_path) -> None:
    rt, _ = start(tmp_path / "home", {"files": stdio()})
    down = threading.Event()
    rt.subscribe(lambda e: down.set() if isinstance(e, McpServerDown) else None)
    try:
        pid = int(text_of(rt, "s", "files__pid"))
        os.kill(pid, signal.SIGKILL)
        assert down.wait(WAIT)
        text = text_of(rt, "t", 'files__read {"path": "b"}')
        assert text.startswith(
            "Error: MCP server files is not running: its process exited (since "
        ), text
    finally:
        rt.stop()


def test_stop_ends_every_server_process(tmp_path) -> None:
    rt, _ = start(tmp_path / "home", {"one": stdio(), "two": stdio()})
    pids = [int(text_of(rt, f"s{n}", f"{n}__pid")) for n in ("one", "two")]
    assert all(process_alive(pid) for pid in pids)
    rt.stop()
    assert not any(process_alive(pid) for pid in pids)


def test_a_flood_on_stderr_is_logged_capped(tmp_path) -> None:
    rt, _ = start(tmp_path / "home", {"files": stdio()})
    try:
        with LogWatch() as log:
            assert text_of(rt, "s", 'files__flood {"lines": 3000}') == "flooded"
            assert text_of(rt, "t", 'files__read {"path": "x"}') == "contents of x"
        rt.stop()
        flood = [line for line in log.lines if "flood line" in line]
        assert 0 < len(flood) <= 100
    finally:
        rt.stop()


# Streamable HTTP.


def test_a_server_over_streamable_http(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WEB_TOKEN", "Bearer t0ken")
    server = HttpServer()
    web = McpServerConfig(
        url=server.url, headers_env={"Authorization": "WEB_TOKEN"}, timeout_s=WAIT
    )
    rt, _ = start(tmp_path / "home", {"web": web})
    events: list[Any] = []
    down = threading.Event()

    def watch(event: Any) -> None:
        events.append(event)
        if isinstance(event, McpServerDown):
            down.set()

    rt.subscribe(watch)
    try:
        assert isinstance(rt.mcp_servers()["web"], McpServerUp)
        assert text_of(rt, "s", 'web__read {"path": "a"}') == "contents of a"
        assert untrusted(rt, "s")
        assert text_of(rt, "t", "web__broken").startswith("Error: Error executing tool broken")
        assert text_of(rt, "h", 'web__header {"name": "authorization"}') == "Bearer t0ken"
        server.stop()
        text = text_of(rt, "u", 'web__read {"path": "a"}')
        assert text.startswith("Error: MCP server web stopped during the call"), text
        assert down.wait(WAIT)
        first = next(e for e in events if isinstance(e, McpServerDown))
        assert first.detail.startswith("it stopped answering: ")  # a failed call, then a ping
    finally:
        rt.stop()
        server.stop()


def test_an_http_server_without_its_header_variable_stays_down(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("LOOPD_NO_SUCH_TOKEN", raising=False)
    web = McpServerConfig(
        url="http://127.0.0.1:9/mcp", headers_env={"Authorization": "LOOPD_NO_SUCH_TOKEN"}
    )
    rt, _ = start(tmp_path / "home", {"web": web})
    try:
        down = rt.mcp_servers()["web"]
        assert isinstance(down, McpServerDown)
        assert (
            down.detail == "the environment variable LOOPD_NO_SUCH_TOKEN is not set (headers_env)"
        )
    finally:
        rt.stop()


def test_stop_ends_a_server_that_is_still_starting() -> None:
    service = McpService(
        {"mute": stdio("--mute")}, McpCatalog(["mute"]), Directory(), result_cap=1000
    )
    with LogWatch() as log:
        service.start()
        pid = int(log.wait_for(r"MCP server mute: mute (\d+)").group(1))
        assert process_alive(pid)
        assert service.stop(WAIT)
    assert not process_alive(pid)
