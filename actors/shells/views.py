"""What the REPL's helpers return: plain data that prints well.

``show("demo")`` returns a :class:`SessionView` and ``sessions()`` a :class:`SessionTable`;
the console prints them as text (``loopd sessions show`` and the sessions table), and code
reads their fields (``show("demo").record.turns``, ``sessions()[0].id``).
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from typing import Any

from actors.shells.render import table
from actors.stores.base import StoreBackend
from actors.stores.sqlite import StoredMessage
from messages import SessionRecord, check_session_id

__all__ = ["SessionRow", "SessionTable", "SessionView", "session_view"]


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


def session_view(store: StoreBackend, session: str) -> SessionView:
    """Read ``session`` from ``store``; its text is what ``loopd sessions show`` prints."""
    from actors.shells.cli import show_session

    check_session_id(session)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # one renderer for the CLI and the REPL
        show_session(store, session)
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
