"""The ``subagent`` tool as the model sees it, and its arguments checked in the documented
order (actors/core/dispatch.py), pinned at the core: each refusal names what was wrong, and the
route carries the agent and the background flag the model asked for."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from actors.core.dispatch import (
    Answered,
    ArgumentError,
    Registry,
    SpawnChild,
    ToPort,
    dispatch,
    parse_subagent_arguments,
    parse_subagent_call,
    subagent_spec,
)
from messages import DenyReason, ToolSpec, denial_message

AGENTS = {"default": "", "coder": "writes code"}


def test_the_plain_spec_offers_task_alone() -> None:
    spec = subagent_spec({})
    assert spec.name == "subagent"
    assert set(spec.parameters["properties"]) == {"task"}


def test_with_agents_the_spec_offers_an_enum_of_them_described_one_per_line() -> None:
    spec = subagent_spec(AGENTS)
    agent = spec.parameters["properties"]["agent"]
    assert agent["type"] == "string"
    assert agent["enum"] == ["default", "coder"]
    assert agent["description"] == (
        "The agent that runs the task (default: default):\n- default\n- coder: writes code"
    )
    assert set(spec.parameters["properties"]) == {"task", "agent"}
    assert spec.description == subagent_spec({}).description


def test_with_background_the_spec_adds_the_boolean_and_keeps_the_rest() -> None:
    plain = subagent_spec({}, background=True)
    assert set(plain.parameters["properties"]) == {"task", "background"}
    assert plain.parameters["properties"]["background"]["type"] == "boolean"
    both = subagent_spec(AGENTS, background=True)
    assert set(both.parameters["properties"]) == {"task", "agent", "background"}
    assert both.name == "subagent"
    # The plain spec is not changed by building the others.
    assert set(subagent_spec({}).parameters["properties"]) == {"task"}


@pytest.mark.parametrize(
    ("arguments", "detail"),
    [
        ('{"task": "t", "x": 1}', "unknown field: x"),
        ("{}", "task is required"),
        ('{"task": 3}', "task must be a string"),
        ('{"task": "t", "agent": 3}', "agent must be a string"),
        ('{"task": "t", "agent": "nope"}', "unknown agent: nope"),
    ],
)
def test_subagent_arguments_with_agents_name_what_is_wrong(arguments: str, detail: str) -> None:
    with pytest.raises(ArgumentError) as caught:
        parse_subagent_arguments(arguments, AGENTS)
    assert caught.value.detail == detail
    with pytest.raises(ArgumentError) as caught:
        parse_subagent_call(arguments, AGENTS, background=True)
    assert caught.value.detail == detail


def test_subagent_arguments_route_to_the_named_agent_or_default() -> None:
    assert parse_subagent_arguments('{"task": "t", "agent": "coder"}', AGENTS) == ("t", "coder")
    assert parse_subagent_arguments('{"task": "t"}', AGENTS) == ("t", "default")
    assert parse_subagent_arguments('{"task": "t"}') == ("t", "default")
    with pytest.raises(ArgumentError, match="unknown field: agent"):
        parse_subagent_arguments('{"task": "t", "agent": "coder"}')


@pytest.mark.parametrize(
    ("arguments", "detail"),
    [
        ('{"task": "t", "agent": "coder"}', "unknown field: agent"),  # no agents: unknown
        ('{"task": "t", "x": 1}', "unknown field: x"),
        ('{"background": true}', "task is required"),
        ('{"task": 1, "background": true}', "task must be a string"),
        ('{"task": "t", "background": 1}', "background must be a boolean"),
        ('{"task": "t", "background": "yes"}', "background must be a boolean"),
    ],
)
def test_background_calls_name_what_is_wrong(arguments: str, detail: str) -> None:
    with pytest.raises(ArgumentError) as caught:
        parse_subagent_call(arguments, background=True)
    assert caught.value.detail == detail


def test_a_background_call_routes_its_flag_and_agent() -> None:
    assert parse_subagent_call('{"task": "t", "background": true}', background=True) == (
        SpawnChild("t", "default", True)
    )
    assert parse_subagent_call('{"task": "t"}', background=True) == SpawnChild("t", "default")
    got = parse_subagent_call(
        '{"task": "t", "agent": "coder", "background": true}', AGENTS, background=True
    )
    assert got == SpawnChild("t", "coder", True)
    got = parse_subagent_call('{"task": "t", "background": false}', AGENTS, background=True)
    assert got == SpawnChild("t", "default", False)
    # Without [subagents] background the key is unknown.
    with pytest.raises(ArgumentError, match="unknown field: background"):
        parse_subagent_call('{"task": "t", "background": true}')


def test_a_profile_view_lists_and_runs_only_its_allowed_tools() -> None:
    registry = Registry([ToolSpec("lookup", "a port tool", {})]).for_agent(["clock"])
    assert [spec.name for spec in registry.specs()] == ["clock"]
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert dispatch(registry, "clock", "{}", now) == Answered("2026-01-02T03:04:05Z")
    denied = dispatch(registry, "lookup", "{}", now)
    assert denied == Answered(denial_message(DenyReason.UNKNOWN_TOOL, "lookup"), denied=True)
    everything = Registry([ToolSpec("lookup", "a port tool", {})])
    assert dispatch(everything, "lookup", "{}", now) == ToPort("lookup", "{}")


def test_an_mcp_call_its_schema_refuses_is_denied_naming_why() -> None:
    from actors.core.mcp_tools import McpCatalog, McpTool

    catalog = McpCatalog(["files"])
    spec = ToolSpec("files__rm", "remove", {"type": "object"})
    catalog.publish("files", [McpTool("files", "rm", spec, lambda _a: "path is required")])
    route = dispatch(Registry([], catalog), "files__rm", "{}", datetime(2026, 12, 6, tzinfo=UTC))
    detail = "path is required"
    assert route == Answered(denial_message(DenyReason.INVALID_ARGUMENTS, detail), denied=True)
    assert route.text == "Denied: the arguments are not valid for this tool: path is required."


def test_arguments_with_a_lone_surrogate_are_named_not_called_not_an_object() -> None:
    from actors.core.dispatch import parse_json_object

    with pytest.raises(ArgumentError) as raised:
        parse_json_object('{"a": "\ud800"}')
    assert "lone surrogate" in raised.value.detail
    with pytest.raises(ArgumentError) as raised:
        parse_json_object("{not json")
    assert raised.value.detail == "arguments must be a JSON object"
