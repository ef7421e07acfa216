"""Typed results against hostile input: a model's ``final_answer`` arguments and the output
schemas a program or a config gives. Every hostile answer is denied ``INVALID_ARGUMENTS``
naming what was wrong and the model tries again; every hostile schema is refused at load naming
the fault. After each case the runtime answers another session's plain turn, and the typed
session runs again."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hostile_strategies import DEEP, hostile_json
from hypothesis import HealthCheck, given, settings

from actors import ConfigError, Runtime
from actors.core.config import AgentConfig
from actors.core.output_schema import MAX_SCHEMA_BYTES, MAX_SCHEMA_OBJECTS
from actors.testing import ScriptedModel, call, reply
from messages import ModelRequest, TurnCompleted

pytestmark = pytest.mark.timeout(300)

WAIT = 30.0
DENIED = "Denied: the arguments are not valid for this tool: "
OK = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
CATASTROPHIC = {
    "type": "object",
    "properties": {"a": {"type": "string", "pattern": "^(a+)+$"}},
    "required": ["a"],
}


class Hostile:
    """A scripted model whose typed sessions first call ``final_answer`` with ``arguments``,
    then (after the denial) with ``answer``; a session named ``plain...`` answers in text."""

    def __init__(self) -> None:
        self.arguments = "{}"
        self.answer = '{"ok": true}'
        self.model = ScriptedModel(self._script)

    def _script(self, request: ModelRequest) -> Any:
        if request.session.startswith("plain"):
            return reply("plain answer")
        if request.messages[-1].role == "user":
            return call("final_answer", self.arguments)
        return call("final_answer", self.answer)

    def denial(self, session: str) -> str:
        """The tool text the model got for its first call in ``session``."""
        answered = [
            r.messages[-1].content
            for r in self.model.requests
            if r.session == session and r.messages[-1].role == "tool"
        ]
        assert answered, f"no tool result reached the model in session {session}"
        return answered[0]


def still_usable(rt: Runtime, session: str, n: int, output: Any = None) -> None:
    """Another session's plain turn answers, and ``session`` runs again."""
    plain = rt.run_turn(f"plain{n}", "hello", timeout=WAIT)
    assert isinstance(plain, TurnCompleted) and plain.content == "plain answer"
    again = rt.run_turn(session, "again", timeout=WAIT, output=output)
    assert isinstance(again, TurnCompleted), again


@pytest.fixture(scope="module")
def hostile_runtime(tmp_path_factory: pytest.TempPathFactory):
    from actors import Config

    hostile = Hostile()
    home = tmp_path_factory.mktemp("hostile-output") / "home"
    rt = Runtime.start(Config(home=str(home)), model=hostile.model)
    yield rt, hostile
    rt.stop(timeout=30)


counter = iter(range(1_000_000))


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(hostile_json)
def test_hostile_final_answer_arguments_are_denied_by_name_and_tried_again(
    hostile_runtime: Any, text: str
) -> None:
    rt, hostile = hostile_runtime
    n = next(counter)
    hostile.arguments = text
    session = f"t{n}"
    outcome = rt.run_turn(session, "answer", timeout=WAIT, output=OK)
    assert isinstance(outcome, TurnCompleted), outcome
    assert outcome.output == {"ok": True}
    denial = hostile.denial(session)
    assert denial.startswith(DENIED) and "\n" not in denial
    still_usable(rt, session, n)


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ('{"a": ' * 100_000 + "1" + "}" * 100_000, "nested deeper than 64 levels"),
        ("[" * 100_000, "nested deeper than 64 levels"),
        ('{"a": 1180591620717411303424}', "an integer outside the 64-bit range at $.a"),
        ('{"a": 1e400}', "a number that is not finite (inf) at $.a"),
        ('{"a": "\\ud800"}', "a lone surrogate (\\ud800) in a string at $.a"),
        ('{"a": NaN}', "NaN is not valid JSON"),
        ('{"a": "' + "a" * 34 + '!"}', "does not match '^(a+)+$' - at `$.a`"),
        ('{"a": "' + "a" * 100_000 + '!"}', "does not match '^(a+)+$' - at `$.a`"),
    ],
)
def test_each_hostile_answer_is_named_in_the_denial(
    hostile_runtime: Any, arguments: str, named: str
) -> None:
    rt, hostile = hostile_runtime
    n = next(counter)
    session = f"named{n}"
    hostile.arguments, hostile.answer = arguments, '{"a": "aaa"}'
    try:
        outcome = rt.run_turn(session, "answer", timeout=WAIT, output=CATASTROPHIC)
    finally:
        hostile.answer = '{"ok": true}'
    assert isinstance(outcome, TurnCompleted), outcome
    assert outcome.output == {"a": "aaa"}
    denial = hostile.denial(session)
    assert denial.startswith(DENIED) and named in denial, denial
    hostile.arguments = '{"a": "aa"}'
    still_usable(rt, session, n, output=CATASTROPHIC)


