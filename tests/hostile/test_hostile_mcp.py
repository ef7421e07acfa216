"""Hostile MCP servers (tests/mcp_servers/hostile_server.py, on the SDK's ``MCPServer``) beside a
healthy one: each case gets a clear answer, the healthy server's calls are unharmed, the
runtime stops and leaves no process behind."""

from __future__ import annotations

import http.server
import re
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from hostile_strategies import DEEP
from mcp_helpers import WAIT, LogWatch, calls_what_it_is_told, process_alive, stdio

from actors import Config, Runtime
from actors.core.mcp_config import McpServerConfig
from actors.testing import ScriptedModel
from actors.tools.mcp_stdio import JUNK_LINES_PER_MINUTE
from messages import McpServerDown, McpServerUp, TurnCompleted

pytestmark = pytest.mark.timeout(180)

HOSTILE = str(Path(__file__).parents[1] / "mcp_servers" / "hostile_server.py")
CAP = 2000  # loop.tool_result_cap here


def hostile(tag: str, *flags: str, **options: Any) -> McpServerConfig:
    """The hostile server over stdio; ``tag`` marks its command line (found in /proc)."""
    options.setdefault("timeout_s", WAIT)
    return McpServerConfig(command=(sys.executable, HOSTILE, "--tag", tag, *flags), **options)


def running_with(tag: str) -> list[int]:
    """The processes whose command line holds ``tag``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if tag.encode() in (entry / "cmdline").read_bytes() and process_alive(
                    int(entry.name)
                ):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


class Pair:
    """A runtime with the healthy test server ``files`` and a hostile one ``h``."""

    def __init__(self, home: Path, *flags: str, **options: Any) -> None:
        self.tag = f"loopd-test-{uuid.uuid4()}"
        self.model = ScriptedModel(calls_what_it_is_told)
        config = Config(home=str(home), loop={"tool_result_cap": CAP})
        mcp = {"files": stdio(), "h": hostile(self.tag, *flags, **options)}
        self.rt = Runtime.start(config, model=self.model, mcp=mcp)

    def text(self, session: str, text: str, timeout: float = WAIT) -> str:
        outcome = self.rt.run_turn(session, text, timeout=timeout)
        assert isinstance(outcome, TurnCompleted), outcome
        return outcome.content

    def healthy(self, session: str = "healthy") -> None:
        """The other server's call is unharmed."""
        assert self.text(session, 'files__read {"path": "a"}') == "contents of a"

    def stop(self) -> None:
        """Stop the runtime: it ends in time and leaves no hostile process behind."""
        self.rt.stop()
        assert running_with(self.tag) == []


@pytest.fixture
def pairs(tmp_path: Path) -> Iterator[Any]:
    started: list[Pair] = []

    def make(*flags: str, **options: Any) -> Pair:
        pair = Pair(tmp_path / f"home{len(started)}", *flags, **options)
        started.append(pair)
        return pair

    yield make
    for pair in started:
        pair.rt.stop()


def up(pair: Pair) -> McpServerUp:
    state = pair.rt.mcp_servers()["h"]
    assert isinstance(state, McpServerUp), state
    return state


# 12: schemas are checked off the loop, and bounded.


def test_ten_thousand_tools_and_a_huge_schema_are_bounded_and_named(pairs) -> None:
    pair = pairs("--tools", "10000", "--huge-schema", "30000")
    state = up(pair)
    assert len(state.tools) == 1000  # max_tools
    huge = [s for s in state.skipped if s.startswith("huge ")]
    assert huge and "over max_schema_bytes (65,536)" in huge[0], state.skipped
    assert any(s.endswith("more tools past max_tools (1,000)") for s in state.skipped)
    assert pair.text("s", 'h__read {"path": "x"}') == "contents of x"
    pair.healthy()
    pair.stop()


# 13: a long line is read in linear time, and bounded.


def test_a_50_mb_answer_reaches_the_model_capped(pairs) -> None:
    pair = pairs()
    text = pair.text("s", 'h__big {"size": 50000000}')
    assert text.startswith("bbbb") and len(text) <= CAP
    pair.healthy()
    pair.stop()


def test_an_answer_over_max_message_bytes_fails_that_call_clearly(pairs) -> None:
    pair = pairs(max_message_bytes=1024 * 1024)
    text = pair.text("s", 'h__big {"size": 2000000}')
    assert re.match(r"Error: the server's answer is 2,000,\d{3} bytes, ", text), text
    assert text.endswith("bytes, over mcp.h.max_message_bytes (1,048,576); it was dropped unread")
    assert pair.text("t", 'h__read {"path": "y"}') == "contents of y"  # the server lives on
    pair.healthy()
    pair.stop()


def test_a_100_mb_line_before_the_handshake_does_not_keep_the_server_down(pairs) -> None:
    with LogWatch() as log:
        pair = pairs("--line-first", "100000000")
        up(pair)
        log.wait_for(r"MCP server h: a line of its stdout was dropped \(100,000,000 bytes")
    assert pair.text("s", 'h__read {"path": "x"}') == "contents of x"
    pair.healthy()
    pair.stop()


