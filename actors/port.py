"""Port tools: the external tools a runtime is given, run on the port's worker actors."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from actors.dispatch import ArgumentError, parse_json_object
from messages import DataClass, DenyReason, PortCall, ToolDone, ToolResult, ToolSpec, denial_message

__all__ = ["PortTool", "ToolOutput", "port_error", "port_handler", "port_tool"]

log = logging.getLogger(__name__)


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
    text or a :class:`ToolOutput`. ``untrusted`` marks every result as untrusted data (web pages,
    mail, anything a third party wrote): the calling session becomes untrusted.
    """

    spec: ToolSpec
    fn: Callable[[dict[str, Any]], str | ToolOutput]
    data_class: DataClass = DataClass.PUBLIC
    untrusted: bool = False

    @property
    def name(self) -> str:
        """The tool's name."""
        return self.spec.name

    def run(self, call_id: int, arguments: str) -> ToolResult:
        """Run the tool for call ``call_id``; every failure becomes the call's result text."""
        try:
            args = parse_json_object(arguments)
        except ArgumentError as exc:
            text = denial_message(DenyReason.INVALID_ARGUMENTS, exc.detail)
            return ToolResult(call_id, text, self.data_class, self.untrusted)
        try:
            out = self.fn(args)
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


def port_tool(
    name: str,
    description: str,
    parameters: dict[str, Any] | None = None,
    *,
    data_class: DataClass = DataClass.PUBLIC,
    untrusted: bool = False,
) -> Callable[[Callable[[dict[str, Any]], str | ToolOutput]], PortTool]:
    """Decorate a function as a :class:`PortTool`::

    @port_tool("hostname", "This machine's host name.")
    def hostname(args): return socket.gethostname()
    """
    schema = parameters or {"type": "object", "properties": {}}

    def wrap(fn: Callable[[dict[str, Any]], str | ToolOutput]) -> PortTool:
        return PortTool(ToolSpec(name, description, schema), fn, data_class, untrusted)

    return wrap


def port_handler(tools: Iterable[PortTool]) -> Callable[[PortCall], ToolDone]:
    """The port workers' job: run the named tool and wrap its result for the session."""
    by_name = {tool.name: tool for tool in tools}

    def handle(call: PortCall) -> ToolDone:
        tool = by_name.get(call.name)
        if tool is None:  # the registry only routes port names here; keep the answer anyway
            text = denial_message(DenyReason.UNKNOWN_TOOL, call.name)
            return ToolDone(call.session, ToolResult(call.call_id, text))
        return ToolDone(call.session, tool.run(call.call_id, call.arguments))

    return handle


def port_error(call: PortCall, exc: Exception) -> ToolDone:
    """The port's answer to a call whose handling failed anyway."""
    text = f"Error: the tool {call.name} failed: {type(exc).__name__}: {exc}"
    return ToolDone(call.session, ToolResult(call.call_id, text))
