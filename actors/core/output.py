"""Typed results: a session that ends its turn by calling ``final_answer`` (no I/O).

A typed session is one whose baseline lists the tool ``final_answer``: its parameters are the
session's output schema, so the schema is stored with the session and fixed for its life, like
the rest of its tool list. This module holds what the turn machine and the Context need of it:

- :func:`final_answer_spec` turns a JSON schema (or a Python type, through
  :func:`schema_of`) into that tool: a top-level ``$ref`` resolved, a schema that is not an
  object wrapped as the one property ``value``;
- :func:`output_spec` and :func:`with_output` read and add the tool in a baseline;
- :class:`OutputRule` validates a call's arguments, with msgspec when a Python type is known
  for the schema (:class:`OutputTypes`), else with the ``jsonschema`` package;
- :class:`FinalAnswer` is one turn's count of failed tries and what ends the turn next.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from actors.core.bounded import OutOfBounds, check_value, decode_json
from actors.core.dispatch import CALL_TOOL, ArgumentError, unwrap_call_tool
from actors.core.output_schema import (
    MAX_SCHEMA_BYTES,
    SchemaError,
    answer_validator,
    resolve_top_ref,
    schema_problem,
)
from messages import (
    Baseline,
    DenyReason,
    FailReason,
    ToolSpec,
    TurnCompleted,
    TurnFailed,
    TurnOutcome,
    denial_message,
)

__all__ = [
    "ACCEPTED",
    "ANSWER_BY_CALLING",
    "FINAL_ANSWER",
    "NOT_AN_OBJECT",
    "RUNBOOK_OUTPUT_INVALID",
    "Answer",
    "Done",
    "Fail",
    "FinalAnswer",
    "Invalid",
    "OutputRule",
    "OutputTypes",
    "SchemaError",
    "decoded",
    "final_answer_spec",
    "is_wrapped",
    "outcome_of",
    "output_fits",
    "output_spec",
    "schema_of",
    "turn_output",
    "with_output",
    "wrong_output_detail",
]

FINAL_ANSWER = "final_answer"
ANSWER_BY_CALLING = "Answer by calling final_answer."
"""The user message that answers a text answer of a typed session (a failed try)."""
ACCEPTED = "Answer accepted."
"""The tool text of a valid ``final_answer`` call, so the stored transcript stays valid."""
RUNBOOK_OUTPUT_INVALID = "see docs/runbook.md#output_invalid"
NOT_AN_OBJECT = "arguments must be a JSON object"
"""The detail of arguments that do not parse as JSON, or are not an object."""

_OBJECT_DESCRIPTION = (
    "Give your final answer and end your turn: call this once, with the answer as the "
    "arguments. Do not answer in text."
)
_WRAPPED_DESCRIPTION = (
    "Give your final answer and end your turn: call this once, with the answer as `value`. "
    "Do not answer in text."
)


def schema_of(kind: Any) -> dict[str, Any]:
    """The JSON schema of a Python type as msgspec writes it (``msgspec.json.schema``)."""
    try:
        schema: dict[str, Any] = msgspec.json.schema(kind)
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"no JSON schema for {kind!r}: {exc}") from None
    return schema


def final_answer_spec(schema: Mapping[str, Any]) -> ToolSpec:
    """The ``final_answer`` tool of an output ``schema`` (a JSON schema as a mapping).

    A top-level ``$ref`` is resolved; a schema whose ``type`` is not ``"object"`` is wrapped
    as the one required property ``value``. Raises :class:`SchemaError` naming the fault for
    a schema that is not JSON (a lone surrogate, say), is over the size limits of
    :mod:`actors.core.output_schema`, has a pattern RE2 cannot run or a ``$ref`` that names
    nothing or loops, or that the JSON-schema metaschema refuses.
    """
    if not isinstance(schema, Mapping):
        raise SchemaError(f"an output schema is a JSON object, not {type(schema).__name__}")
    try:  # plain JSON data only (what goes into a stored baseline), bounded
        check_value(dict(schema))
    except OutOfBounds as exc:
        raise SchemaError(f"the output schema: {exc.detail}") from None
    text = msgspec.json.encode(dict(schema))
    if len(text) > MAX_SCHEMA_BYTES:
        raise SchemaError(
            f"the output schema is {len(text):,} bytes of JSON; at most {MAX_SCHEMA_BYTES:,} "
            "are taken (the limit on an output schema's size)"
        )
    plain: dict[str, Any] = msgspec.json.decode(text)
    # Checked once per distinct schema: its canonical text (keys sorted) keys the verdict.
    problem = schema_problem(msgspec.json.encode(plain, order="sorted"))
    if problem is not None:
        raise SchemaError(problem)
    resolved = resolve_top_ref(plain)
    if resolved.get("type") == "object":
        return ToolSpec(FINAL_ANSWER, _OBJECT_DESCRIPTION, resolved)
    defs: dict[str, Any] = {k: resolved.pop(k) for k in ("$defs", "definitions") if k in resolved}
    wrapped: dict[str, Any] = {
        "type": "object",
        "properties": {"value": resolved},
        "required": ["value"],
        "additionalProperties": False,
        **defs,
    }
    return ToolSpec(FINAL_ANSWER, _WRAPPED_DESCRIPTION, wrapped)


def is_wrapped(spec: ToolSpec) -> bool:
    """True if ``spec`` wraps a schema that is not an object as the property ``value``."""
    return spec.description == _WRAPPED_DESCRIPTION


def output_spec(baseline: Baseline) -> ToolSpec | None:
    """The ``final_answer`` tool of a stored baseline: its output schema; None if untyped."""
    for spec in baseline.tools:
        if spec.name == FINAL_ANSWER:
            return spec
    return None


def output_fits(asked: ToolSpec | None, stored: ToolSpec | None) -> bool:
    """Whether a turn that asks for output ``asked`` may run a session stored with ``stored``:
    one that asks for none keeps the session's; otherwise the two schemas are equal JSON."""
    return asked is None or asked == stored


