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

import logging
import threading
from typing import TYPE_CHECKING, Protocol

from messages import TurnEvent

if TYPE_CHECKING:
    from actors.core.config import Config

__all__ = ["GuardedTracer", "NoTracer", "Trace", "Tracer", "guarded"]

log = logging.getLogger("loopd.tracing")

Trace = dict[str, str]
"""Trace context as plain data: propagation headers such as ``traceparent``."""


class Tracer(Protocol):
    """What a runtime tells a tracer. Every method is called from actor threads, concurrently,
    and must not block. It should not raise either; what it raises anyway (any
    ``BaseException`` but ``KeyboardInterrupt``) is caught, logged once and ignored (the runtime
    calls it through a :class:`GuardedTracer`)."""

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


class GuardedTracer:
    """Another tracer, made safe: whatever it raises (a span processor or exporter that fails,
    a broken propagator), any ``BaseException`` but ``KeyboardInterrupt`` (``SystemExit``
    included), is caught, so telemetry never changes a turn's outcome or what is stored.

    The first failure is logged as a warning with its traceback; later ones are only counted
    (:attr:`failures`) and logged at debug level, so a tracer that fails on every event does not
    flood the log. The tracer is still called after a failure: a fault of one span does not end
    tracing. The runtime puts every tracer but :class:`NoTracer` behind one of these; the tracer
    it was given is :attr:`inner`.
    """

    def __init__(self, inner: Tracer) -> None:
        self.inner = inner
        self.failures = 0
        self._lock = threading.Lock()

    def _failed(self, what: str) -> None:
        with self._lock:
            self.failures += 1
            first = self.failures == 1
        name = type(self.inner).__name__
        if first:
            log.warning(
                "loopd: the tracer %s failed in %s; the turn goes on without that span "
                "(later failures of this tracer are counted, not logged)",
                name,
                what,
                exc_info=True,
            )
        else:
            log.debug("loopd: the tracer %s failed in %s again", name, what, exc_info=True)

    def configure(self, config: Config) -> None:
        """The inner tracer's ``configure``; a failure is logged and tracing goes on."""
        try:
            self.inner.configure(config)
        except KeyboardInterrupt:
            raise
        except BaseException:  # SystemExit too: an optional part never ends a turn
            self._failed("configure")

    def caller_trace(self) -> Trace | None:
        """The inner tracer's answer, or None when it raises."""
        try:
            return self.inner.caller_trace()
        except KeyboardInterrupt:
            raise
        except BaseException:  # SystemExit too: an optional part never ends a turn
            self._failed("caller_trace")
            return None

    def on_event(self, event: TurnEvent, trace: Trace | None) -> None:
        """Hand ``event`` on; what the inner tracer raises stops here."""
        try:
            self.inner.on_event(event, trace)
        except KeyboardInterrupt:
            raise
        except BaseException:  # SystemExit too: an optional part never ends a turn
            self._failed(f"on_event({type(event).__name__})")

    def call_trace(self, session: str, call_id: int) -> Trace | None:
        """The inner tracer's answer, or None when it raises (the child's span is then a
        root)."""
        try:
            return self.inner.call_trace(session, call_id)
        except KeyboardInterrupt:
            raise
        except BaseException:  # SystemExit too: an optional part never ends a turn
            self._failed("call_trace")
            return None


def guarded(tracer: Tracer) -> Tracer:
    """``tracer`` behind a :class:`GuardedTracer`; :class:`NoTracer` (which cannot fail) and a
    tracer already guarded as they are."""
    if isinstance(tracer, NoTracer | GuardedTracer):
        return tracer
    return GuardedTracer(tracer)
