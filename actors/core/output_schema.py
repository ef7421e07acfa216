"""Output schemas checked at load, bounded, and answers checked with a matcher that cannot
backtrack (no I/O).

A schema is untrusted work twice over: checking it against the JSON-schema metaschema costs
time in its size, and its ``pattern`` keywords run against whatever a model writes. So:

- :func:`schema_problem` refuses, before anything uses a schema, one larger than
  :data:`MAX_SCHEMA_BYTES` of JSON or :data:`MAX_SCHEMA_OBJECTS` objects, a pattern RE2 cannot
  run (a backreference, lookaround), a ``$ref`` that is not a local reference into the schema
  or that comes back to where it started without descending into the value (``a`` -> ``a``,
  ``a`` -> ``b`` -> ``a``: no answer could ever pass), and what the metaschema refuses. Each
  distinct schema (its canonical JSON text) is checked once; the verdict is kept.
- :func:`answer_validator` is a ``jsonschema`` validator whose ``pattern``,
  ``patternProperties`` and ``additionalProperties`` match with RE2, whose time is linear in
  the text: no answer can hold the thread that checks it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any, Final
from urllib.parse import unquote

import msgspec
import re2

__all__ = [
    "MAX_SCHEMA_BYTES",
    "MAX_SCHEMA_OBJECTS",
    "SchemaError",
    "answer_validator",
    "resolve_top_ref",
    "schema_problem",
]

MAX_SCHEMA_BYTES: Final = 256 * 1024
"""The most JSON text an output schema may be (256 KiB)."""

MAX_SCHEMA_OBJECTS: Final = 1_000
"""The most JSON objects (subschemas, and the maps that hold them) an output schema may have:
checking a schema against the metaschema costs about 0.35 ms an object on an idle core."""


class SchemaError(ValueError):
    """An output schema loopd cannot use (not a JSON object, too large, a ``$ref`` it cannot
    resolve or that loops, a pattern RE2 cannot run, a schema the JSON-schema metaschema
    refuses, a type msgspec has no schema for)."""


def _options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # the refusal names the fault; nothing goes to stderr
    return options


_OPTIONS: Final = _options()

# Keywords whose value is data, never a schema; and those whose value maps names to schemas.
_DATA = frozenset({"const", "enum", "default", "examples"})
_SCHEMA_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)
# Keywords whose schemas apply to the same value (no descent into it): a $ref cycle through
# only these never ends.
_IN_PLACE_ONE = ("not", "if", "then", "else")
_IN_PLACE_MANY = ("allOf", "anyOf", "oneOf")


def _where(path: tuple[str | int, ...]) -> str:
    out = "$"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _re2_fault(pattern: str) -> str | None:
    """Why RE2 cannot run ``pattern``, or None."""
    try:
        re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "refused"
        return reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)
    return None


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> Any:
    """``pattern`` compiled by RE2 (kept: the patterns are those of loaded schemas); None when
    RE2 cannot run it (a schema stored before this check)."""
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error:
        return None


def _search(pattern: str, text: str) -> bool | None:
    """Whether ``pattern`` matches somewhere in ``text``; None when RE2 cannot run it."""
    compiled = _compiled(pattern)
    return None if compiled is None else compiled.search(text) is not None


def _pattern_fault(pattern: str, where: str) -> str:
    return (
        f"the pattern {pattern!r} at {where} cannot be used: RE2, the matcher answers are "
        f"checked with (it cannot backtrack), refuses it ({_re2_fault(pattern)}); "
        "backreferences and lookaround are not supported"
    )


def _pointer(schema: Any, ref: str) -> tuple[str, ...] | None:
    """The path a local ``$ref`` (``#`` or ``#/a/b``) names in ``schema``, or None when it
    names nothing there (or is not local)."""
    if ref == "#":
        return ()
    if not ref.startswith("#/"):
        return None
    parts = tuple(unquote(p).replace("~1", "/").replace("~0", "~") for p in ref[2:].split("/"))
    node = schema
    for part in parts:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return parts if isinstance(node, dict | bool) else None


def _at(schema: Any, parts: tuple[str, ...]) -> Any:
    node = schema
    for part in parts:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def _subschemas(node: dict[str, Any]) -> Iterator[tuple[str | int, Any, bool]]:
    """The children of schema ``node`` that are schemas (or lists and maps of them): each
    with its key and whether it holds schemas by name (a map)."""
    for key, value in node.items():
        if key in _DATA:
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            yield key, value, True
        elif isinstance(value, dict | list):
            yield key, value, False


def _walk(schema: dict[str, Any]) -> str | None:
    """The first fault of ``schema`` found by one walk (no recursion), or None: too many
    objects, a pattern RE2 refuses, a ``$ref`` that names nothing, ``$dynamicRef``, or
    ``unevaluatedProperties`` beside ``patternProperties``."""
    objects = 0
    unevaluated: str | None = None
    patterned: str | None = None
    # (node, path, kind): kind "schema", "map" (name -> schema) or "list" (of schemas)
    stack: list[tuple[Any, tuple[str | int, ...], str]] = [(schema, (), "schema")]
    while stack:
        node, path, kind = stack.pop()
        if isinstance(node, dict):
            objects += 1
            if objects > MAX_SCHEMA_OBJECTS:
                return (
                    f"the output schema has more than {MAX_SCHEMA_OBJECTS:,} JSON objects "
                    f"(the limit on an output schema's subschemas)"
                )
        if kind == "map" and isinstance(node, dict):
            stack.extend((v, (*path, k), "schema") for k, v in node.items())
            continue
        if kind == "list" or isinstance(node, list):
            if isinstance(node, list):
                stack.extend((v, (*path, i), "schema") for i, v in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        where = _where(path)
        pattern = node.get("pattern")
        if isinstance(pattern, str) and _re2_fault(pattern) is not None:
            return _pattern_fault(pattern, f"{where}.pattern")
        by_pattern = node.get("patternProperties")
        if isinstance(by_pattern, dict):
            patterned = patterned or f"{where}.patternProperties"
            for key in by_pattern:
                if _re2_fault(key) is not None:
                    return _pattern_fault(key, f"{where}.patternProperties")
        if "unevaluatedProperties" in node:
            unevaluated = unevaluated or f"{where}.unevaluatedProperties"
        for keyword in ("$dynamicRef", "$recursiveRef"):
            if keyword in node:
                return f"{keyword} at {where} is not supported in an output schema"
        ref = node.get("$ref")
        if ref is not None and (not isinstance(ref, str) or _pointer(schema, ref) is None):
            return (
                f"the $ref {ref!r} at {where} names nothing in the schema (an output schema "
                "refers only to itself: #, #/$defs/NAME, ...)"
            )
        for key, value, is_map in _subschemas(node):
            stack.append((value, (*path, key), "map" if is_map else "schema"))
    if unevaluated is not None and patterned is not None:
        return (
            f"unevaluatedProperties (at {unevaluated}) beside patternProperties (at "
            f"{patterned}) is not supported in an output schema: jsonschema would match those "
            "patterns with a backtracking matcher"
        )
    return None


def _in_place_refs(schema: Any, start: tuple[str, ...]) -> list[tuple[str, tuple[str, ...]]]:
    """The ``$ref`` s reached from the schema at ``start`` without descending into the value
    (its own, and those of ``allOf``/``anyOf``/``oneOf``/``not``/``if``/``then``/``else``):
    each as its text and the path it names."""
    found: list[tuple[str, tuple[str, ...]]] = []
    stack = [_at(schema, start)]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        ref = node.get("$ref")
        if isinstance(ref, str):
            target = _pointer(schema, ref)
            if target is not None:
                found.append((ref, target))
        stack.extend(node[k] for k in _IN_PLACE_ONE if k in node)
        for key in _IN_PLACE_MANY:
            items = node.get(key)
            if isinstance(items, list):
                stack.extend(items)
    return found


def _ref_cycle(schema: dict[str, Any]) -> str | None:
    """A ``$ref`` chain of ``schema`` that comes back where it started without descending
    into the value, named (``#/$defs/a -> #/$defs/b -> #/$defs/a``); None if there is none."""
    done: set[tuple[str, ...]] = set()
    for root in [(), *(t for _, t in _all_refs(schema))]:
        if root in done:
            continue
        # Depth-first, iteratively: the chain of refs taken so far, and each one's next edges.
        on_path: dict[tuple[str, ...], int] = {root: 0}
        names: list[str] = ["#" if not root else "#/" + "/".join(root)]
        frames = [(root, iter(_in_place_refs(schema, root)))]
        while frames:
            node, edges = frames[-1]
            step = next(edges, None)
            if step is None:
                frames.pop()
                names.pop()
                del on_path[node]
                done.add(node)
                continue
            ref, target = step
            if target in on_path:
                loop = " -> ".join([*names[on_path[target] :], ref])
                return (
                    f"the $ref {ref!r} refers back to itself without descending into the "
                    f"value ({loop}): no answer could ever pass"
                )
            if target in done:
                continue
            on_path[target] = len(names)
            names.append(ref)
            frames.append((target, iter(_in_place_refs(schema, target))))
    return None


def _all_refs(schema: dict[str, Any]) -> list[tuple[str, tuple[str, ...]]]:
    """Every resolvable ``$ref`` of ``schema`` with the path it names."""
    found: list[tuple[str, tuple[str, ...]]] = []
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                target = _pointer(schema, ref)
                if target is not None:
                    found.append((ref, target))
            stack.extend(v for k, v in node.items() if k not in _DATA)
        elif isinstance(node, list):
            stack.extend(node)
    return found


def resolve_top_ref(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with a top-level ``$ref`` to its own ``$defs`` (or ``definitions``) replaced
    by what it points at; the definitions stay when something inside still refers to them."""
    ref = schema.get("$ref")
    if ref is None:
        return schema
    if not isinstance(ref, str):
        raise SchemaError("the top-level $ref must be a string")
    for key in ("$defs", "definitions"):
        prefix = f"#/{key}/"
        if ref.startswith(prefix):
            defs = schema.get(key)
            name = ref[len(prefix) :]
            if not isinstance(defs, dict) or not isinstance(defs.get(name), dict):
                raise SchemaError(f"the top-level $ref {ref} names no definition of the schema")
            resolved = {k: v for k, v in schema.items() if k not in ("$ref", key)}
            resolved.update(defs[name])
            text = msgspec.json.encode([resolved, defs]).decode()
            if f'"{ref}"' not in text:  # nothing refers back to it: it is the schema itself
                defs = {k: v for k, v in defs.items() if k != name}
            if defs and '"$ref"' in text:
                resolved[key] = defs
            return resolved
    raise SchemaError(f"the top-level $ref {ref} is not a local #/$defs/ reference")


@functools.lru_cache(maxsize=32)
def schema_problem(canonical: bytes) -> str | None:
    """What makes the schema whose canonical JSON text (keys sorted) is ``canonical`` one
    loopd cannot use, or None: kept per text, so each distinct schema is checked once. The
    caller has checked it is JSON within :data:`MAX_SCHEMA_BYTES` (``bounded.check_value``)."""
    schema = msgspec.json.decode(canonical)
    fault = _walk(schema) or _ref_cycle(schema)
    if fault is not None:
        return fault
    try:
        resolved = resolve_top_ref(schema)
    except SchemaError as exc:
        return str(exc)
    return _metaschema_fault(resolved)


def _metaschema_fault(schema: dict[str, Any]) -> str | None:
    import jsonschema  # only a runtime with a plain schema needs it

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema, format_checker=_formats())
    except jsonschema.SchemaError as exc:
        return f"not a valid JSON schema: {exc.message}"
    return None


@functools.cache
def _formats() -> Any:
    """The metaschema's format checks, with ``regex`` checked by RE2 (not Python's ``re``)."""
    import jsonschema

    checker = jsonschema.FormatChecker()

    def is_regex(instance: object) -> bool:
        return not isinstance(instance, str) or _re2_fault(instance) is None

    checker.checks("regex")(is_regex)
    return checker


# The keywords that match patterns, with RE2.


def _pattern(validator: Any, pattern: Any, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema import ValidationError

    if validator.is_type(instance, "string") and isinstance(pattern, str):
        found = _search(pattern, instance)
        if found is None:
            yield ValidationError(f"the schema's pattern {pattern!r} cannot be checked")
        elif not found:
            yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(
    validator: Any, allowed: Any, instance: Any, schema: Any
) -> Iterator[Any]:
    from jsonschema import ValidationError

    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [
        k for k in instance if k not in properties and not any(_search(p, k) for p in patterns)
    ]
    if validator.is_type(allowed, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], allowed, path=extra)
    elif not allowed and extras:
        names = ", ".join(repr(k) for k in sorted(extras))
        if patterns:
            listed = ", ".join(repr(p) for p in sorted(patterns))
            yield ValidationError(f"{names} do(es) not match any of the regexes: {listed}")
        else:
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(
                f"Additional properties are not allowed ({names} {verb} unexpected)"
            )


@functools.cache
def _re2_class(base: Any) -> Any:
    import jsonschema

    keywords = {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
    }
    present = {k: v for k, v in keywords.items() if k in base.VALIDATORS}
    return jsonschema.validators.extend(base, present)


def answer_validator(parameters: dict[str, Any]) -> Any:
    """A ``jsonschema`` validator of ``parameters`` (a schema :func:`schema_problem` passed,
    or one stored with a session) whose patterns match with RE2."""
    import jsonschema

    base = jsonschema.validators.validator_for(parameters, default=jsonschema.Draft202012Validator)
    return _re2_class(base)(parameters)
