"""The pure parts of typed results (actors/core/output.py) and the turn machine's use of them,
driven without threads: schema normalisation, validation, the count of tries."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
import pytest

from actors.core.dispatch import Registry
from actors.core.limits import Limits
from actors.core.output import (
    ACCEPTED,
    Answer,
    FinalAnswer,
    Invalid,
    OutputRule,
    OutputTypes,
    SchemaError,
    final_answer_spec,
    output_fits,
    schema_of,
    with_output,
)
from actors.core.output_schema import MAX_SCHEMA_BYTES, MAX_SCHEMA_OBJECTS, schema_problem
from actors.core.session_state import SessionState
from actors.core.turn import Turn
from actors.core.turn_effects import Finish, Persist, RequestModel
from messages import (
    Baseline,
    FailReason,
    ModelAnswer,
    ProposedCall,
    TurnCompleted,
    TurnFailed,
)


class Item(msgspec.Struct):
    name: str


class Basket(msgspec.Struct):
    items: list[Item]
    note: str = ""


class Tree(msgspec.Struct):
    kids: list[Tree]


def test_a_struct_schema_has_its_top_level_ref_resolved_and_keeps_the_defs_it_needs() -> None:
    basket = final_answer_spec(schema_of(Basket)).parameters
    assert "$ref" not in basket and basket["type"] == "object"
    assert set(basket["$defs"]) == {"Item"}  # Basket itself is resolved, not kept
    tree = final_answer_spec(schema_of(Tree)).parameters
    assert set(tree["$defs"]) == {"Tree"}  # it refers to itself: kept
    draft7 = final_answer_spec(
        {"$ref": "#/definitions/A", "definitions": {"A": {"type": "object"}}}
    )
    assert draft7.parameters == {"type": "object"}


def test_a_schema_that_is_not_an_object_is_wrapped_and_answers_its_inner_value() -> None:
    spec = final_answer_spec({"type": "string", "enum": ["yes", "no"]})
    assert spec.parameters["required"] == ["value"]
    rule = OutputRule(spec)
    assert rule.validate('{"value": "yes"}').value == "yes"  # type: ignore[union-attr]
    assert isinstance(rule.validate('{"value": "maybe"}'), Invalid)
    assert isinstance(rule.validate('{"value": "yes", "more": 1}'), Invalid)
    typed = OutputRule(OutputTypes().register(int), int)
    assert typed.validate('{"value": 3}').text == "3"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "schema",
    [{"type": "nonsense"}, {"$ref": "http://example.com/s.json"}, {"$ref": "#/$defs/Nope"}, []],
)
def test_an_unusable_schema_is_refused(schema: Any) -> None:
    with pytest.raises(SchemaError):
        final_answer_spec(schema)


def test_a_struct_is_validated_by_msgspec_and_a_plain_schema_by_jsonschema() -> None:
    types = OutputTypes()
    spec = types.register(Basket)
    bad = '{"items": [{"name": 3}]}'
    by_msgspec = OutputRule(spec, types.kind(spec)).validate(bad)
    by_jsonschema = OutputRule(spec).validate(bad)
    assert by_msgspec == Invalid("Expected `str`, got `int` - at `$.items[0].name`")
    assert by_jsonschema == Invalid("3 is not of type 'string' - at `$.items[0].name`")
    assert OutputRule(spec).validate("not json") == Invalid("arguments must be a JSON object")


def test_output_fits_only_the_same_schema_or_none_asked() -> None:
    a, b = final_answer_spec(schema_of(Item)), final_answer_spec(schema_of(Basket))
    assert output_fits(None, a) and output_fits(None, None) and output_fits(a, a)
    assert not output_fits(a, b) and not output_fits(a, None)
    assert with_output(Baseline("s"), a).tools == (a,)


def _turn(spec: Any, *, max_steps: int = 16, retries: int = 2) -> Turn:
    state = SessionState("s", with_output(Baseline("sys"), spec), 0, [])
    limits = Limits(max_steps, 16_000, 2_000, 200_000, output_retries=retries)
    turn = Turn(
        state, Registry(), limits, itertools.count(1), lambda: datetime(2026, 1, 1, tzinfo=UTC)
    )
    turn.output = FinalAnswer(OutputRule(spec, None, retries))
    return turn


def _drive(turn: Turn, effects: list[Any], answers: list[ModelAnswer]) -> Any:
    """Answer every Persist and RequestModel until the turn finishes; the outcome."""
    answers = list(answers)
    while True:
        for effect in effects:
            if isinstance(effect, Finish):
                return effect.outcome
        persist = next((e for e in effects if isinstance(e, Persist)), None)
        if persist is not None:
            effects = turn.persisted(persist.request_id)
            continue
        ask = next(e for e in effects if isinstance(e, RequestModel))
        answer = answers.pop(0)
        effects = turn.model_answer(msgspec.structs.replace(answer, request_id=ask.request_id))


def _calls(*calls: tuple[str, str]) -> ModelAnswer:
    proposed = tuple(ProposedCall(name, args) for name, args in calls)
    return ModelAnswer("s", 0, None, proposed)


def test_a_valid_final_answer_at_the_step_limit_completes_and_call_tool_reaches_it() -> None:
    spec = final_answer_spec(schema_of(Item))
    turn = _turn(spec, max_steps=1)
    wrapped = '{"name": "final_answer", "arguments": {"name": "pear"}}'
    outcome = _drive(turn, turn.start("go"), [_calls(("clock", "{}"), ("call_tool", wrapped))])
    assert outcome == TurnCompleted("s", '{"name":"pear"}', output={"name": "pear"})
    results = [m.content for m in turn.state.transcript if m.role == "tool"]
    assert results[1] == ACCEPTED and results[0].startswith("Denied: ")  # clock at the limit


def test_calls_of_other_tools_are_no_try_and_the_tries_run_out_into_output_invalid() -> None:
    spec = final_answer_spec(schema_of(Item))
    turn = _turn(spec, retries=0)
    answers = [_calls(("clock", "{}")), _calls(("final_answer", '{"name": 1}'))]
    outcome = _drive(turn, turn.start("go"), answers)
    assert isinstance(outcome, TurnFailed) and outcome.reason is FailReason.OUTPUT_INVALID
    assert "1 try" in outcome.detail and "$.name" in outcome.detail


def test_a_child_answer_longer_than_the_cap_fails_at_once() -> None:
    spec = final_answer_spec(schema_of(Item))
    turn = _turn(spec)
    turn.state.parent = "p"
    turn.limits = Limits(16, 10, 2_000, 200_000)
    outcome = _drive(turn, turn.start("go"), [_calls(("final_answer", '{"name": "a long one"}'))])
    assert isinstance(outcome, TurnFailed) and outcome.reason is FailReason.OUTPUT_INVALID
    assert "loop.tool_result_cap (10)" in outcome.detail


def test_call_tool_reaches_final_answer_only_for_a_profile_that_may_use_call_tool() -> None:
    spec = final_answer_spec(schema_of(Item))
    turn = _turn(spec, retries=0)
    turn.registry = Registry().for_agent(["clock"])
    wrapped = '{"name": "final_answer", "arguments": {"name": "pear"}}'
    answers = [_calls(("call_tool", wrapped)), _calls(("final_answer", '{"name": "fig"}'))]
    outcome = _drive(turn, turn.start("go"), answers)
    assert outcome == TurnCompleted("s", '{"name":"fig"}', output={"name": "fig"})
    first_result = next(m for m in turn.state.transcript if m.role == "tool")
    assert first_result.content == "Denied: there is no tool with this name: call_tool."


# Hostile schemas and answers (issue 32, A6-A11): each refused naming what was wrong, quickly.

CATASTROPHIC = {
    "type": "object",
    "properties": {"a": {"type": "string", "pattern": "^(a+)+$"}},
    "patternProperties": {"^(b+)+$": {"type": "integer"}},
    "additionalProperties": False,
}


@pytest.mark.timeout(30)
def test_a_catastrophic_pattern_is_matched_without_backtracking() -> None:
    rule = OutputRule(final_answer_spec(CATASTROPHIC))
    denied = rule.validate('{"a": "' + "a" * 34 + '!"}')
    assert denied == Invalid(f"'{'a' * 34}!' does not match '^(a+)+$' - at `$.a`")
    assert rule.validate('{"a": "aaa"}') == Answer({"a": "aaa"}, '{"a":"aaa"}')
    key = "b" * 34 + "!"  # patternProperties and additionalProperties match keys with RE2
    assert isinstance(rule.validate(f'{{"{key}": 1}}'), Invalid)
    assert isinstance(rule.validate('{"bbb": 1}'), Answer)


class Patterned(msgspec.Struct):
    a: Annotated[str, msgspec.Meta(pattern="^(a+)+$")]


@pytest.mark.timeout(30)
def test_a_struct_with_a_catastrophic_pattern_is_screened_by_re2_before_msgspec() -> None:
    types = OutputTypes()
    spec = types.register(Patterned)
    rule = OutputRule(spec, types.kind(spec))
    assert isinstance(rule.validate('{"a": "' + "a" * 34 + '!"}'), Invalid)
    answer = rule.validate('{"a": "aa"}')
    assert isinstance(answer, Answer) and answer.value == {"a": "aa"}


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        (
            {"type": "object", "properties": {"a": {"type": "string", "pattern": "(a)\\1"}}},
            "the pattern '(a)\\\\1' at $.properties.a.pattern cannot be used: RE2",
        ),
        (
            {"type": "string", "pattern": "x(?=y)"},
            "the pattern 'x(?=y)' at $.pattern cannot be used",
        ),
        (
            {"type": "object", "patternProperties": {"(?<=a)b": {}}},
            "the pattern '(?<=a)b' at $.patternProperties cannot be used",
        ),
        (
            {"type": "object", "properties": {"p": {"type": "string", "format": "regex"}}},
            None,  # format: regex on a value is not a pattern of the schema: accepted
        ),
        (
            {"type": "string", "pattern": "\\z"},  # RE2's end of text, which Python's re lacks
            None,
        ),
    ],
)
def test_a_pattern_re2_cannot_run_is_refused_at_load_naming_it(
    schema: dict[str, Any], named: str | None
) -> None:
    if named is None:
        final_answer_spec(schema)
        return
    with pytest.raises(SchemaError) as refused:
        final_answer_spec(schema)
    assert named in str(refused.value)


def test_a_schema_past_the_size_limits_is_refused_naming_the_limit() -> None:
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(10_000)}}
    with pytest.raises(SchemaError, match=f"more than {MAX_SCHEMA_OBJECTS:,} JSON objects"):
        final_answer_spec(wide)
    big = {"type": "object", "description": "x" * MAX_SCHEMA_BYTES}
    with pytest.raises(SchemaError, match=f"at most {MAX_SCHEMA_BYTES:,} are taken"):
        final_answer_spec(big)
    at_limit = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string"} for i in range(MAX_SCHEMA_OBJECTS - 2)},
    }
    final_answer_spec(at_limit)


def test_each_distinct_schema_is_checked_once() -> None:
    schema = {"type": "object", "properties": {"once": {"type": "integer"}, "z": {}}}
    final_answer_spec(schema)
    before = schema_problem.cache_info()
    reordered = {"properties": {"z": {}, "once": {"type": "integer"}}, "type": "object"}
    final_answer_spec(reordered)  # equal JSON, keys in another order: the same check
    after = schema_problem.cache_info()
    assert (after.hits, after.misses) == (before.hits + 1, before.misses)


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        (
            {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}},
            "the $ref '#/$defs/a' refers back to itself without descending into the value "
            "(#/$defs/a -> #/$defs/a)",
        ),
        (
            {
                "$ref": "#/$defs/a",
                "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
            },
            "(#/$defs/a -> #/$defs/b -> #/$defs/a)",
        ),
        (
            {"type": "object", "allOf": [{"$ref": "#"}]},
            "the $ref '#' refers back to itself without descending into the value (# -> #)",
        ),
        (
            {"type": "object", "properties": {"x": {"$ref": "#/$defs/gone"}}},
            "the $ref '#/$defs/gone' at $.properties.x names nothing in the schema",
        ),
    ],
)
def test_a_ref_that_loops_or_names_nothing_is_refused_at_load(
    schema: dict[str, Any], named: str
) -> None:
    with pytest.raises(SchemaError) as refused:
        final_answer_spec(schema)
    assert named in str(refused.value)


def test_a_ref_that_descends_into_the_value_may_recurse() -> None:
    tree = final_answer_spec(schema_of(Tree))
    rule = OutputRule(tree)
    assert isinstance(rule.validate('{"kids": [{"kids": []}, {"kids": [{"kids": []}]}]}'), Answer)
    assert isinstance(rule.validate('{"kids": [{"kids": [1]}]}'), Invalid)


def test_a_schema_with_a_lone_surrogate_or_no_json_value_is_refused_naming_the_place() -> None:
    with pytest.raises(
        SchemaError, match=r"lone surrogate \(\\ud800\) in a string at \$\.description"
    ):
        final_answer_spec({"type": "object", "description": "bad \ud800"})
    with pytest.raises(SchemaError, match=r"not finite \(inf\) at \$\.maximum"):
        final_answer_spec({"type": "number", "maximum": float("inf")})
    with pytest.raises(SchemaError, match=r"outside the 64-bit range at \$\.maximum"):
        final_answer_spec({"type": "integer", "maximum": 2**70})


@pytest.mark.timeout(30)
@pytest.mark.parametrize("typed", [False, True], ids=["jsonschema", "msgspec"])
@pytest.mark.parametrize(
    ("arguments", "detail"),
    [
        ('{"name": ' * 100_000 + '"x"' + "}" * 100_000, "JSON nested deeper than 64 levels"),
        (
            '{"name": "x", "n": 1180591620717411303424}',
            "an integer outside the 64-bit range at $.n",
        ),
        ('{"name": 1e400}', "a number that is not finite (inf) at $.name"),
        ('{"name": "\\ud800"}', "a lone surrogate (\\ud800) in a string at $.name"),
        ('{"name": NaN}', "not valid JSON: NaN is not valid JSON"),
        ("not json", "arguments must be a JSON object"),
        ("[1]", "arguments must be a JSON object"),
    ],
)
def test_hostile_arguments_are_denied_naming_what_is_wrong(
    typed: bool, arguments: str, detail: str
) -> None:
    types = OutputTypes()
    spec = types.register(Item)
    rule = OutputRule(spec, types.kind(spec) if typed else None)
    assert rule.validate(arguments) == Invalid(detail)
