"""Port tools: the external tools a runtime is given, run on the port's worker actors."""

from __future__ import annotations

import asyncio
import inspect
import logging
import typing
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

from actors.core.bounded import OutOfBounds, decode_json
from actors.core.dispatch import ArgumentError, parse_json_object
from actors.tools.context import Ticket, ToolContext
from messages import (
    DataClass,
    DenyReason,
    PortCall,
    ToolDone,
    ToolResult,
    ToolSpec,
    ToolWorkerLost,
    denial_message,
)

__all__ = [
    "PortTool",
    "ToolContext",
    "ToolOutput",
    "failure_text",
    "is_async_callable",
    "port_async_job",
    "port_error",
    "port_handler",
    "port_lost",
    "port_timeout",
]

log = logging.getLogger(__name__)


def _context_parameter(fn: Callable[..., Any]) -> str | None:
    """The name of ``fn``'s parameter annotated :class:`ToolContext`, if it has one."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # an annotation that does not resolve: compare the text
        hints = {}
    for parameter in parameters:
        annotation = hints.get(parameter.name, parameter.annotation)
        if annotation is ToolContext or annotation == "ToolContext":
            return parameter.name
    return None


def is_async_callable(fn: Callable[..., Any]) -> bool:
    """True for an ``async def`` function, a ``functools.partial`` of one, or an object whose
    ``__call__`` is ``async def``: the port awaits what it returns on an event loop."""
    if inspect.iscoroutinefunction(fn):
        return True
    if inspect.isfunction(fn) or inspect.ismethod(fn) or isinstance(fn, type):
        return False
    for base in type(fn).__mro__:  # an object: Python calls the first __call__ of its class
        if "__call__" in vars(base):
            return inspect.iscoroutinefunction(vars(base)["__call__"])
    return False


def failure_text(name: str, exc: BaseException) -> str:
    """The call's text when tool ``name`` raised ``exc`` (any exception: ``SystemExit`` and
    ``KeyboardInterrupt`` from a tool are its failure, never the runtime's)."""
    try:
        said = str(exc)
    except Exception:  # a hostile __str__ must not lose the answer
        said = "(its message could not be read)"
    detail = f": {said}" if said else ""
    return f"Error: the tool {name} failed: {type(exc).__name__}{detail}"


def _not_text(out: object) -> TypeError:
    if inspect.isawaitable(out):
        if inspect.iscoroutine(out):
            out.close()  # never awaited: close it, so Python does not warn about it later
        return TypeError(
            f"it returned {type(out).__name__}, not text (its function is not `async def`, "
            "so loopd did not await it)"
        )
    return TypeError(f"it returned {type(out).__name__}, not text")


@dataclass(frozen=True)
class ToolOutput:
    """What a tool function may return instead of plain text, to mark its data."""

    text: str
    data_class: DataClass = DataClass.PUBLIC
    untrusted: bool = False


