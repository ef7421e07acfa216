"""Port tools: the external tools a runtime is given, run on the port's worker actors."""

from __future__ import annotations

import inspect
import logging
import typing
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

from actors.core.dispatch import ArgumentError, parse_json_object
from actors.tools.context import Ticket, ToolContext
from messages import DataClass, DenyReason, PortCall, ToolDone, ToolResult, ToolSpec, denial_message

__all__ = [
    "PortTool",
    "ToolContext",
    "ToolOutput",
    "port_async_job",
    "port_error",
    "port_handler",
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
    context (its cancel signal, its deadline). ``untrusted`` marks every result as untrusted
    data (web pages, mail, anything a third party wrote): the calling session becomes untrusted.
    """

    spec: ToolSpec
    fn: Callable[..., str | ToolOutput]
    data_class: DataClass = DataClass.PUBLIC
    untrusted: bool = False
    _context: str | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        # Looked up once: the name of fn's ToolContext parameter, if it has one.
        object.__setattr__(self, "_context", _context_parameter(self.fn))

    @property
    def name(self) -> str:
        """The tool's name."""
        return self.spec.name

    def run(self, call_id: int, arguments: str, context: ToolContext | None = None) -> ToolResult:
        """Run the tool for call ``call_id``; every failure becomes the call's result text."""
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
            text = out.text if isinstance(out, ToolOutput) else out
            if not isinstance(text, str):
                raise TypeError(f"it returned {type(text).__name__}, not text")
        except Exception as exc:
            log.warning("port tool %s failed", self.name, exc_info=True)
            text = f"Error: the tool {self.name} failed: {type(exc).__name__}: {exc}"
            return ToolResult(call_id, text, self.data_class, self.untrusted)
        if isinstance(out, ToolOutput):
            return ToolResult(call_id, text, out.data_class, out.untrusted or self.untrusted)
        return ToolResult(call_id, text, self.data_class, self.untrusted)


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
    by_name = {tool.name: tool for tool in tools if getattr(tool, "is_async", False)}

    def job(call: PortCall, ticket: Ticket) -> Coroutine[Any, Any, ToolDone] | None:
        tool = by_name.get(call.name)
        if tool is None:
            return None
        run_async = tool.run_async  # type: ignore[attr-defined]
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


def port_error(call: PortCall, exc: Exception) -> ToolDone:
    """The port's answer to a call whose handling failed anyway."""
    text = f"Error: the tool {call.name} failed: {type(exc).__name__}: {exc}"
    return ToolDone(call.session, ToolResult(call.call_id, text))
