"""Tool dispatch (SPEC 4 and 5): every rule, directly and through ``call_tool``."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from actors.core.dispatch import (
    Answered,
    ArgumentError,
    Registry,
    SpawnChild,
    ToPort,
    child_id,
    dispatch,
)
from messages import DenyReason, ToolSpec, check_session_id, denial_message

NOW = datetime(2026, 11, 29, 23, 59, 1, tzinfo=UTC)
REGISTRY = Registry()
PORT_REGISTRY = Registry([ToolSpec("hostname", "d", {})])
KINDS = ["direct", "call_tool"]
ROUTES = (Answered, SpawnChild, ToPort)


def call_tool_text(name: str, args_text: str | None) -> str:
    """``call_tool`` arguments wrapping ``args_text``: parsed when it is JSON, else the raw text."""
    wrapper: dict[str, Any] = {"name": name}
    if args_text is not None:
        try:
            wrapper["arguments"] = json.loads(args_text)
        except ValueError:
            wrapper["arguments"] = args_text
    return json.dumps(wrapper)


def route(
    kind: str, name: str, args_text: str, registry: Registry = REGISTRY, now: datetime = NOW
) -> Any:
    """Dispatch one call of ``name`` either directly or wrapped in ``call_tool``."""
    if kind == "direct":
        return dispatch(registry, name, args_text, now)
    assert kind == "call_tool"
    return dispatch(registry, "call_tool", call_tool_text(name, args_text), now)


def invalid(detail: str) -> Answered:
    return Answered(denial_message(DenyReason.INVALID_ARGUMENTS, detail), denied=True)


# --- subagent arguments (SPEC 5, rules 1-4) -------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("args_text", "task"),
    [
        ('{"task": "look around"}', "look around"),
        ('{"task": ""}', ""),
        ('{"task": "line 1\\nline 2 \\u00e9 \\ud83d\\ude00"}', "line 1\nline 2 \u00e9 \U0001f600"),
        ('  {"task":"spaced"}  ', "spaced"),
    ],
)
def test_valid_task_spawns_a_child(kind: str, args_text: str, task: str) -> None:
    assert route(kind, "subagent", args_text) == SpawnChild(task)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "args_text",
    [
        pytest.param("", id="empty"),
        pytest.param("not json", id="not-json"),
        pytest.param('{"task": "t"', id="truncated"),
        pytest.param("{'task': 't'}", id="single-quotes"),
        pytest.param('["task", "t"]', id="array"),
        pytest.param("[]", id="empty-array"),
        pytest.param("5", id="number"),
        pytest.param('"task"', id="string"),
        pytest.param("null", id="null"),
        pytest.param("true", id="bool"),
    ],
)
def test_arguments_that_are_not_a_json_object_are_denied(kind: str, args_text: str) -> None:
    result = route(kind, "subagent", args_text)
    assert result == invalid("arguments must be a JSON object")
    assert result.text == (
        "Denied: the arguments are not valid for this tool: arguments must be a JSON object."
    )
    assert result.denied is True


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("args_text", "key"),
    [
        ('{"x": 1, "task": "t"}', "x"),
        ('{"task": "t", "y": 1}', "y"),
        ('{"y": 1, "x": 2}', "y"),
        ('{"Task": "t"}', "Task"),
        ('{"task": 5, "z": 1}', "z"),
        ('{"": "t"}', ""),
    ],
)
def test_the_first_unknown_key_in_order_is_denied(kind: str, args_text: str, key: str) -> None:
    result = route(kind, "subagent", args_text)
    assert result == invalid(f"unknown field: {key}")
    prefix = "Denied: the arguments are not valid for this tool: "
    assert result.text == f"{prefix}unknown field: {key}."
    assert result.denied is True


@pytest.mark.parametrize("kind", KINDS)
def test_missing_task_is_denied(kind: str) -> None:
    result = route(kind, "subagent", "{}")
    assert result == invalid("task is required")
    assert result.text == "Denied: the arguments are not valid for this tool: task is required."
    assert result.denied is True


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "args_text",
    ['{"task": 5}', '{"task": null}', '{"task": ["t"]}', '{"task": {"t": 1}}', '{"task": true}'],
)
def test_task_that_is_not_a_string_is_denied(kind: str, args_text: str) -> None:
    result = route(kind, "subagent", args_text)
    assert result == invalid("task must be a string")
    assert result.text == (
        "Denied: the arguments are not valid for this tool: task must be a string."
    )
    assert result.denied is True


def test_call_tool_without_arguments_checks_an_empty_object() -> None:
    assert dispatch(REGISTRY, "call_tool", '{"name": "subagent"}', NOW) == invalid(
        "task is required"
    )


def test_call_tool_with_arguments_already_encoded_as_text() -> None:
    text = json.dumps({"name": "subagent", "arguments": '{"task": "t"}'})
    assert dispatch(REGISTRY, "call_tool", text, NOW) == SpawnChild("t")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("args_text", "named"), [("\ud800", "\\ud800"), ('{"task": "\udc00"}', "\\udc00")]
)
def test_lone_surrogate_in_arguments_is_denied_not_raised(
    kind: str, args_text: str, named: str
) -> None:
    # A Python str can hold a lone surrogate (an in-process model can produce one); it is not
    # valid Unicode text, so it is denied naming the surrogate, not an exception out of the
    # session actor (nor "not a JSON object", which would be false).
    if kind == "call_tool":
        result = dispatch(REGISTRY, "call_tool", args_text, NOW)
    else:
        result = dispatch(REGISTRY, "subagent", args_text, NOW)
    assert result == invalid(f"not valid JSON: a lone surrogate ({named}) in the text")


# --- call_tool's own checks -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        pytest.param("not json", "arguments must be a JSON object", id="not-json"),
        pytest.param('["subagent"]', "arguments must be a JSON object", id="array"),
        pytest.param('"subagent"', "arguments must be a JSON object", id="string"),
        pytest.param("", "arguments must be a JSON object", id="empty"),
        pytest.param('{"arguments": {"task": "t"}}', "name is required", id="missing-name"),
        pytest.param('{"name": 5}', "name must be a string", id="name-number"),
        pytest.param('{"name": null}', "name must be a string", id="name-null"),
        pytest.param('{"name": ["subagent"]}', "name must be a string", id="name-list"),
        pytest.param(
            '{"name": "subagent", "arguments": {"task": "t"}, "why": 1}',
            "unknown field: why",
            id="unknown-field",
        ),
        pytest.param(
            '{"tool": "subagent", "name": "subagent"}', "unknown field: tool", id="unknown-first"
        ),
        pytest.param(
            '{"name": "call_tool", "arguments": {"name": "subagent", "arguments": {"task": "t"}}}',
            "call_tool cannot call call_tool",
            id="call-tool-itself",
        ),
    ],
)
def test_call_tool_denies_its_own_bad_arguments(text: str, detail: str) -> None:
    result = dispatch(REGISTRY, "call_tool", text, NOW)
    assert result == invalid(detail)
    assert result.denied is True


# --- clock ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_clock_answers_rfc3339_utc_seconds(kind: str) -> None:
    assert route(kind, "clock", "{}") == Answered("2026-11-29T23:59:01Z")


@pytest.mark.parametrize("kind", KINDS)
def test_clock_converts_a_non_utc_time(kind: str) -> None:
    plus_two = datetime(2026, 11, 30, 1, 59, 1, tzinfo=timezone(timedelta(hours=2)))
    minus_five = datetime(2026, 11, 29, 18, 59, 1, tzinfo=timezone(timedelta(hours=-5)))
    assert route(kind, "clock", "{}", now=plus_two) == Answered("2026-11-29T23:59:01Z")
    assert route(kind, "clock", "{}", now=minus_five) == Answered("2026-11-29T23:59:01Z")


@pytest.mark.parametrize("kind", KINDS)
def test_clock_drops_fractions_of_a_second(kind: str) -> None:
    now = datetime(2026, 11, 29, 23, 59, 1, 999_999, tzinfo=UTC)
    assert route(kind, "clock", "{}", now=now) == Answered("2026-11-29T23:59:01Z")


def test_clock_accepts_empty_arguments_directly() -> None:
    assert dispatch(REGISTRY, "clock", "", NOW) == Answered("2026-11-29T23:59:01Z")
    assert dispatch(REGISTRY, "call_tool", '{"name": "clock"}', NOW) == Answered(
        "2026-11-29T23:59:01Z"
    )


# --- unknown tools and the port -------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["hostname", "Clock", "sub agent", ""])
def test_unknown_tool_is_denied_naming_it(kind: str, name: str) -> None:
    result = route(kind, name, "{}")
    assert result == Answered(denial_message(DenyReason.UNKNOWN_TOOL, name), denied=True)
    assert result.denied is True
    if name:
        assert name in result.text


@pytest.mark.parametrize("kind", KINDS)
def test_port_tool_goes_to_the_port_with_its_arguments(kind: str) -> None:
    result = route(kind, "hostname", '{"fqdn": true, "n": [1, 2]}', registry=PORT_REGISTRY)
    assert isinstance(result, ToPort)
    assert result.name == "hostname"
    assert json.loads(result.arguments) == {"fqdn": True, "n": [1, 2]}


def test_port_tool_called_directly_gets_the_raw_text() -> None:
    raw = '{ "fqdn" : true }'
    assert dispatch(PORT_REGISTRY, "hostname", raw, NOW) == ToPort("hostname", raw)


def test_port_tool_through_call_tool_without_arguments_gets_an_empty_object() -> None:
    result = dispatch(PORT_REGISTRY, "call_tool", '{"name": "hostname"}', NOW)
    assert isinstance(result, ToPort)
    assert json.loads(result.arguments) == {}


def test_port_tools_do_not_take_over_subagent_or_clock() -> None:
    assert dispatch(PORT_REGISTRY, "subagent", '{"task": "t"}', NOW) == SpawnChild("t")
    assert dispatch(PORT_REGISTRY, "clock", "{}", NOW) == Answered("2026-11-29T23:59:01Z")


@pytest.mark.parametrize("name", ["clock", "subagent", "call_tool"])
def test_port_tool_named_like_a_builtin_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match=name):
        Registry([ToolSpec(name, "shadow", {})])


def test_port_tool_registered_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="hostname"):
        Registry([ToolSpec("hostname", "a", {}), ToolSpec("hostname", "b", {})])


# --- the registry as the model sees it ------------------------------------------------------


def test_registry_lists_subagent_with_its_exact_schema() -> None:
    specs = {spec.name: spec for spec in REGISTRY.specs()}
    assert specs["subagent"].parameters == {
        "type": "object",
        "properties": {
            "task": {"type": "string", "description": "Everything the child needs to know."}
        },
        "required": ["task"],
        "additionalProperties": False,
    }


def test_registry_lists_builtins_and_port_tools_once_each() -> None:
    names = [spec.name for spec in PORT_REGISTRY.specs()]
    assert sorted(names) == ["call_tool", "clock", "hostname", "remember", "subagent"]
    assert PORT_REGISTRY.specs() == PORT_REGISTRY.specs()  # stable, for a byte-stable baseline
    assert msgspec.json.encode(PORT_REGISTRY.specs())  # plain data, fit for a baseline


# --- child ids ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parent", "call_id", "child"),
    [
        ("mm-thread", 1, "sub-mm-thread-1"),
        ("sub-mm-thread-1", 1, "sub-sub-mm-thread-1-1"),
        ("mm-thread", 12, "sub-mm-thread-12"),
        ("a" * 58, 1, "sub-" + "a" * 58 + "-1"),
    ],
)
def test_child_id(parent: str, call_id: int, child: str) -> None:
    assert child_id(parent, call_id) == child
    assert check_session_id(child) == child


def test_child_id_that_fits_exactly_64_bytes() -> None:
    child = child_id("a" * 58, 1)
    assert len(child.encode()) == 64


def test_child_id_that_would_not_fit_is_refused_with_the_runbook_detail() -> None:
    raw = "sub-" + "a" * 59 + "-1"
    assert len(raw.encode()) == 65
    with pytest.raises(ArgumentError) as caught:
        child_id("a" * 59, 1)
    assert caught.value.detail == (
        f"child session id `{raw}` would not fit; see docs/runbook.md#subagent-id"
    )
    assert denial_message(DenyReason.INVALID_ARGUMENTS, caught.value.detail) == (
        "Denied: the arguments are not valid for this tool: "
        f"child session id `{raw}` would not fit; see docs/runbook.md#subagent-id."
    )


def test_child_id_grows_past_the_limit_with_a_larger_call_id() -> None:
    assert child_id("a" * 57, 99) == "sub-" + "a" * 57 + "-99"
    with pytest.raises(ArgumentError):
        child_id("a" * 57, 100)


# --- never raises ---------------------------------------------------------------------------

_JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
_JSON_VALUES = st.recursive(
    _JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)
_ARGUMENT_OBJECTS = st.dictionaries(
    st.one_of(st.just("task"), st.just("x"), st.text(max_size=6)), _JSON_VALUES, max_size=4
)
_TEXT = st.text(alphabet=st.characters(exclude_categories=()))
_ANY_ARGUMENTS = st.one_of(
    _TEXT,
    _JSON_VALUES.map(json.dumps),
    _ARGUMENT_OBJECTS.map(json.dumps),
    st.builds(
        lambda name, args: json.dumps({"name": name, "arguments": args}),
        st.sampled_from(["subagent", "clock", "call_tool", "hostname", "nope"]) | st.text(),
        _JSON_VALUES,
    ),
)


@given(_ANY_ARGUMENTS)
@example("")
@example("\ud800")
@example('{"name": "subagent", "arguments": "\\ud800"}')
@example('{"name": "clock", "arguments": 1e400}')
def test_dispatch_never_raises(text: str) -> None:
    for registry in (REGISTRY, PORT_REGISTRY):
        for name in ("subagent", "call_tool", "clock"):
            assert isinstance(dispatch(registry, name, text, NOW), ROUTES)


def expected_subagent_route(value: dict[str, Any]) -> Answered | SpawnChild:
    """SPEC 5's rules 2-4, written out independently of the module."""
    for key in value:
        if key != "task":
            return invalid(f"unknown field: {key}")
    if "task" not in value:
        return invalid("task is required")
    if not isinstance(value["task"], str):
        return invalid("task must be a string")
    return SpawnChild(value["task"])


@given(_ARGUMENT_OBJECTS)
def test_subagent_rules_hold_for_any_object_on_both_routes(value: dict[str, Any]) -> None:
    text = json.dumps(value)
    expected = expected_subagent_route(value)
    assert route("direct", "subagent", text) == expected
    assert route("call_tool", "subagent", text) == expected
