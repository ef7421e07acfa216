"""Stored sessions as a person sees them: ``loopd sessions show`` and the REPL's views.

``show("demo")`` returns a :class:`SessionView` and ``sessions()`` a :class:`SessionTable`;
the console prints them as text (``loopd sessions show`` and the sessions table), and code
reads their fields (``show("demo").record.turns``, ``sessions()[0].id``).
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from actors.core.config import Config
from actors.core.text import escape_controls
from actors.core.usage import SUMMARY, add_usage, format_usage, total_usage
from actors.shells.render import table
from actors.stores.base import SessionNotFound, StoreBackend, StoredMessage
from messages import SessionRecord, Usage, check_session_id

__all__ = [
    "SessionRow",
    "SessionTable",
    "SessionView",
    "session_view",
    "show_session",
    "show_session_json",
    "slot_text",
    "turn_usage",
]


class _Pretty:
    """Printing: the console shows ``repr``; IPython's pretty printer shows the same text."""

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


@dataclass(frozen=True, repr=False)
class SessionView(_Pretty):
    """One stored session: its record, its children and every stored message."""

    record: SessionRecord
    children: tuple[str, ...]
    history: tuple[StoredMessage, ...]
    text: str
    """The session as ``loopd sessions show`` prints it."""

    def __repr__(self) -> str:
        return self.text.rstrip("\n")


def session_view(store: StoreBackend, session: str, config: Config | None = None) -> SessionView:
    """Read ``session`` from ``store``; its text is what ``loopd sessions show`` prints (with
    ``config``, a session whose profile has no slots shows none, as there)."""
    check_session_id(session)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # one renderer for the CLI and the REPL
        show_session(store, session, config)
    return SessionView(
        record=store.open(session),
        children=tuple(store.children(session)),
        history=tuple(store.history(session)),
        text=out.getvalue(),
    )


@dataclass(frozen=True)
class SessionRow:
    """One session of :class:`SessionTable`; ``state`` is ``held``, ``live`` or ``-``."""

    id: str
    slot: int | None
    turns: int | None
    untrusted: bool | None
    messages: int | None
    state: str


class SessionTable(tuple[SessionRow, ...], _Pretty):
    """The sessions, as rows; prints as a table."""

    def __repr__(self) -> str:
        if not self:
            return "no sessions"

        def cell(value: object) -> str:
            if value is None:
                return "-"
            if isinstance(value, bool):
                return "yes" if value else "no"
            return str(value)

        rows = [
            [r.id, cell(r.slot), cell(r.turns), cell(r.untrusted), cell(r.messages), r.state]
            for r in self
        ]
        return table(rows, ["SESSION", "SLOT", "TURNS", "UNTRUSTED", "MESSAGES", "STATE"])


class _Reader(Protocol):
    def history(self, id: str) -> list[StoredMessage]: ...


def turn_usage(store: _Reader, session: str, *, _depth: int = 0) -> list[tuple[Usage, Usage]]:
    """``(own, with children)`` usage of each stored turn of ``session``, in order.

    ``own`` sums the usage stored with the session's answers in that turn; ``with children``
    adds every child that turn spawned (``sub-<session>-<call id>``), their children included.
    A turn begins at each user message that is not a compaction summary. Compacted messages
    count (they were spent); a summary request's own tokens are not stored, so not counted.
    """
    turns: list[tuple[Usage, Usage]] = []
    own = total = Usage()
    started = False
    for stored in store.history(session):
        message = stored.message
        if message.role == "user" and not (message.content or "").startswith(SUMMARY):
            if started:
                turns.append((own, total))
            own = total = Usage()
            started = True
            continue
        if message.usage is not None:
            own = add_usage(own, message.usage)
            total = add_usage(total, message.usage)
        for call in message.tool_calls:
            child = f"sub-{session}-{call.id}"
            if call.name not in ("subagent", "call_tool") or len(child) > 64 or _depth > 64:
                continue
            try:
                below = turn_usage(store, child, _depth=_depth + 1)
            except SessionNotFound:
                continue
            total = add_usage(total, total_usage(t for _, t in below))
    if started:
        turns.append((own, total))
    return turns


def show_session_json(store: StoreBackend, session: str) -> int:
    """``loopd sessions show ID --json``: the session on the first line, then one line per
    stored message (``seq``, ``compacted``, ``message``). The message is in loopd's own shape,
    a :class:`~messages.ChatMessage` as msgspec encodes it (``"type": "ChatMessage"``, tool
    calls as ``ToolCall`` with a numeric ``id``, ``usage``), not the chat-completions one."""
    record = store.open(check_session_id(session))
    head = {
        "id": record.id,
        "slot": record.slot,
        "turns": record.turns,
        "untrusted": record.untrusted,
        "next_call_id": record.next_call_id,
        "children": list(store.children(session)),
    }
    print(msgspec.json.encode(head).decode())
    for stored in store.history(session):
        line = {"seq": stored.seq, "compacted": stored.compacted, "message": stored.message}
        print(msgspec.json.encode(line).decode())
    return 0


def slot_text(record: SessionRecord, config: Config | None) -> str:
    """The slot ``sessions show`` prints for ``record``: its stored slot, or ``-`` when its
    profile's server speaks the ``openai`` backend, which has no slots (the stored number is
    never sent). Without ``config`` (or for a profile no longer configured, ``model.backend``
    decides) the stored slot."""
    if config is not None:
        backend = config.model.backend
        with contextlib.suppress(KeyError):
            backend = config.agent(record.agent).backend or backend
        if backend == "openai":
            return "-"
    return str(record.slot)


def show_session(store: StoreBackend, session: str, config: Config | None = None) -> int:
    """Print one stored session: its counters, children and transcript.

    Model and tool text is shown with control characters escaped (``\\x1b``), so a stored
    answer cannot drive the terminal; the store is only read. With ``config``, the slot of a
    session whose profile has no slots (the ``openai`` backend) is ``-``.
    """
    record = store.open(check_session_id(session))
    children = store.children(session)
    print(f"session   {record.id}")
    print(f"slot      {slot_text(record, config)}")
    print(f"agent     {record.agent}")
    print(f"turns     {record.turns}")
    print(f"untrusted {'yes' if record.untrusted else 'no'}")
    print(f"next call {record.next_call_id}")
    print(f"children  {', '.join(children) if children else '-'}")
    turns = turn_usage(store, session)
    own = total_usage(o for o, _ in turns)
    print(f"usage     {format_usage(own)}")
    print(f"  with children {format_usage(total_usage(t for _, t in turns))}")
    for number, (mine, everything) in enumerate(turns, 1):
        line = f"  turn {number}: {format_usage(mine)}"
        if everything != mine:
            line += f"; with children {format_usage(everything)}"
        print(line)
    print()
    for stored in store.history(session):
        m = stored.message
        mark = " (compacted)" if stored.compacted else ""
        who = m.role + (f" {m.name}" if m.name else "")
        if m.tool_call_id is not None:
            who += f" #{m.tool_call_id}"
        print(escape_controls(f"[{stored.seq}] {who}{mark}", one_line=True))
        if m.content:
            for line in m.content.split("\n"):
                print(f"    {escape_controls(line)}")
        for call in m.tool_calls:
            shown = f"    → #{call.id} {call.name}({call.as_written})"
            print(escape_controls(shown, one_line=True))
    return 0