# 14: arguments nested deep are denied at the door, and the session lives.


def test_arguments_nested_5000_deep_are_denied_and_the_session_lives(pairs) -> None:
    pair = pairs()
    deep = '{"path": ' + "[" * DEEP + "]" * DEEP + "}"
    assert pair.text("s", f"h__read {deep}") == (
        "Denied: the arguments are not valid for this tool: JSON nested deeper than 64 levels."
    )
    assert pair.text("s", 'h__read {"path": "z"}') == "contents of z"  # the same session
    pair.stop()


def test_an_answer_nested_5000_deep_fails_that_call_naming_why(pairs) -> None:
    pair = pairs()
    text = pair.text("s", "h__deep")
    assert text.startswith("Error: the server's answer is not JSON-RPC: "), text
    assert "recursion limit" in text
    assert pair.text("s", 'h__read {"path": "z"}') == "contents of z"
    pair.healthy()
    pair.stop()


# 16: a storm of tools/list_changed is coalesced.


def test_a_storm_of_list_changes_is_coalesced(pairs) -> None:
    pair = pairs()
    ups: list[McpServerUp] = []
    pair.rt.subscribe(lambda e: ups.append(e) if isinstance(e, McpServerUp) else None)
    assert pair.text("s", 'h__storm {"seconds": 3}').startswith("stormed ")
    assert pair.text("t", 'h__read {"path": "x"}') == "contents of x"
    assert ups == []  # listed again, nothing changed: no event (one each before)
    pair.healthy()
    pair.stop()


# 17: lines that are not JSON-RPC are counted and logged capped, with no traceback.


def test_junk_lines_on_stdout_are_logged_capped_without_tracebacks(pairs) -> None:
    with LogWatch("") as log:
        pair = pairs("--junk-first", "500")
        assert pair.text("s", 'h__junk {"lines": 3000}') == "junked"
        assert pair.text("t", 'h__read {"path": "x"}') == "contents of x"
        pair.healthy()
        pair.stop()
    dropped = [line for line in log.lines if "a line of its stdout was dropped" in line]
    assert 0 < len(dropped) <= JUNK_LINES_PER_MINUTE
    assert any("more lines of its stdout were dropped" in line for line in log.lines)
    assert not [line for line in log.lines if "Failed to parse JSONRPC" in line]


# 19: a server's own children end with it.


def test_a_servers_children_end_with_it(pairs) -> None:
    pair = pairs()
    child = int(pair.text("s", "h__child"))
    assert process_alive(child)
    pair.stop()
    assert not process_alive(child)


# 20: odd names.


def test_an_empty_name_is_skipped_and_a_duplicate_listed_once(pairs) -> None:
    pair = pairs("--odd-names")
    state = up(pair)
    assert state.tools.count("h__read") == 1
    assert "h__" not in state.tools
    assert '""' in state.skipped
    pair.stop()


# A call that never answers.


def test_a_call_that_never_answers_is_answered_at_timeout_s(pairs) -> None:
    pair = pairs()
    with LogWatch() as log:
        assert pair.text("s", "h__hang", timeout=2 * WAIT) == (
            f"Error: h__hang gave no answer within {WAIT:g} s"
        )
        log.wait_for("MCP server h: hang started")
    pair.healthy()
    pair.stop()


# 15: an HTTP server's error status is named.


class _Refusing(http.server.BaseHTTPRequestHandler):
    status = 500

    def do_POST(self) -> None:
        body = b"no"
        self.send_response(self.status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST
    do_DELETE = do_POST

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("status", "detail"),
    [
        (500, "the server answered HTTP 500 Internal Server Error"),
        (401, "the server refused its credentials (HTTP 401 Unauthorized; see headers_env)"),
        (403, "the server refused its credentials (HTTP 403 Forbidden; see headers_env)"),
    ],
)
def test_an_http_error_status_is_named(tmp_path, status: int, detail: str) -> None:
    handler = type("Handler", (_Refusing,), {"status": status})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/mcp"
    try:
        model = ScriptedModel(calls_what_it_is_told)
        web = McpServerConfig(url=url, timeout_s=WAIT)
        rt = Runtime.start(Config(home=str(tmp_path / "home")), model=model, mcp={"web": web})
        try:
            down = rt.mcp_servers()["web"]
            assert isinstance(down, McpServerDown) and down.detail == detail, down
        finally:
            rt.stop()
    finally:
        httpd.shutdown()
        httpd.server_close()


# A result's text can always be stored and sent.


def test_a_lone_surrogate_in_a_result_is_replaced() -> None:
    import mcp_types as types
    import msgspec

    from actors.tools.mcp import result_text

    # The SDK's JSON decoder refuses an escaped lone surrogate (the line is then dropped and
    # its call fails, naming why); a result built otherwise still never carries one on.
    result = types.CallToolResult(content=[types.TextContent(type="text", text="a\ud800b")])
    text = result_text(result, CAP)
    assert text == "a?b"
    msgspec.msgpack.encode(text)
