"""Port tools from typed Python functions: the schema from the signature and the docstring,
the model's arguments checked against it before the function runs.

::

    @port_tool
    def forecast(city: str, days: int = 1) -> str:
        \"\"\"The weather forecast for a city.

        Args:
            city: The city's name, as people write it.
            days: How many days ahead, from 1.
        \"\"\"

The tool's name is the function's, its description the docstring's text before ``Args:``, and
each parameter's description its line under ``Args:`` (or ``:param name:``). The parameters'
types make a JSON schema (msgspec writes it); arguments that do not fit are denied as
``INVALID_ARGUMENTS`` with a detail naming the field, and the function never runs. A parameter
annotated :class:`~actors.tools.context.ToolContext` gets the call's context and is not in the
schema. An ``async def`` tool runs on the port's event loop, not on a worker thread.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, overload

import msgspec

from actors.core.bounded import OutOfBounds, decode_json
from actors.core.dispatch import ArgumentError, parse_json_object
from actors.tools.context import ToolContext
from actors.tools.tool import PortTool, ToolOutput, is_async_callable
from messages import DataClass, DenyReason, ToolResult, ToolSpec, denial_message

__all__ = [
    "ToolShape",
    "TypedTool",
    "argument_error",
    "docstring_parts",
    "port_tool",
    "shape_of",
    "takes_arguments_dict",
    "typed_tool",
]

_SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Returns|Raises|Yields|Example|Examples):\s*$"
)
_ARG_LINE = re.compile(r"^\s*\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SPHINX = re.compile(r"^\s*:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")


def docstring_parts(doc: str | None) -> tuple[str, dict[str, str]]:
    """A docstring's description (before any section) and its parameters' descriptions.

    Understands Google style (``Args:`` then ``name: text``, continued on indented lines) and
    Sphinx style (``:param name: text``).
    """
    lines = inspect.cleandoc(doc or "").splitlines()
    description: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    for line in lines:
        sphinx = _SPHINX.match(line)
        if sphinx:
            current = sphinx[1]
            params[current] = sphinx[2].strip()
            section = "sphinx"
            continue
        header = _SECTION.match(line)
        if header:
            section, current = header[1], None
            continue
        if section is None:
            description.append(line)
        elif section in ("Args", "Arguments", "Parameters"):
            arg = _ARG_LINE.match(line)
            if arg and len(line) - len(line.lstrip()) <= 4:
                current = arg[1]
                params[current] = arg[2].strip()
            elif current and line.strip():
                params[current] = f"{params[current]} {line.strip()}".strip()
        elif section == "sphinx" and current and line.startswith((" ", "\t")) and line.strip():
            params[current] = f"{params[current]} {line.strip()}"
    return " ".join(" ".join(description).split()), params


def takes_arguments_dict(fn: Callable[..., Any]) -> bool:
    """True for a tool function of the older kind: one parameter (besides a ToolContext), the
    arguments dict, unannotated or annotated as a dict."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # hints that do not resolve: not a typed tool either
        hints = {}
    parameters = [
        p for p in inspect.signature(fn).parameters.values() if hints.get(p.name) is not ToolContext
    ]
    if len(parameters) != 1:
        return False
    hint = hints.get(parameters[0].name)
    return hint is None or hint is dict or typing.get_origin(hint) is dict


@dataclass(frozen=True)
class ToolShape:
    """What a typed function looks like to the port: its arguments' Struct and JSON schema,
    and the parameter (if any) that takes the :class:`ToolContext`."""

    name: str
    description: str
    arguments: type[msgspec.Struct]
    schema: dict[str, Any]
    context_parameter: str | None
    is_async: bool


