"""``loopd repl --connect URL``: a thin Python console over a running service.

No runtime starts here: every helper is one request to the service's HTTP API
(actors.shells.client). The namespace holds ``client`` (the :class:`ServiceClient`) and the
helpers ``sessions()``, ``show(id)``, ``turn(session, text)``, ``send(session, text)``,
``cancel(session)``, ``approvals()``, ``approve(session, call_id)`` and
``deny(session, call_id, reason)``, named as in the local REPL.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

import msgspec

import messages
from actors.shells.client import ServiceClient
from actors.shells.render import EventPrinter, approvals_table
from actors.shells.repl import _Console, _enable_completion
from actors.shells.views import SessionRow, SessionTable
from messages import (
    ApprovalRefused,
    ApprovalRequested,
    ApprovalSettled,
    TurnOutcome,
    check_session_id,
    check_text,
    check_top_level_session,
)

__all__ = ["RemoteHelpers", "run_remote_repl"]


class _Approvals(tuple[ApprovalRequested, ...]):
    """The waiting calls; prints as ``loopd approvals``' table."""

    def __repr__(self) -> str:
        return approvals_table(tuple(self))


class RemoteHelpers:
    """The REPL's helpers, each one request to the service of ``client``."""

    def __init__(self, client: ServiceClient) -> None:
        self.client = client

    def sessions(self) -> SessionTable:
        """Every session the service knows, with its state (``running``, ``idle``,
        ``stored``)."""
        rows = [
            SessionRow(
                r["session"],
                r.get("slot"),
                r.get("turns"),
                r.get("untrusted"),
                r.get("messages"),
                r["state"],
            )
            for r in self.client.sessions()
        ]
        return SessionTable(rows)

    def show(self, session: str) -> dict[str, Any]:
        """One stored session as the service answers it (counters, children, transcript)."""
        return self.client.session(check_session_id(session))

    def turn(self, session: str, text: str, *, agent: str | None = None) -> TurnOutcome:
        """Run a turn through the service, printing its family's events; its outcome."""
        check_top_level_session(session)
        check_text(text, "the turn text")
        with self.client.events(session, EventPrinter(sys.stdout)):
            return self.client.turn(session, text, agent, None)

    def send(self, session: str, text: str, *, agent: str | None = None) -> None:
        """Start a turn and return at once (``"wait": false``)."""
        check_top_level_session(session)
        self.client.start_turn(session, text, agent)

    def cancel(self, session: str) -> tuple[str, ...]:
        """Cancel ``session``'s turn and its descendants'; the ids cancelled."""
        return self.client.cancel(check_session_id(session))

    def approvals(self) -> _Approvals:
        """The calls waiting for a person's decision."""
        return _Approvals(self.client.approvals())

    def approve(
        self, session: str, call_id: int, note: str | None = None
    ) -> ApprovalSettled | ApprovalRefused:
        """Say yes to a waiting call."""
        return self.client.decide(check_session_id(session), call_id, True, note or "", "")

    def deny(self, session: str, call_id: int, reason: str) -> ApprovalSettled | ApprovalRefused:
        """Say no to a waiting call; the model reads ``reason``."""
        return self.client.decide(check_session_id(session), call_id, False, "", reason)

    def namespace(self) -> dict[str, Any]:
        """The console's names."""
        names: dict[str, Any] = {"__name__": "__console__", "__doc__": None}
        names["client"] = self.client
        for name in ("sessions", "show", "turn", "send", "cancel", "approvals", "approve", "deny"):
            names[name] = getattr(self, name)
        names["messages"] = messages
        names["msgspec"] = msgspec
        return names


def run_remote_repl(client: ServiceClient, *, stdin: TextIO | None = None) -> int:
    """Run the console over ``client`` until Ctrl-D or ``exit()``; the exit status."""
    helpers = RemoteHelpers(client)
    namespace = helpers.namespace()
    text = (
        f"loopd repl: connected to {client.url} (no runtime here: each helper is a request)\n"
        "helpers: sessions() show(id) turn(session, text) send(session, text) cancel(session)\n"
        "         approvals() approve(session, call_id) deny(session, call_id, reason)"
    )
    if stdin is None:
        _enable_completion(namespace)
    try:
        _Console(namespace, stdin).interact(banner=text, exitmsg="")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0