@dataclass(frozen=True)
class PortTool:
    """A tool the model can call through the port.

    ``fn`` gets the call's arguments as a dict (a non-object is denied before it runs) and returns
    text or a :class:`ToolOutput`; a parameter annotated :class:`ToolContext` gets the call's
    context (its cancel signal, its deadline). An ``async def`` ``fn`` is awaited on the
    port's event loop, as a typed async tool is. ``untrusted`` marks every result as untrusted
    data (web pages, mail, anything a third party wrote): the calling session becomes untrusted.
    ``approval``: every call waits for a person's yes or no before it runs (``[approvals]``).
    """

    spec: ToolSpec
    fn: Callable[..., str | ToolOutput | Awaitable[str | ToolOutput]]
    data_class: DataClass = DataClass.PUBLIC
    untrusted: bool = False
    approval: bool = False
    _context: str | None = field(init=False, repr=False, compare=False, default=None)
    _async: bool = field(init=False, repr=False, compare=False, default=False)
    _validator: Any = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        # Looked up once: the name of fn's ToolContext parameter, if it has one, and whether
        # fn is a coroutine function (the port then runs it on its event loop).
        object.__setattr__(self, "_context", _context_parameter(self.fn))
        object.__setattr__(self, "_async", is_async_callable(self.fn))

    @property
    def is_async(self) -> bool:
        """True for an ``async def`` tool: the port runs it as a task, never on a worker."""
        return self._async

    @property
    def name(self) -> str:
        """The tool's name."""
        return self.spec.name

    def check_arguments(self, arguments: str) -> str | None:
        """The ``INVALID_ARGUMENTS`` detail ``arguments`` (the model's raw JSON) earn against
        the tool's schema (``spec.parameters``, checked with the ``jsonschema`` package;
        naming the field: ``service: 'service' is a required property``), or None when they
        fit. Decoded bounded first (``actors.core.bounded``). A call that waits for a person
        is checked so before anyone is asked; a schema the metaschema refuses checks only
        that the arguments are a JSON object."""
        try:
            value = decode_json(arguments)
        except OutOfBounds as exc:
            return exc.detail
        if not isinstance(value, dict):
            return "arguments must be a JSON object"
        validator = self._schema_validator()
        if validator is False:
            return None
        import jsonschema

        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
        if error is None:
            return None
        path = ".".join(str(part) for part in error.absolute_path)
        return f"{path}: {error.message}" if path else str(error.message)

    def _schema_validator(self) -> Any:
        """The schema's validator, built at its first use (False: the schema is not valid)."""
        if self._validator is None:
            import jsonschema

            schema = self.spec.parameters
            cls = jsonschema.validators.validator_for(
                schema, default=jsonschema.Draft202012Validator
            )
            try:
                cls.check_schema(schema)
                validator: Any = cls(schema)
            except jsonschema.SchemaError:
                validator = False
            object.__setattr__(self, "_validator", validator)
        return self._validator

    def run(self, call_id: int, arguments: str, context: ToolContext | None = None) -> ToolResult:
        """Run the tool for call ``call_id``; every failure becomes the call's result text.

        Any exception the function raises is its failure, ``SystemExit`` (``sys.exit``,
        argparse), ``KeyboardInterrupt`` and ``GeneratorExit`` included: it never reaches the
        worker, so it can never stop the runtime. An ``async def`` tool called here (outside
        the port) runs on a loop of its own until it is done.
        """
        if self.is_async:
            return asyncio.run(self.run_async(call_id, arguments, context))
        try:
            args = parse_json_object(arguments)
        except ArgumentError as exc:
            text = denial_message(DenyReason.INVALID_ARGUMENTS, exc.detail)
            return ToolResult(call_id, text, self.data_class, self.untrusted, denied=True)
        try:
            if self._context is None:
                out = self.fn(args)
            else:
                out = self.fn(args, **{self._context: context or ToolContext("", call_id)})
        except BaseException as exc:  # see the docstring: a tool's exit is its own failure
            return self.failure(call_id, exc)
        return self.result(call_id, out)

    async def run_async(
        self, call_id: int, arguments: str, context: ToolContext | None = None
    ) -> ToolResult:
        """As :meth:`run`, for an ``async def`` function, on the port's event loop (the port
        cancels the task when the call is cancelled or outlives ``port.timeout_s``)."""
        try:
            args = parse_json_object(arguments)
        except ArgumentError as exc:
            text = denial_message(DenyReason.INVALID_ARGUMENTS, exc.detail)
            return ToolResult(call_id, text, self.data_class, self.untrusted)
        fn: Callable[..., Any] = self.fn
        try:
            if self._context is None:
                out = await fn(args)
            else:
                out = await fn(args, **{self._context: context or ToolContext("", call_id)})
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            # GeneratorExit is not caught here: it is also how Python closes this coroutine.
            # The port's router answers a tool's own GeneratorExit with the same text.
            return self.failure(call_id, exc)
        return self.result(call_id, out)

    def result(self, call_id: int, out: object) -> ToolResult:
        """The call's result from what the function returned: text or a :class:`ToolOutput`
        whose text is text; anything else is the tool's failure."""
        text = out.text if isinstance(out, ToolOutput) else out
        if not isinstance(text, str):
            return self.failure(call_id, _not_text(text))
        if isinstance(out, ToolOutput):
            return ToolResult(call_id, text, out.data_class, out.untrusted or self.untrusted)
        return ToolResult(call_id, text, self.data_class, self.untrusted)

    def failure(self, call_id: int, exc: BaseException) -> ToolResult:
        """The call's result when the function raised (logged with its traceback)."""
        log.warning("port tool %s failed", self.name, exc_info=exc)
        return ToolResult(call_id, failure_text(self.name, exc), self.data_class, self.untrusted)


def port_handler(tools: Iterable[PortTool]) -> Callable[[PortCall, Ticket], ToolDone]:
    """The port workers' job: run the named tool and wrap its result for the session."""
    by_name = {tool.name: tool for tool in tools}

    def handle(call: PortCall, ticket: Ticket) -> ToolDone:
        tool = by_name.get(call.name)
        if tool is None:  # the registry only routes port names here; keep the answer anyway
            text = denial_message(DenyReason.UNKNOWN_TOOL, call.name)
            return ToolDone(call.session, ToolResult(call.call_id, text, denied=True))
        return ToolDone(
            call.session, tool.run(call.call_id, call.arguments, _context(call, ticket))
        )

    return handle


def _context(call: PortCall, ticket: Ticket) -> ToolContext:
    return ToolContext(
        call.session, call.call_id, ticket.deadline, ticket.cancelled, call.untrusted
    )


def port_async_job(
    tools: Iterable[PortTool],
) -> Callable[[PortCall, Ticket], Coroutine[Any, Any, ToolDone] | None]:
    """For the port's router: the coroutine that runs an ``async def`` tool's call on the
    port's event loop, or None for a call a worker thread runs."""
    by_name = {tool.name: tool for tool in tools if tool.is_async}

    def job(call: PortCall, ticket: Ticket) -> Coroutine[Any, Any, ToolDone] | None:
        tool = by_name.get(call.name)
        if tool is None:
            return None
        run_async = tool.run_async
        context = _context(call, ticket)

        async def run() -> ToolDone:
            return ToolDone(call.session, await run_async(call.call_id, call.arguments, context))

        return run()

    return job


def port_timeout(call: PortCall, timeout_s: float) -> ToolDone:
    """The port's answer to a call that outlived ``port.timeout_s``."""
    text = (
        f"Error: the tool {call.name} did not finish within port.timeout_s ({timeout_s:g} s); "
        "it was told to stop"
    )
    return ToolDone(call.session, ToolResult(call.call_id, text))


def port_error(call: PortCall, exc: BaseException) -> ToolDone:
    """The port's answer to a call whose handling failed anyway."""
    return ToolDone(call.session, ToolResult(call.call_id, failure_text(call.name, exc)))


def port_lost(call: PortCall, stuck: int) -> ToolWorkerLost:
    """The event of a port worker replaced because ``call``'s tool did not return after it was
    told to stop; ``stuck`` counts the runtime's abandoned tool threads now."""
    return ToolWorkerLost(session=call.session, call_id=call.call_id, name=call.name, stuck=stuck)
