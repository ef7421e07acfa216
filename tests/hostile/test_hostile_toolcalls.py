"""Hostile tool-call arguments (issue 32, A14 and B1): whatever JSON text a model writes as the
arguments of a built-in tool (``clock``, ``remember``, ``subagent``), of ``call_tool``, or of a
port tool (typed or plain), the call is answered (a denial naming what was wrong, or a clean
result), the turn completes, and the same session runs a plain turn after it. A real runtime
and a real scripted model; nothing is mocked."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hostile_strategies import DEEP, hostile_json
from hypothesis import HealthCheck, given, settings

from actors import Config
from actors.runtime import Runtime
from actors.testing import call, reply
from actors.testing.model import ScriptedModel
from actors.tools.mcp import argument_check
from actors.tools.typed import port_tool
from messages import ModelRequest, TurnCompleted

WAIT = 20.0
DENIED = "Denied: the arguments are not valid for this tool: "
DEEP_ARGUMENTS = '{"text": ' + "[" * DEEP + "]" * DEEP + "}"


@port_tool
def echo(text: str) -> str:
    """Say ``text`` back."""
    return f"echo {len(text)}"


@port_tool("plain", "Counts its keys.", {"type": "object"})
def plain(arguments: dict[str, Any]) -> str:
    return f"{len(arguments)} keys"


TOOLS = ("clock", "remember", "subagent", "echo", "plain")


class Model:
    """A scripted model that answers ``hostile <n>`` with the n-th queued call, a tool result
    with ``done`` (keeping the result's text), a child's task with ``child done``, and any
    other text with ``plain``."""

    def __init__(self) -> None:
        self.calls: dict[str, tuple[str, str]] = {}
        self.results: dict[str, str] = {}
        self._lock = threading.Lock()

    def __call__(self, request: ModelRequest) -> Any:
        last = request.messages[-1]
        if last.role == "tool":
            with self._lock:
                self.results[request.session] = last.content or ""
            return reply("done")
        text = last.content or ""
        if text.startswith("hostile "):
            name, arguments = self.calls[text]
            return call(name, arguments)
        return reply("child done" if request.session.startswith("sub-") else "plain")


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[tuple[Runtime, Model]]:
    model = Model()
    config = Config(home=str(tmp_path / "home"))
    rt = Runtime.start(config, model=ScriptedModel(model), tools=[echo, plain])
    try:
        yield rt, model
    finally:
        rt.stop()


_sessions = itertools.count(1)


def one_call(rt: Runtime, model: Model, name: str, arguments: str) -> str:
    """Run a turn whose model calls ``name(arguments)``, then a plain turn on the same session;
    both complete. The call's result text."""
    session = f"h{next(_sessions)}"
    key = f"hostile {session}"
    model.calls[key] = (name, arguments)
    outcome = rt.run_turn(session, key, timeout=WAIT)
    assert isinstance(outcome, TurnCompleted), outcome
    assert outcome.content == "done"
    later = rt.run_turn(session, "and now?", timeout=WAIT)
    assert later == TurnCompleted(session=session, content="plain", usage=later.usage)
    return model.results[session]


def wrapped(name: str, arguments: str) -> tuple[str, str]:
    """The same call through ``call_tool``: the inner arguments as JSON text."""
    return "call_tool", json.dumps({"name": name, "arguments": arguments})


@pytest.mark.timeout(120)
@pytest.mark.parametrize("via_call_tool", [False, True])
@pytest.mark.parametrize("name", TOOLS)
def test_arguments_nested_5000_deep_are_denied_naming_the_bound(
    runtime: tuple[Runtime, Model], name: str, via_call_tool: bool
) -> None:
    rt, model = runtime
    target = wrapped(name, DEEP_ARGUMENTS) if via_call_tool else (name, DEEP_ARGUMENTS)
    text = one_call(rt, model, *target)
    assert text == DENIED + "JSON nested deeper than 64 levels."


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("arguments", "detail"),
    [
        ('{"task": "\\ud800"}', "a lone surrogate (\\ud800) in a string at $.task"),
        ('{"task": 36893488147419103232}', "an integer outside the 64-bit range at $.task"),
        ('{"task": 1e400}', "a number that is not finite (inf) at $.task"),
        ('{"task": NaN}', "arguments must be a JSON object"),
        ("[1]", "arguments must be a JSON object"),
        ("{", "arguments must be a JSON object"),
    ],
)
def test_a_subagent_call_refused_by_a_bound_names_it(
    runtime: tuple[Runtime, Model], arguments: str, detail: str
) -> None:
    rt, model = runtime
    assert one_call(rt, model, "subagent", arguments) == DENIED + detail + "."


def _answered(text: str) -> None:
    assert text, "no result text"
    if text.startswith("Denied"):
        assert text.startswith(DENIED), text
        assert len(text) > len(DENIED) + 1, text  # a detail names what was wrong
    text.encode("utf-8")  # valid Unicode: it was stored and sent


HOSTILE = settings(
    max_examples=10,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("via_call_tool", [False, True])
@pytest.mark.parametrize("name", TOOLS)
@HOSTILE
@given(arguments=hostile_json)
def test_hostile_arguments_are_answered_and_the_session_lives(
    runtime: tuple[Runtime, Model], name: str, via_call_tool: bool, arguments: str
) -> None:
    rt, model = runtime
    target = wrapped(name, arguments) if via_call_tool else (name, arguments)
    _answered(one_call(rt, model, *target))


@pytest.mark.timeout(30)
@given(arguments=hostile_json)
@settings(max_examples=60, deadline=None, database=None)
def test_an_mcp_tools_argument_check_answers_hostile_arguments(arguments: str) -> None:
    check: Callable[[str], str | None] = argument_check(
        {"type": "object", "properties": {"a": {"type": "integer"}}}
    )
    problem = check(arguments)
    assert problem is None or problem.strip()


def test_an_mcp_tools_argument_check_names_the_nesting_bound() -> None:
    check = argument_check({"type": "object"})
    assert check(DEEP_ARGUMENTS) == "JSON nested deeper than 64 levels"
