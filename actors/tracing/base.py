"""Tracing hooks: how a runtime reports its turns to a tracer, OpenTelemetry when installed.

A :class:`Tracer` sees every turn event in the thread of the actor that emits it, before the
event goes to the bus, so a span exists by the time a message that names it leaves the actor.
Trace context crosses actors only as plain data: a ``trace`` dict of text (W3C
``traceparent``) in :class:`~messages.StartTurn`, :class:`~messages.SubagentRequest` and
:class:`~messages.RunTurn`.

This module imports nothing of OpenTelemetry: the runtime's ``default_tracer`` loads
:mod:`actors.tracing.otel` only when the ``opentelemetry`` package is installed (``loopd[otel]``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from messages import TurnEvent

if TYPE_CHECKING:
    from actors.core.config import Config

__all__ = ["NoTracer", "Trace", "Tracer"]

Trace = dict[str, str]
"""Trace context as plain data: propagation headers such as ``traceparent``."""


class Tracer(Protocol):
    """What a runtime tells a tracer. Every method is called from actor threads, concurrently,
    and must neither block nor raise."""

    def configure(self, config: Config) -> None:
        """Called once by ``Runtime.start`` with the runtime's configuration."""

    def caller_trace(self) -> Trace | None:
        """The trace context of the code that starts a turn now (``send_turn``, ``run_turn``)."""

    def on_event(self, event: TurnEvent, trace: Trace | None) -> None:
        """``event`` is being emitted; ``trace`` is the context its session's turn began with."""

    def call_trace(self, session: str, call_id: int) -> Trace | None:
        """The trace context of ``session``'s tool call ``call_id``, for the child it spawns."""


class NoTracer:
    """A tracer that does nothing: the default without OpenTelemetry."""

    def configure(self, config: Config) -> None:
        """Nothing to set up."""

    def caller_trace(self) -> Trace | None:
        """No context."""
        return None

    def on_event(self, event: TurnEvent, trace: Trace | None) -> None:
        """Ignore the event."""

    def call_trace(self, session: str, call_id: int) -> Trace | None:
        """No context."""
        return None