def shape_of(
    fn: Callable[..., Any], name: str | None = None, description: str | None = None
) -> ToolShape:
    """Read ``fn``'s signature, type hints and docstring. ``TypeError`` for a parameter loopd
    cannot pass (``*args``, ``**kwargs``, positional-only, no type hint) or a type msgspec
    cannot describe."""
    tool_name = name or fn.__name__
    text, described = docstring_parts(fn.__doc__)
    hints = typing.get_type_hints(fn, include_extras=True)
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    context_parameter: str | None = None
    for parameter in inspect.signature(fn).parameters.values():
        where = f"tool {tool_name}: parameter {parameter.name}"
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise TypeError(f"{where}: *args and **kwargs cannot come from a tool call")
        if parameter.kind is parameter.POSITIONAL_ONLY:
            raise TypeError(f"{where}: a positional-only parameter cannot be named in JSON")
        hint = hints.get(parameter.name)
        if hint is None:
            raise TypeError(f"{where} has no type hint; the schema is made from the hints")
        if hint is ToolContext:
            context_parameter = parameter.name
            continue
        if parameter.name in described:
            hint = Annotated[hint, msgspec.Meta(description=described[parameter.name])]
        if parameter.default is parameter.empty:
            fields.append((parameter.name, hint))
        else:
            fields.append((parameter.name, hint, parameter.default))
    arguments = msgspec.defstruct(
        f"{tool_name}_arguments", fields, forbid_unknown_fields=True, kw_only=True
    )
    try:
        schema = _inline(msgspec.json.schema(arguments))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"tool {tool_name}: {exc}") from None
    return ToolShape(
        name=tool_name,
        description=description if description is not None else text,
        arguments=arguments,
        schema=schema,
        context_parameter=context_parameter,
        is_async=is_async_callable(fn),
    )


def _inline(schema: dict[str, Any]) -> dict[str, Any]:
    """msgspec's schema of the arguments Struct is a ``$ref`` into ``$defs``; a tool's
    parameters must be the object itself (other ``$defs``, for nested types, stay)."""
    defs = dict(schema.get("$defs", {}))
    ref = schema.get("$ref", "")
    top = dict(defs.pop(ref.rsplit("/", 1)[-1])) if ref else dict(schema)
    top.pop("title", None)
    top.setdefault("properties", {})
    if defs:
        top["$defs"] = defs
    return top


_MISSING = re.compile(
    r"^Object missing required field `(?P<field>[^`]+)`(?: - at `\$(?P<at>.*)`)?$"
)
_UNKNOWN = re.compile(
    r"^Object contains unknown field `(?P<field>[^`]+)`(?: - at `\$(?P<at>.*)`)?$"
)
_AT = re.compile(r"^(?P<what>.*) - at `\$(?P<at>.*)`$")


def argument_error(exc: msgspec.ValidationError) -> str:
    """msgspec's complaint as a denial detail that names the field first."""
    text = str(exc)
    for pattern, say in ((_MISSING, "{} is required"), (_UNKNOWN, "unknown field: {}")):
        found = pattern.match(text)
        if found:
            at = (found["at"] or "").lstrip(".")
            field = f"{at}.{found['field']}" if at else found["field"]
            return say.format(field)
    found = _AT.match(text)
    if found:
        what = found["what"]
        return f"{found['at'].lstrip('.')}: {what[:1].lower()}{what[1:]}"
    return text[:1].lower() + text[1:]


def decode_arguments(shape: ToolShape, arguments: str) -> dict[str, Any]:
    """The model's raw JSON checked against ``shape``: keyword arguments for the function.
    ``ArgumentError`` with a detail naming the field otherwise."""
    parse_json_object(arguments)  # "arguments must be a JSON object", as for every tool
    try:
        value = msgspec.json.decode(arguments, type=shape.arguments)
    except msgspec.ValidationError as exc:
        raise ArgumentError(argument_error(exc)) from None
    return {f: getattr(value, f) for f in shape.arguments.__struct_fields__}


