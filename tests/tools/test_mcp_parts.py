"""The parts of MCP support that need no server: config, names, result texts, stderr, events."""

from __future__ import annotations

import base64
import logging
import sys
from datetime import UTC, datetime

import msgspec
import pytest

from actors import Config
from actors.core.config import AgentConfig, ConfigError
from actors.core.dispatch import Answered, Registry, ToPort, dispatch
from actors.core.mcp_config import McpServerConfig
from actors.core.mcp_tools import McpCatalog, McpTool, joined_name
from actors.shells.render import render_event
from messages import McpServerDown, McpServerUp, RuntimeEvent, ToolSpec

mcp = pytest.importorskip("mcp")
types = pytest.importorskip("mcp_types")

from actors.tools.mcp import (  # noqa: E402
    STDERR_LINES_PER_MINUTE,
    StderrLines,
    argument_check,
    listing,
    result_text,
    server_env,
)

NOW = datetime(2026, 12, 1, tzinfo=UTC)


# Config.


def test_a_server_from_toml_takes_the_defaults() -> None:
    config = Config.from_toml('[mcp.files]\ncommand = ["python", "-m", "files_server"]\n')
    assert config.mcp["files"] == McpServerConfig(command=("python", "-m", "files_server"))
    server = config.mcp["files"]
    assert (server.trusted, server.timeout_s, server.tools, server.env) == (False, 60.0, None, {})