def wrong_output_detail(session: str) -> str:
    """The detail of a turn refused ``WRONG_OUTPUT`` (``run_turn`` raises it as ValueError)."""
    return (
        f"session {session} was created with another output schema, or none: a stored "
        "session keeps the schema it was created with (use a new session id)"
    )


def with_output(baseline: Baseline, spec: ToolSpec | None) -> Baseline:
    """``baseline`` with ``spec`` (a ``final_answer`` tool) last in its tools; unchanged for
    None."""
    if spec is None:
        return baseline
    tools = tuple(t for t in baseline.tools if t.name != FINAL_ANSWER)
    return Baseline(baseline.system, (*tools, spec))


def _path(parts: Any) -> str:
    text = "$"
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


@dataclass(frozen=True)
class Answer:
    """A valid final answer: ``value`` as plain JSON data, and ``text``, its JSON text."""

    value: Any
    text: str


@dataclass(frozen=True)
class Invalid:
    """Arguments that are not a valid answer; ``detail`` names the field."""

    detail: str


class OutputRule:
    """How one session's ``final_answer`` calls are checked: its ``spec``, and the Python type
    ``kind`` when one is known for it (msgspec decodes with it), else a ``jsonschema``
    validator of the spec's parameters whose patterns match with RE2. Arguments pass the
    bounded decode first (size, nesting, int64, finite numbers, valid Unicode)."""

    def __init__(self, spec: ToolSpec, kind: Any = None, retries: int = 2) -> None:
        self.spec = spec
        self.kind = kind
        self.retries = retries
        self.wrapped = is_wrapped(spec)
        self._decode_as: Any = None
        self._validator: Any = None
        if kind is not None:
            self._decode_as = (
                msgspec.defstruct("FinalAnswer", [("value", kind)], forbid_unknown_fields=True)
                if self.wrapped
                else kind
            )
        if kind is None or b'"pattern"' in msgspec.json.encode(spec.parameters):
            # msgspec matches a pattern with Python's re, which can backtrack for ever: RE2
            # checks the answer first, so msgspec only ever sees a text that matches.
            self._validator = answer_validator(spec.parameters)

    def validate(self, arguments: str) -> Answer | Invalid:
        """Check a call's raw arguments; the answer's value is the inner one when wrapped."""
        try:
            data = decode_json(arguments)
        except OutOfBounds as exc:
            # Text that does not parse is answered as for any tool; a bound broken (nesting,
            # int64, 1e400, a lone surrogate, NaN) is named.
            unparsed = isinstance(exc.__context__, json.JSONDecodeError)
            return Invalid(NOT_AN_OBJECT if unparsed else exc.detail)
        if not isinstance(data, dict):
            return Invalid(NOT_AN_OBJECT)
        if self._validator is not None:
            fault = self._fault(data)
            if fault is not None:
                return Invalid(fault)
        if self._decode_as is not None:
            try:
                decoded = msgspec.json.decode(arguments, type=self._decode_as)
            except msgspec.ValidationError as exc:
                return Invalid(str(exc))
            except msgspec.DecodeError as exc:  # the bounded decode took it: not expected
                return Invalid(f"not valid JSON: {exc}")
            if self.wrapped:
                decoded = decoded.value
            value = msgspec.to_builtins(decoded)
        else:
            value = data["value"] if self.wrapped else data
        return Answer(value, msgspec.json.encode(value).decode())

    def _fault(self, data: dict[str, Any]) -> str | None:
        import jsonschema

        try:
            error = jsonschema.exceptions.best_match(self._validator.iter_errors(data))
        except Exception as exc:
            # Only a schema stored before loopd refused such schemas at load: a $ref that
            # loops (RecursionError) or names nothing (referencing's Unresolvable).
            return f"the output schema cannot check this answer: {type(exc).__name__}"
        if error is None:
            return None
        where = _path(error.absolute_path)
        return error.message if where == "$" else f"{error.message} - at `{where}`"