def result_text(value: Any) -> str:
    """What a typed tool returned, as the call's text: text as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return msgspec.json.encode(value).decode()


def denied(call_id: int, detail: str, data_class: DataClass, untrusted: bool) -> ToolResult:
    """The result of a call whose arguments do not fit."""
    text = denial_message(DenyReason.INVALID_ARGUMENTS, detail)
    return ToolResult(call_id, text, data_class, untrusted, denied=True)


def spec_of(shape: ToolShape) -> ToolSpec:
    """The ToolSpec the registry lists to the model."""
    return ToolSpec(shape.name, shape.description, shape.schema)


@dataclass(frozen=True)
class TypedTool(PortTool):
    """A :class:`PortTool` made from a typed function (see the module's doc)."""

    shape: ToolShape | None = None

    def check_arguments(self, arguments: str) -> str | None:
        """The ``INVALID_ARGUMENTS`` detail ``arguments`` earn against the function's
        signature (the same check :meth:`run` makes before the function runs), or None."""
        assert self.shape is not None
        try:
            decode_json(arguments)
            decode_arguments(self.shape, arguments)
        except OutOfBounds as exc:
            return exc.detail
        except ArgumentError as exc:
            return exc.detail
        return None

    def run(self, call_id: int, arguments: str, context: ToolContext | None = None) -> ToolResult:
        """Check the arguments, then call the function; every failure becomes the call's text
        (``SystemExit`` and the like included, as for any :class:`PortTool`)."""
        assert self.shape is not None
        if self.shape.is_async:  # called outside the port (the port runs it on its loop)
            return asyncio.run(self.run_async(call_id, arguments, context))
        try:
            kwargs = decode_arguments(self.shape, arguments)
        except ArgumentError as exc:
            return denied(call_id, exc.detail, self.data_class, self.untrusted)
        if self.shape.context_parameter is not None:
            kwargs[self.shape.context_parameter] = context or ToolContext("", call_id)
        try:
            fn: Callable[..., Any] = self.fn
            out = fn(**kwargs)
        except BaseException as exc:  # a tool's sys.exit() is its failure, not the runtime's
            return self.failure(call_id, exc)
        return self.result(call_id, out)

    async def run_async(
        self, call_id: int, arguments: str, context: ToolContext | None = None
    ) -> ToolResult:
        """As :meth:`run`, for an ``async def`` function, on the port's event loop (the port
        cancels the task when the call is cancelled or outlives ``port.timeout_s``)."""
        assert self.shape is not None
        try:
            kwargs = decode_arguments(self.shape, arguments)
        except ArgumentError as exc:
            return denied(call_id, exc.detail, self.data_class, self.untrusted)
        context = context or ToolContext("", call_id)
        if self.shape.context_parameter is not None:
            kwargs[self.shape.context_parameter] = context
        fn: Callable[..., Any] = self.fn
        try:
            out = await fn(**kwargs)
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            # GeneratorExit passes: it is also how Python closes this coroutine (the router
            # answers a tool's own GeneratorExit with the same text).
            return self.failure(call_id, exc)
        return self.result(call_id, out)

    def result(self, call_id: int, out: object) -> ToolResult:
        """The call's result from what the function returned."""
        if isinstance(out, ToolOutput):
            if not isinstance(out.text, str):
                return self.failure(
                    call_id, TypeError(f"it returned {type(out.text).__name__}, not text")
                )
            return ToolResult(call_id, out.text, out.data_class, out.untrusted or self.untrusted)
        try:
            text = result_text(out)
        except Exception as exc:  # a value msgspec cannot write as JSON
            return self.failure(call_id, exc)
        return ToolResult(call_id, text, self.data_class, self.untrusted)


def typed_tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    data_class: DataClass = DataClass.PUBLIC,
    untrusted: bool = False,
    approval: bool = False,
) -> TypedTool:
    """``fn`` as a port tool whose schema comes from its hints and docstring."""
    shape = shape_of(fn, name, description)
    return TypedTool(spec_of(shape), fn, data_class, untrusted, approval=approval, shape=shape)


@overload
def port_tool(name: Callable[..., Any], /) -> PortTool: ...


@overload
def port_tool(
    name: str | None = None,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
    *,
    data_class: DataClass = DataClass.PUBLIC,
    untrusted: bool = False,
    approval: bool = False,
) -> Callable[[Callable[..., Any]], PortTool]: ...


def port_tool(
    name: str | Callable[..., Any] | None = None,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
    *,
    data_class: DataClass = DataClass.PUBLIC,
    untrusted: bool = False,
    approval: bool = False,
) -> PortTool | Callable[[Callable[..., Any]], PortTool]:
    """Decorate a function as a :class:`PortTool`.

    A typed function, with ``@port_tool`` or ``@port_tool(name=..., untrusted=...)``: the schema
    comes from its type hints and docstring, and arguments are checked before it runs (see
    :mod:`actors.tools.typed`)::

        @port_tool
        def forecast(city: str, days: int = 1) -> str:
            \"\"\"The weather forecast for a city.\"\"\"

    A function of one parameter, the arguments dict (unannotated or annotated ``dict``), or
    any function given a hand-written schema (``parameters``). ``approval=True``: every call
    waits for a person's yes or no (``Runtime.approve`` / ``Runtime.deny``) before it runs::

        @port_tool("hostname", "This machine's host name.")
        def hostname(args): return socket.gethostname()
    """
    if callable(name):  # bare @port_tool on a typed function
        return typed_tool(name)

    def wrap(fn: Callable[..., Any]) -> PortTool:

        if parameters is None and not takes_arguments_dict(fn):
            return typed_tool(
                fn,
                name=name,
                description=description,
                data_class=data_class,
                untrusted=untrusted,
                approval=approval,
            )
        schema = parameters or {"type": "object", "properties": {}}
        spec = ToolSpec(name or fn.__name__, description or "", schema)
        return PortTool(spec, fn, data_class, untrusted, approval)

    return wrap
