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
from actors.core.output import ANSWER_BY_CALLING, is_wrapped
from actors.core.text import escape_controls
from actors.core.usage import SUMMARY, add_usage, format_usage, total_usage
from actors.shells.render import table
from actors.stores.base import SessionNotFound, StoreBackend, StoredMessage
from messages import CallDecision, ChatMessage, SessionRecord, Usage, check_session_id

STATES = ("idle", "running", "waiting", "completed", "failed", "cancelled")
"""The one state vocabulary of the page, ``loopd sessions`` and ``GET /v1/sessions``."""

__all__ = [
    "STATES",
    "SessionRow",
    "SessionTable",
    "SessionView",
    "ShownSession",
    "decision_text",
    "print_shown",
    "print_shown_json",
    "session_backend",
    "session_listing",
    "session_view",
    "sessions_table",
    "show_session",
    "show_session_json",
    "shown_from_store",
    "slot_text",
    "state_text",
    "stored_state",
    "turn_outputs",
    "turn_spans",
    "turn_usage",
    "typed_wrapped",
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


def _begins_turn(message: ChatMessage, before: ChatMessage | None) -> bool:
    """True if ``message`` begins a turn: a user message, but not a compaction summary, not
    the nudge of a typed turn (``Answer by calling final_answer.``), and not a background
    child's report (named ``subagent``) delivered into a running turn (after a tool result or
    another report, where a report that starts a turn of its own follows a finished answer)."""
    if message.role != "user":
        return False
    content = message.content or ""
    if content.startswith(SUMMARY) or content == ANSWER_BY_CALLING:
        return False
    if message.name == "subagent" and before is not None:
        return before.role == "assistant" and not before.tool_calls
    return True


def turn_spans(history: list[StoredMessage]) -> list[list[StoredMessage]]:
    """``history`` cut into turns, each from the message that began it (see
    :func:`_begins_turn`); what comes before the first turn (a compaction summary) is left
    out."""
    spans: list[list[StoredMessage]] = []
    before: ChatMessage | None = None
    for stored in history:
        if _begins_turn(stored.message, before):
            spans.append([])
        if spans:
            spans[-1].append(stored)
        before = stored.message
    return spans


def turn_outputs(history: list[StoredMessage], wrapped: bool = False) -> list[object]:
    """The validated output of each turn of ``history`` (None for a text turn): the arguments
    of the turn's ``final_answer`` call that was not denied, the inner ``value`` when the
    session's schema is ``wrapped`` (not an object)."""
    outputs: list[object] = []
    for span in turn_spans(history):
        results = {
            m.message.tool_call_id: m.message.content or ""
            for m in span
            if m.message.role == "tool"
        }
        found: object = None
        for stored in span:
            for call in stored.message.tool_calls:
                text = results.get(call.id)
                if call.name != "final_answer" or text is None or text.startswith("Denied:"):
                    continue
                try:
                    value = msgspec.json.decode(call.arguments)
                except msgspec.DecodeError:
                    continue
                found = value.get("value") if wrapped and isinstance(value, dict) else value
        outputs.append(found)
    return outputs


def turn_usage(store: _Reader, session: str, *, _depth: int = 0) -> list[tuple[Usage, Usage]]:
    """``(own, with children)`` usage of each stored turn of ``session``, in order.

    ``own`` sums the usage stored with the session's answers in that turn; ``with children``
    adds every child that turn spawned (``sub-<session>-<call id>``), their children included.
    A turn begins where :func:`turn_spans` says: a typed turn's nudge, a background report
    delivered into a running turn and a compaction summary are parts of the turn they are in.
    Compacted messages count (they were spent); a summary request's own tokens are not stored,
    so not counted.
    """
    turns: list[tuple[Usage, Usage]] = []
    for span in turn_spans(store.history(session)):
        own, total = _span_usage(store, session, span, _depth)
        turns.append((own, total))
    return turns


def _span_usage(
    store: _Reader, session: str, span: list[StoredMessage], _depth: int
) -> tuple[Usage, Usage]:
    own = total = Usage()
    for stored in span:
        message = stored.message
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
    return own, total


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
    history = store.history(session)
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
        history=tuple(history),
    )


def typed_wrapped(record: SessionRecord) -> bool:
    """True if ``record``'s session is typed with a schema that is not an object (its
    ``final_answer`` wraps it as ``value``)."""
    spec = next((t for t in record.baseline.tools if t.name == "final_answer"), None)
    return spec is not None and is_wrapped(spec)


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


def decision_text(decision: CallDecision) -> str:
    """How a call that waited was decided, for a person: ``approved (note: ship it)``,
    ``declined: not on a Friday``."""
    if decision.approved:
        return "approved" + (f" (note: {decision.note})" if decision.note else "")
    return f"declined: {decision.reason or ''}"


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
    # A typed turn's output: its final_answer's arguments, as the model wrote them.
    for number, output in enumerate(turn_outputs(list(shown.history)), 1):
        if output is not None:
            shown_output = msgspec.json.encode(output).decode()
            print(escape_controls(f"  turn {number} output: {shown_output}", one_line=True))
    print()
    for stored in shown.history:
        m = stored.message
        mark = " (compacted)" if stored.compacted else ""
        who = m.role + (f" {m.name}" if m.name else "")
        if m.tool_call_id is not None:
            who += f" #{m.tool_call_id}"
        if m.untrusted:
            mark += " (untrusted)"
        print(escape_controls(f"[{stored.seq}] {who}{mark}", one_line=True))
        if m.decision is not None:
            print(escape_controls(f"    {decision_text(m.decision)}", one_line=True))
        if m.content:
            for line in m.content.split("\n"):
                print(f"    {escape_controls(line)}")
        for call in m.tool_calls:
            shown_call = f"    → #{call.id} {call.name}({call.as_written})"
            print(escape_controls(shown_call, one_line=True))