class OutputTypes:
    """The Python types the runtime knows for output schemas (``AgentConfig(output=...)``,
    ``run_turn(output=...)``), by their ``final_answer`` tool, so a session of that schema is
    validated and decoded by msgspec. One table per runtime; entries are only ever added (a
    dict item set is atomic, so the facade's thread and the sessions' may share it)."""

    def __init__(self) -> None:
        self._types: dict[bytes, Any] = {}
        self._rules: dict[tuple[bytes, int], OutputRule] = {}

    def register(self, kind: Any) -> ToolSpec:
        """The ``final_answer`` tool of type ``kind``, remembered for :meth:`kind`."""
        spec = final_answer_spec(schema_of(kind))
        self._types.setdefault(msgspec.json.encode(spec), kind)
        return spec

    def kind(self, spec: ToolSpec) -> Any:
        """The type registered for ``spec``, or None."""
        return self._types.get(msgspec.json.encode(spec))

    def rule(self, baseline: Baseline, retries: int) -> OutputRule | None:
        """The rule of a session with ``baseline``; None for an untyped session."""
        spec = output_spec(baseline)
        if spec is None:
            return None
        key = (msgspec.json.encode(spec), retries)
        rule = self._rules.get(key)
        if rule is None or rule.kind is not self._types.get(key[0]):
            # Built once per schema (a validator checks its schema when built).
            rule = self._rules[key] = OutputRule(spec, self._types.get(key[0]), retries)
        return rule


@dataclass(frozen=True)
class Done:
    """The answer is valid: the turn completes with it."""

    answer: Answer


@dataclass(frozen=True)
class Fail:
    """The last try failed: the turn fails ``OUTPUT_INVALID`` with ``detail``."""

    detail: str


