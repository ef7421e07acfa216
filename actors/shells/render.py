"""Turn events as lines of text, indented by session depth: the live tree of the CLI."""

from __future__ import annotations

from typing import TextIO

import msgspec

from actors.core.dispatch import depth_of
from actors.core.text import escape_controls
from messages import (
    ApprovalRequested,
    ApprovalSettled,
    Compacted,
    CompactionFailed,
    FailReason,
    JobSkipped,
    McpServerDown,
    McpServerUp,
    MemoryWarning,
    ModelAnswered,
    ModelRequestSent,
    RuntimeEvent,
    SubagentFinished,
    SubagentStarted,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    ToolProgress,
    ToolWorkerLost,
    TurnEnded,
    TurnEvent,
    TurnStarted,
)

__all__ = ["EventPrinter", "approvals_table", "render_event", "table"]

_PREVIEW = 72


def table(rows: list[list[str]], header: list[str]) -> str:
    """Rows as a plain text table: columns padded to their widest cell, two spaces apart."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )


def approvals_table(requests: tuple[ApprovalRequested, ...]) -> str:
    """The calls waiting for a person, oldest first, with the untrusted flag shown (its
    arguments may come from injected text); ``no call waits for a decision`` when none."""
    if not requests:
        return "no call waits for a decision"
    rows = [
        [
            r.session,
            str(r.call_id),
            r.tool,
            "UNTRUSTED" if r.untrusted else "-",
            f"{r.at:%Y-%m-%d %H:%M:%S}",
            escape_controls(_preview(r.arguments), one_line=True),
        ]
        for r in requests
    ]
    return table(rows, ["session", "call", "tool", "untrusted", "since", "arguments"])


def _preview(text: str | None) -> str:
    one_line = " ".join((text or "").split())
    return one_line if len(one_line) <= _PREVIEW else one_line[: _PREVIEW - 1] + "…"


def _slot_note(event: ModelAnswered) -> str:
    """`` (slot 2, waited 0.4 s for it)`` when the answer names its slot: where it really ran."""
    if event.slot is None:
        return ""
    waited = f", waited {event.slot_wait_s:.1f} s for it" if event.slot_wait_s >= 0.05 else ""
    return f" (slot {event.slot}{waited})"


def _describe(event: TurnEvent) -> str:
    match event:
        case TurnStarted(slot=None):
            return "turn started"  # the server has no slots (the openai backend)
        case TurnStarted(slot=slot):
            return f"turn started on slot {slot}"
        case ModelRequestSent(step=step, slot=None):
            return f"→ model request {step}"
        case ModelRequestSent(step=step, slot=slot):
            return f"→ model request {step} (slot {slot})"
        case ModelAnswered(tools=tools, content=content) if tools:
            return "← model calls " + ", ".join(tools) + _slot_note(event)
        case ModelAnswered(content=content):
            return f"← model answers{_slot_note(event)}: {_preview(content)}"
        case ToolCallStarted(call_id=call_id, name=name):
            return f"  call {call_id} {name} …"
        case ToolCallFinished(call_id=call_id, name=name, denied=denied):
            return f"  call {call_id} {name} {'denied' if denied else 'done'}"
        case ToolWorkerLost(call_id=call_id, name=name, stuck=stuck):
            return f"  call {call_id} {name} did not stop: worker replaced ({stuck} stuck)"
        case ToolProgress(call_id=call_id, name=name, progress=done, total=total):
            of = f" of {total:g}" if total is not None else ""
            said = f": {event.message}" if event.message else ""
            return f"  call {call_id} {name} … {done:g}{of}{said}"
        case SubagentStarted(child=child, call_id=call_id, background=background):
            return f"┬ spawns {child} for call {call_id}" + (" (background)" if background else "")
        case SubagentFinished(child=child, completed=completed, reason=reason):
            # A remote child's reason names its URL and what went wrong (neutralised already).
            said = f": {event.detail}" if reason is FailReason.REMOTE_ERROR else ""
            return f"┴ {child} {'completed' if completed else f'failed ({reason}){said}'}"
        case TurnEnded(completed=True):
            return "turn completed"
        case TurnEnded(reason=reason, detail=detail):
            return f"turn failed: {reason}" + (f": {detail}" if detail else "")
        case JobSkipped(job=job, held=held):
            return f"skipped {job}: busy ({', '.join(held)})"
        case Compacted(before=before, after=after):
            return f"compacted {before} → {after} chars"
        case CompactionFailed(detail=detail):
            return f"compaction failed: {detail}"
        case MemoryWarning(detail=detail):
            return f"memory: {detail}"
        case TextDelta(text=text):
            return f"✎ {text}"
        case ApprovalRequested(call_id=call_id, tool=tool, arguments=arguments):
            flag = " (untrusted session)" if event.untrusted else ""
            return f"  call {call_id} {tool} waits for a person{flag}: {_preview(arguments)}"
        case ApprovalSettled(call_id=call_id, approved=True, note=note):
            return f"  call {call_id} approved" + (f": {note}" if note else "")
        case ApprovalSettled(call_id=call_id, reason=reason):
            return f"  call {call_id} declined" + (f": {reason}" if reason else "")
    return type(event).__name__


def _describe_server(event: RuntimeEvent) -> str:
    if isinstance(event, McpServerUp):
        skipped = f" (left out: {', '.join(event.skipped)})" if event.skipped else ""
        return f"up: {', '.join(event.tools) or 'no tools'}{skipped}"
    return f"down: {event.detail}"


def render_event(event: TurnEvent | RuntimeEvent) -> str:
    """One line for ``event``: time, session (indented by depth) and what happened; an MCP
    server's event names the server (``mcp files``) instead.

    Model and tool text in it (an answer's preview, tool names, details) is shown with every
    control character escaped, newlines included, so the line is one line and a model cannot
    drive the terminal it is printed on.
    """
    if isinstance(event, McpServerUp | McpServerDown):
        what = escape_controls(_describe_server(event), one_line=True)
        return f"{event.at:%H:%M:%S} mcp {escape_controls(event.server)}  {what}"
    indent = "│ " * depth_of(event.session)
    what = escape_controls(_describe(event), one_line=True)
    return f"{event.at:%H:%M:%S} {indent}{event.session}  {what}"


class EventPrinter:
    """Prints each event as :func:`render_event` renders it, one line each, on ``stream``;
    the ``TextDelta`` pieces of a streamed answer go on one line as they come (``✎ ...``), so
    the answer shows as it is written. Call it from one thread (the event bus's)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._writing: str | None = None  # the session whose text the open line shows

    def __call__(self, event: TurnEvent | RuntimeEvent) -> None:
        """Print ``event``."""
        out = self._stream
        if isinstance(event, TextDelta):
            if self._writing != event.session:
                self._end_line()
                out.write(render_event(msgspec.structs.replace(event, text="")))
                self._writing = event.session
            out.write(escape_controls(event.text, one_line=True))
        else:
            self._end_line()
            out.write(render_event(event) + "\n")
        out.flush()

    def _end_line(self) -> None:
        if self._writing is not None:
            self._stream.write("\n")
            self._writing = None