def stored_state(turns: int, history: list[StoredMessage], *, waiting: bool = False) -> str:
    """A session's state as its store tells it (no runtime runs it now): ``waiting`` when a
    call of its own waits for a person, ``idle`` before its first turn, ``completed`` when
    its last turn ended in an answer, else ``failed`` (a turn cut off before its answer: the
    store keeps no outcome, so a cancel reads as ``failed`` here; a running service knows
    better from the events)."""
    if waiting:
        return "waiting"
    if turns == 0 or not history:
        return "idle"
    last = history[-1].message
    if last.role == "assistant" and not last.tool_calls:
        return "completed"
    return "failed"


def spawned_in_background(parent_history: list[StoredMessage], call_id: int) -> bool:
    """True if the parent's ``subagent`` call ``call_id`` asked for a background child."""
    for stored in parent_history:
        for call in stored.message.tool_calls:
            if call.id != call_id:
                continue
            try:
                arguments = msgspec.json.decode(call.arguments)
            except msgspec.DecodeError:
                return False
            if call.name == "call_tool" and isinstance(arguments, dict):
                arguments = arguments.get("arguments")
            return isinstance(arguments, dict) and arguments.get("background") is True
    return False


def _call_of(child: str, parent: str) -> int | None:
    """The call id that spawned ``child`` of ``parent`` (``sub-<parent>-<id>``)."""
    tail = child[len("sub-") + len(parent) + 1 :]
    return int(tail) if child.startswith(f"sub-{parent}-") and tail.isdigit() else None


def session_listing(
    store: StoreBackend,
    config: Config | None = None,
    *,
    running: frozenset[str] = frozenset(),
    known: dict[str, tuple[str, bool]] | None = None,
) -> list[dict[str, Any]]:
    """Every stored session as ``GET /v1/sessions`` lists it (and ``loopd sessions``): id,
    agent, parent, ``state`` (:data:`STATES`), ``background``, slot (None where the profile's
    server has no slots), turns, untrusted, messages, times.

    ``known``: what a running service saw of a session in the events (its state, and whether
    it runs in the background), which wins over the store; ``running``: the sessions a
    runtime runs now that ``known`` does not name. A session neither names is read from the
    store (:func:`stored_state`; its waiting calls from the stored approvals).
    """
    known = known or {}
    infos = store.list_sessions()
    waiting = {a.request.session for a in store.approvals() if a.approved is None}
    histories: dict[str, list[StoredMessage]] = {}

    def history(session: str) -> list[StoredMessage]:
        if session not in histories:
            try:
                histories[session] = store.history(session)
            except SessionNotFound:
                histories[session] = []
        return histories[session]

    rows: list[dict[str, Any]] = []
    for i in infos:
        if i.id in known:
            state, background = known[i.id]
        else:
            if i.id in waiting:
                state = "waiting"
            elif i.id in running:
                state = "running"
            else:
                state = stored_state(i.turns, history(i.id))
            call = _call_of(i.id, i.parent) if i.parent else None
            background = call is not None and spawned_in_background(history(i.parent or ""), call)
        backend = session_backend(i.agent, config)
        rows.append(
            {
                "session": i.id,
                "agent": i.agent,
                "parent": i.parent,
                "state": state,
                "background": background,
                "slot": None if backend == "openai" else i.slot,
                "turns": i.turns,
                "untrusted": i.untrusted,
                "messages": i.messages,
                "created_at": i.created_at,
                "updated_at": i.updated_at,
            }
        )
    return rows


def state_text(row: dict[str, Any]) -> str:
    """A listed session's state as a person reads it: ``completed``, ``running background``."""
    state = str(row.get("state") or "-")
    return state + (" background" if row.get("background") else "")


def sessions_table(rows: list[dict[str, Any]]) -> str:
    """``loopd sessions``: the rows of :func:`session_listing` (or of ``GET /v1/sessions``) as
    a table; the slot is ``-`` where the server has none; ``no sessions`` when empty."""
    if not rows:
        return "no sessions"
    cells = [
        [
            str(r["session"]),
            str(r.get("agent") or "-"),
            state_text(r),
            "-" if r.get("slot") is None else str(r["slot"]),
            str(r.get("turns", "-")),
            "yes" if r.get("untrusted") else "no",
            str(r.get("messages", "-")),
            str(r.get("updated_at") or "-"),
        ]
        for r in rows
    ]
    header = ["SESSION", "AGENT", "STATE", "SLOT", "TURNS", "UNTRUSTED", "MESSAGES", "UPDATED"]
    return table(cells, header)
