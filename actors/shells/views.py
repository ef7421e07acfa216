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
    "ShownSession",
    "print_shown",
    "print_shown_json",
    "session_backend",
    "session_view",
    "show_session",
    "show_session_json",
    "shown_from_store",
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


@dataclass(frozen=True)
class ShownSession:
    """What ``loopd sessions show`` prints about one session: read from a store
    (:func:`shown_from_store`), or from a service's ``GET /v1/sessions/{id}``
    (actors.shells.client), so a served home shows exactly what its store does."""

    id: str
    slot: int
    backend: str | None
    """The model backend of the session's profile (None: not known, the slot is shown)."""
    agent: str
    turns: int
    untrusted: bool
    next_call_id: int
    children: tuple[str, ...]
    turn_usage: tuple[tuple[Usage, Usage], ...]
    """``(own, with children)`` of each stored turn (:func:`turn_usage`)."""
    history: tuple[StoredMessage, ...]
    """Every stored message, compacted ones included, with its ``seq``."""


def session_backend(agent: str, config: Config | None) -> str | None:
    """The model backend ``agent``'s profile speaks by ``config`` (``model.backend`` for a
    profile no longer configured); None without ``config``."""
    if config is None:
        return None
    backend = config.model.backend
    with contextlib.suppress(KeyError):
        backend = config.agent(agent).backend or backend
    return backend


def shown_from_store(
    store: StoreBackend, session: str, config: Config | None = None
) -> ShownSession:
    """``session`` as ``loopd sessions show`` prints it, read from ``store`` (only read)."""
    record = store.open(check_session_id(session))
    return ShownSession(
        id=record.id,
        slot=record.slot,
        backend=session_backend(record.agent, config),
        agent=record.agent,
        turns=record.turns,
        untrusted=record.untrusted,
        next_call_id=record.next_call_id,
        children=tuple(store.children(session)),
        turn_usage=tuple(turn_usage(store, session)),
        history=tuple(store.history(session)),
    )


def show_session_json(store: StoreBackend, session: str) -> int:
    """``loopd sessions show ID --json`` from ``store`` (see :func:`print_shown_json`)."""
    print_shown_json(shown_from_store(store, session))
    return 0


def print_shown_json(shown: ShownSession) -> None:
    """``loopd sessions show ID --json``: the session on the first line, then one line per
    stored message (``seq``, ``compacted``, ``message``). The message is in loopd's own shape,
    a :class:`~messages.ChatMessage` as msgspec encodes it (``"type": "ChatMessage"``, tool
    calls as ``ToolCall`` with a numeric ``id``, ``usage``), not the chat-completions one."""
    head = {
        "id": shown.id,
        "slot": shown.slot,
        "turns": shown.turns,
        "untrusted": shown.untrusted,
        "next_call_id": shown.next_call_id,
        "children": list(shown.children),
    }
    print(msgspec.json.encode(head).decode())
    for stored in shown.history:
        line = {"seq": stored.seq, "compacted": stored.compacted, "message": stored.message}
        print(msgspec.json.encode(line).decode())


def slot_text(record: SessionRecord, config: Config | None) -> str:
    """The slot ``sessions show`` prints for ``record``: its stored slot, or ``-`` when its
    profile's server speaks the ``openai`` backend, which has no slots (the stored number is
    never sent). Without ``config`` (or for a profile no longer configured, ``model.backend``
    decides) the stored slot."""
    return _slot(record.slot, session_backend(record.agent, config))


def _slot(slot: int, backend: str | None) -> str:
    return "-" if backend == "openai" else str(slot)


def show_session(store: StoreBackend, session: str, config: Config | None = None) -> int:
    """Print one stored session: its counters, children and transcript (see
    :func:`print_shown`). With ``config``, the slot of a session whose profile has no slots
    (the ``openai`` backend) is ``-``."""
    print_shown(shown_from_store(store, session, config))
    return 0


def print_shown(shown: ShownSession) -> None:
    """Print one session: its counters, children, usage (each turn's too) and every stored
    message with its number, compacted ones marked.

    Model and tool text is shown with control characters escaped (``\\x1b``), so a stored
    answer cannot drive the terminal.
    """
    print(f"session   {shown.id}")
    print(f"slot      {_slot(shown.slot, shown.backend)}")
    print(f"agent     {shown.agent}")
    print(f"turns     {shown.turns}")
    print(f"untrusted {'yes' if shown.untrusted else 'no'}")
    print(f"next call {shown.next_call_id}")
    print(f"children  {', '.join(shown.children) if shown.children else '-'}")
    turns = shown.turn_usage
    own = total_usage(o for o, _ in turns)
    print(f"usage     {format_usage(own)}")
    print(f"  with children {format_usage(total_usage(t for _, t in turns))}")
    for number, (mine, everything) in enumerate(turns, 1):
        line = f"  turn {number}: {format_usage(mine)}"
        if everything != mine:
            line += f"; with children {format_usage(everything)}"
        print(line)
    print()
    for stored in shown.history:
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
            shown_call = f"    → #{call.id} {call.name}({call.as_written})"
            print(escape_controls(shown_call, one_line=True))