def _deep_schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


HOSTILE_SCHEMAS: list[tuple[str, Any, str]] = [
    (
        "backreference",
        {"type": "object", "properties": {"a": {"type": "string", "pattern": "(a)\\1"}}},
        "the pattern '(a)\\\\1' at $.properties.a.pattern cannot be used: RE2",
    ),
    (
        "lookahead",
        {"type": "object", "patternProperties": {"^(?!x)": {}}},
        "the pattern '^(?!x)' at $.patternProperties cannot be used: RE2",
    ),
    (
        "a to a",
        {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}},
        "the $ref '#/$defs/a' refers back to itself",
    ),
    (
        "a to b to a",
        {
            "type": "object",
            "properties": {"v": {"$ref": "#/$defs/a"}},
            "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}},
        },
        "(#/$defs/a -> #/$defs/b -> #/$defs/a)",
    ),
    (
        "ref to nothing",
        {"type": "object", "properties": {"v": {"$ref": "#/$defs/none"}}},
        "the $ref '#/$defs/none' at $.properties.v names nothing in the schema",
    ),
    (
        "lone surrogate",
        {"type": "object", "description": "bad \ud800 text"},
        "a lone surrogate (\\ud800) in a string at $.description",
    ),
    (
        "10,000 properties",
        {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(10_000)}},
        f"more than {MAX_SCHEMA_OBJECTS:,} JSON objects",
    ),
    (
        "huge",
        {"type": "object", "description": "x" * (MAX_SCHEMA_BYTES + 1)},
        f"at most {MAX_SCHEMA_BYTES:,} are taken",
    ),
    ("deep", _deep_schema(DEEP), "nested deeper than 64 levels"),
    ("past int64", {"type": "integer", "maximum": 2**70}, "outside the 64-bit range"),
    ("nan", {"type": "number", "maximum": math.nan}, "not finite (nan) at $.maximum"),
]


@pytest.mark.parametrize(
    ("schema", "named"),
    [(s, n) for _, s, n in HOSTILE_SCHEMAS],
    ids=[i for i, _, _ in HOSTILE_SCHEMAS],
)
def test_a_hostile_output_schema_is_refused_by_name_at_run_turn(
    hostile_runtime: Any, schema: Any, named: str
) -> None:
    rt, hostile = hostile_runtime
    n = next(counter)
    session = f"schema{n}"
    with pytest.raises(ValueError) as refused:
        rt.run_turn(session, "answer", timeout=WAIT, output=schema)
    assert named in str(refused.value)
    hostile.arguments = '{"ok": true}'
    still_usable(rt, session, n, output=OK)  # nothing was stored: the session is new


@pytest.mark.parametrize(
    ("schema", "named"),
    [(s, n) for i, s, n in HOSTILE_SCHEMAS if i not in ("lone surrogate", "nan", "deep")]
    + [('{"type": "object", "description": "\\ud800"}', "lone surrogate (\\ud800)")]
    + [("[" * DEEP, "nested deeper than 64 levels"), ("{", "not valid JSON")],
)
def test_a_hostile_output_schema_file_is_refused_at_start_naming_the_key(
    tmp_path: Path, schema: Any, named: str
) -> None:
    from actors import Config

    home = tmp_path / "home"
    home.mkdir()
    text = schema if isinstance(schema, str) else msgspec.json.encode(schema).decode()
    (home / "schema.json").write_text(text)
    config = Config(home=str(home), agents={"t": AgentConfig(output_schema_file="schema.json")})
    with pytest.raises(ConfigError) as refused:
        Runtime.start(config, model=ScriptedModel([]))
    message = str(refused.value)
    assert message.startswith("agents.t.output_schema_file: ") and named in message, message