@dataclass
class FinalAnswer:
    """One typed turn's tries. Each model answer that ends without a valid ``final_answer``
    (a text answer, or calls of it that are all invalid) is a failed try; ``rule.retries``
    more tries follow the first."""

    rule: OutputRule
    failed: int = 0
    _answer: Answer | None = None
    _tried: bool = False
    _last: str = ""

    def inner_arguments(self, name: str, arguments: str, *, call_tool: bool = True) -> str | None:
        """The arguments of a ``final_answer`` call (also one ``call_tool`` wraps, when the
        profile may use ``call_tool``); None for any other call."""
        if name == FINAL_ANSWER:
            return arguments
        if name == CALL_TOOL and call_tool:
            try:
                inner, inner_arguments = unwrap_call_tool(arguments)
            except ArgumentError:
                return None
            if inner == FINAL_ANSWER:
                return inner_arguments
        return None

    def call(self, arguments: str) -> tuple[str, bool]:
        """Check one ``final_answer`` call of the current answer: its tool text and whether it
        was denied. The first valid call of an answer is the turn's answer."""
        self._tried = True
        if self._answer is not None:
            return ACCEPTED, False  # a second call of the same answer: the first one stands
        checked = self.rule.validate(arguments)
        if isinstance(checked, Answer):
            self._answer = checked
            return ACCEPTED, False
        self._last = checked.detail
        return denial_message(DenyReason.INVALID_ARGUMENTS, checked.detail), True

    def cut_off(self, detail: str) -> None:
        """A ``final_answer`` call was cut off at ``max_tokens``: a failed call."""
        self._tried = True
        self._last = detail

    def settle(self) -> Done | Fail | None:
        """After every call of an answer has its result: the turn's end, or None (ask the
        model again: no ``final_answer`` was called, or a retry is left)."""
        answer, tried = self._answer, self._tried
        self._answer, self._tried = None, False
        if answer is not None:
            return Done(answer)
        if not tried:
            return None
        return self._failed_try(self._last)

    def text_answer(self) -> Fail | None:
        """The model answered in text: a failed try; None if a retry is left."""
        return self._failed_try("the model answered in text instead of calling final_answer")

    def after_text(self, session: str, step: int, max_steps: int) -> TurnFailed | None:
        """The model answered in text at request ``step``: how the turn ends (the last try
        failed: ``OUTPUT_INVALID``; no request left: ``TURN_LIMIT``), or None to answer it
        with :data:`ANSWER_BY_CALLING` and ask again."""
        failed = self.text_answer()
        if failed is not None:
            return TurnFailed(session, FailReason.OUTPUT_INVALID, failed.detail)
        if step >= max_steps:
            detail = f"no final_answer after {step} requests (loop.max_steps is {max_steps})"
            return TurnFailed(session, FailReason.TURN_LIMIT, detail)
        return None

    def _failed_try(self, detail: str) -> Fail | None:
        self.failed += 1
        if self.failed <= self.rule.retries:
            return None
        tries = self.failed
        return Fail(
            f"no valid final_answer in {tries} {'try' if tries == 1 else 'tries'} "
            f"(loop.output_retries is {self.rule.retries}); the last: {detail}; "
            f"{RUNBOOK_OUTPUT_INVALID}"
        )


def outcome_of(verdict: Done | Fail, session: str, *, child: bool, cap: int) -> TurnOutcome:
    """How a typed turn ends on ``verdict``. A child's answer longer than ``cap``
    (``loop.tool_result_cap``) fails at once: its JSON reaches the parent whole or not at all,
    a cut JSON text is not JSON, and no retry would reliably shorten it."""
    if isinstance(verdict, Fail):
        return TurnFailed(session, FailReason.OUTPUT_INVALID, verdict.detail)
    answer = verdict.answer
    if child and len(answer.text) > cap:
        detail = (
            f"the answer's JSON is {len(answer.text)} characters, more than "
            f"loop.tool_result_cap ({cap}); {RUNBOOK_OUTPUT_INVALID}"
        )
        return TurnFailed(session, FailReason.OUTPUT_INVALID, detail)
    return TurnCompleted(session, answer.text, output=answer.value)


def turn_output(types: OutputTypes, output: Any) -> ToolSpec | None:
    """The ``final_answer`` tool a facade's ``output=`` asks for: a JSON schema (a mapping)
    or a Python type (registered in ``types``, so msgspec validates it); None for None.
    Raises :class:`SchemaError` (a ``ValueError``) for a schema loopd cannot use."""
    if output is None:
        return None
    if isinstance(output, Mapping):
        return final_answer_spec(output)
    return types.register(output)


def decoded(outcome: TurnOutcome, kind: Any) -> TurnOutcome:
    """``outcome`` with its ``output`` decoded to the Python type ``kind`` (from its JSON
    text), as the facades return it; unchanged for a failed turn, no type, or a value that is
    not of that type (a session of another profile)."""
    if kind is None or isinstance(kind, Mapping) or not isinstance(outcome, TurnCompleted):
        return outcome
    if outcome.output is None:  # an untyped turn (its text might parse all the same)
        return outcome
    try:
        value = msgspec.json.decode(outcome.content, type=kind)
    except msgspec.DecodeError:  # a ValidationError too
        return outcome
    return msgspec.structs.replace(outcome, output=value)