@pytest.mark.parametrize(
    ("toml", "error"),
    [
        ('[mcp.files]\ncommand = ["x"]\nbogus = 1', "unknown field `bogus`"),
        ('[mcp.files]\ncommand = "x"', "$.mcp[...].command"),
        ('[mcp.files]\ncommand = ["x"]\ntimeout_s = "soon"', "timeout_s"),
        ('[mcp.files]\ncommand = ["x"]\ntrusted = 1', "trusted"),
        ("[mcp.files]\n", "mcp.files: set command (stdio) or url"),
        ('[mcp.files]\ncommand = ["x"]\nurl = "http://h/mcp"', "exactly one of them"),
        ('[mcp.files]\nurl = "ftp://h"', "mcp.files.url 'ftp://h' is not an http"),
        ('[mcp.files]\ncommand = ["x"]\ntimeout_s = 0', "mcp.files.timeout_s must be"),
        ('[mcp.files]\ncommand = ["x"]\ntools = ["a", "a"]', "mcp.files.tools names a tool twice"),
        ('[mcp.files]\nurl = "http://h/mcp"\nenv = { A = "1" }', "mcp.files.env is for a command"),
        ('[mcp.files]\ncommand = ["x"]\nheaders_env = { A = "B" }', "mcp.files.headers_env is"),
        ('[mcp.a__b]\ncommand = ["x"]', "mcp.a__b: a server name may not hold __"),
        ('[mcp."a b"]\ncommand = ["x"]', "mcp.a b: a server name is 1 to 32"),
        (
            '[model]\napi_key_env = "MY_KEY"\n[mcp.f]\ncommand = ["x"]\nenv = { MY_KEY = "k" }',
            "mcp.f.env.MY_KEY: that variable holds one of loopd's API keys",
        ),
    ],
)
def test_a_wrong_table_is_refused_naming_the_key(toml: str, error: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Config.from_toml(toml)
    assert error in str(caught.value)


def test_a_table_built_in_python_is_checked_the_same_way() -> None:
    with pytest.raises(ConfigError, match=r"mcp\.files\.command: Expected `array | null`"):
        Config(mcp={"files": McpServerConfig(command="python")})  # type: ignore[arg-type]
    config = Config(mcp={"files": McpServerConfig(command=["python"], timeout_s=5)})  # type: ignore[arg-type]
    assert config.mcp["files"].command == ("python",)
    assert config.mcp["files"].timeout_s == 5.0


# Names and the registry.


def _tool(server: str, name: str, schema: dict | None = None) -> McpTool:
    schema = schema or {"type": "object", "properties": {"path": {"type": "string"}}}
    joined = joined_name(server, name)
    assert joined is not None
    return McpTool(server, name, ToolSpec(joined, f"{name} tool", schema), argument_check(schema))


def test_joined_names_are_checked() -> None:
    assert joined_name("files", "read") == "files__read"
    assert joined_name("files", "read.all") is None
    assert joined_name("files", "x" * 58) is None  # 65 characters


def test_profiles_name_mcp_tools_by_name_or_by_server() -> None:
    catalog = McpCatalog(["files", "web"])
    registry = Registry(mcp=catalog)
    reader = registry.for_agent(["clock", "files__read"])
    anything = registry.for_agent(["files__*"])
    with pytest.raises(ValueError, match="no such tool: nope__read"):
        registry.for_agent(["nope__read"])
    assert [s.name for s in reader.specs()] == ["clock"]  # nothing listed yet
    catalog.publish("files", [_tool("files", "read"), _tool("files", "search")])
    catalog.publish("web", [_tool("web", "fetch")])
    assert [s.name for s in reader.specs()] == ["clock", "files__read"]
    assert [s.name for s in anything.specs()] == ["files__read", "files__search"]
    assert "web__fetch" in [s.name for s in registry.specs()]
    assert registry.is_mcp("files__anything") and not registry.is_mcp("clock")


def test_a_port_tool_may_not_take_an_mcp_servers_name() -> None:
    with pytest.raises(ValueError, match="is an MCP server's"):
        Registry([ToolSpec("files__read", "")], mcp=McpCatalog(["files"]))


def test_dispatch_checks_the_arguments_against_the_input_schema() -> None:
    catalog = McpCatalog(["files"])
    catalog.publish("files", [_tool("files", "read")])
    registry = Registry(mcp=catalog)
    assert dispatch(registry, "files__read", '{"path": "a"}', NOW) == ToPort(
        "files__read", '{"path": "a"}'
    )
    assert dispatch(registry, "files__read", '{"path": 1}', NOW) == Answered(
        "Denied: the arguments are not valid for this tool: path: 1 is not of type 'string'.",
        denied=True,
    )
    assert dispatch(registry, "files__write", "{}", NOW) == Answered(
        "Denied: there is no tool with this name: files__write.", denied=True
    )


def test_a_republished_list_that_did_not_change_keeps_the_generation() -> None:
    catalog = McpCatalog(["files"])
    assert catalog.publish("files", [_tool("files", "read")])
    generation = catalog.generation
    assert not catalog.publish("files", [_tool("files", "read")])
    assert catalog.generation == generation


def test_listing_leaves_out_bad_names_and_schemas_and_keeps_the_allow_list() -> None:
    tools = [
        types.Tool(name="read", description="Read.", input_schema={"type": "object"}),
        types.Tool(name="r" * 70, input_schema={"type": "object"}),
        types.Tool(name="odd", input_schema={"type": "object", "properties": 3}),
        types.Tool(name="hidden", input_schema={"type": "object"}),
    ]
    found = listing("files", tools, ["read", "r" * 70, "odd"])
    assert [t.spec.name for t in found.tools] == ["files__read"]
    assert found.tools[0].spec.description == "Read."
    assert found.skipped == ("r" * 70, "odd")


# Results.


def test_result_texts() -> None:
    png = base64.b64encode(bytes(12345)).decode()
    result = types.CallToolResult(
        content=[
            types.TextContent(text="one"),
            types.ImageContent(data=png, mime_type="image/png"),
            types.TextContent(text="two"),
        ]
    )
    assert result_text(result, 1000) == "one\n[image/png, 12345 bytes]\ntwo"
    error = types.CallToolResult(content=[types.TextContent(text="no such file")], is_error=True)
    assert result_text(error, 1000) == "Error: no such file"
    assert result_text(types.CallToolResult(content=[types.TextContent(text="x" * 50)]), 10) == (
        "x" * 10
    )
    structured = types.CallToolResult(content=[], structured_content={"n": 1})
    assert result_text(structured, 100) == '{"n":1}'


# The environment and stderr.


def test_a_stdio_servers_environment_never_holds_the_api_keys(monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/bin")
    env = server_env(McpServerConfig(command=("x",), env={"ROOT": "/srv"}), ["PATH"])
    assert env["ROOT"] == "/srv" and "PATH" not in env


def test_stderr_is_logged_a_line_at_a_time_capped(caplog) -> None:
    now = [0.0]
    lines = StderrLines("files", clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="actors.mcp"):
        lines.feed(b"one\ntw")
        lines.feed(b"o\n" + b"y" * 5000 + b"\n")
        for i in range(STDERR_LINES_PER_MINUTE + 5):
            lines.feed(f"flood {i}\n".encode())
        now[0] = 61.0
        lines.feed(b"later\n")
        lines.close()
    messages = [r.getMessage() for r in caplog.records]
    assert messages[:2] == ["MCP server files: one", "MCP server files: two"]
    assert len(messages[2]) == len("MCP server files: ") + 1000
    assert "MCP server files: 8 stderr lines not logged (more than 100 a minute)" in messages
    assert messages[-1] == "MCP server files: later"


# Events.


@pytest.mark.parametrize(
    "event",
    [
        McpServerUp(server="files", tools=("files__read",), skipped=("r" * 70,)),
        McpServerDown(server="files", detail="its process exited"),
    ],
)
def test_server_events_round_trip(event: McpServerUp | McpServerDown) -> None:
    for codec in (msgspec.json, msgspec.msgpack):
        assert codec.decode(codec.encode(event), type=RuntimeEvent) == event
    assert not hasattr(event, "session")
    assert render_event(event).split(" ", 1)[1].startswith("mcp files  ")


def test_agent_tools_may_name_mcp_tools_in_the_config() -> None:
    config = Config(
        agents={"reader": AgentConfig(tools=("files__read", "files__*"))},
        mcp={"files": McpServerConfig(command=("x",))},
    )
    assert config.agents["reader"].tools == ("files__read", "files__*")


def test_a_runtime_without_the_mcp_package_says_how_to_install_it(tmp_path, monkeypatch) -> None:
    from actors import Runtime
    from actors.testing import ScriptedModel

    monkeypatch.setitem(sys.modules, "actors.services.mcp", None)  # as if mcp were missing
    config = Config(home=str(tmp_path / "home"), mcp={"files": McpServerConfig(command=("x",))})
    with pytest.raises(ConfigError, match=r"install loopd with pip install '\.\[mcp\]'"):
        Runtime.start(config, model=ScriptedModel([]))
    # Nothing is left behind: the home can be taken again.
    Runtime.start(Config(home=str(tmp_path / "home")), model=ScriptedModel([])).stop()


def test_a_cluster_runtime_refuses_mcp_servers(tmp_path) -> None:
    from actors import Runtime

    config = Config(
        home=str(tmp_path / "home"),
        store={"url": "postgresql://loopd@127.0.0.1:1/loopd"},  # type: ignore[arg-type]
        cluster={"engine": "ray"},  # type: ignore[arg-type]
        mcp={"files": McpServerConfig(command=("x",))},
    )
    with pytest.raises(ValueError, match=r"\[mcp\] servers run in one process"):
        Runtime.start(config)
