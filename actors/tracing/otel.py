"""OpenTelemetry spans for loopd's turns (the ``loopd[otel]`` extra), after the GenAI
semantic conventions.

Each turn is an ``invoke_agent`` span, each model request a ``chat`` span and each tool call an
``execute_tool`` span under it. A child's turn span is a child of its parent's ``execute_tool``
span: the parent's session puts that span's context, as plain text, into the
:class:`~messages.SubagentRequest`, and the Context hands it on to the child's
:class:`~messages.RunTurn`. A turn started while the caller has a current span (a web request,
say) is a child of that span.

Spans use the global tracer provider unless one is given, so an application that sets up the
OpenTelemetry SDK sees loopd's spans next to its own.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

from opentelemetry import propagate, trace
from opentelemetry.environment_variables import OTEL_PYTHON_TRACER_PROVIDER
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from messages import (
    ApprovalRequested,
    ApprovalSettled,
    ModelAnswered,
    ModelRequestSent,
    SubagentStarted,
    ToolCallFinished,
    ToolCallStarted,
    TurnEnded,
    TurnEvent,
    TurnStarted,
)

if TYPE_CHECKING:
    from actors.core.config import Config
    from actors.tracing.base import Trace

__all__ = ["OtelTracer"]

_SCOPE = "loopd"
_UNKNOWN = object()


def _inject(span: Span) -> Trace:
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


class OtelTracer:
    """Turn events into OpenTelemetry spans (see the module's doc for the span tree).

    ``tracer_provider`` defaults to the global one. Thread-safe: sessions call it from their
    own threads.
    """

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer(_SCOPE, tracer_provider=tracer_provider)
        self._given = tracer_provider is not None
        # A provider named by the environment is loaded by the API on first use (see recording).
        self._from_env = OTEL_PYTHON_TRACER_PROVIDER in os.environ
        self._lock = threading.Lock()
        self._turns: dict[str, Span] = {}
        self._models: dict[tuple[str, int], Span] = {}
        self._tools: dict[tuple[str, int], Span] = {}
        self._agents: dict[str, str] = {}  # the profile of each session with a turn running
        self.model_name = ""
        self.model_names: dict[str, str] = {}
        """The ``model`` each agent profile's requests name, by profile."""

    def configure(self, config: Config) -> None:
        """Take each profile's model name for ``gen_ai.request.model`` and the chat spans:
        ``[agents.NAME] model``, else ``model.name``."""
        self.model_name = config.model.name
        self.model_names = {
            name: config.agent(name).model or config.model.name for name in config.agent_names()
        }

    def model_of(self, session: str) -> str:
        """The model ``session``'s requests name (its profile's, learned at its TurnStarted)."""
        with self._lock:
            agent = self._agents.get(session)
        if agent is None:
            return self.model_name
        return self.model_names.get(agent, self.model_name)

    def caller_trace(self) -> Trace | None:
        """The caller's current span as a carrier, or None when it has none."""
        if not trace.get_current_span().get_span_context().is_valid:
            return None
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        return carrier

    def call_trace(self, session: str, call_id: int) -> Trace | None:
        """The ``execute_tool`` span of ``session``'s call ``call_id`` as a carrier."""
        with self._lock:
            span = self._tools.get((session, call_id))
        return None if span is None else _inject(span)

    def recording(self) -> bool:
        """Whether spans go anywhere: a provider was given, or the application has set a global
        one. Until then (the API installed, no SDK set up) every event is passed over: a
        non-recording span per turn, request and call cost a child a tenth of its time."""
        if self._given:
            return True
        # The API's global, read directly while it has none: get_tracer_provider() then looks
        # the provider's variable up in os.environ, by raising and catching a KeyError, on
        # every event (4 % of the CPU of 256 turns at once). With that variable set, or an
        # API without the global, ask the API.
        provider = vars(trace).get("_TRACER_PROVIDER", _UNKNOWN)
        if provider is None and not self._from_env:
            return False
        if provider is None or provider is _UNKNOWN:
            provider = trace.get_tracer_provider()
        return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)

    def on_event(self, event: TurnEvent, trace_context: Trace | None) -> None:
        """Open or close the span ``event`` marks (nothing while no provider records)."""
        if not self.recording():
            return
        match event:
            case TurnStarted():
                self._turn_started(event, trace_context)
            case ModelRequestSent():
                model = self.model_of(event.session)
                self._child_span(
                    self._models,
                    (event.session, event.step),
                    f"chat {model}".strip(),
                    SpanKind.CLIENT,
                    {
                        "gen_ai.operation.name": "chat",
                        "gen_ai.request.model": model,
                        "loopd.session": event.session,
                        "loopd.step": event.step,
                        # no slot where the server has none (the openai backend)
                        **({} if event.slot is None else {"loopd.slot": event.slot}),
                    },
                )
            case ModelAnswered():
                self._model_answered(event)
            case ToolCallStarted():
                self._child_span(
                    self._tools,
                    (event.session, event.call_id),
                    f"execute_tool {event.name}",
                    SpanKind.INTERNAL,
                    {
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": event.name,
                        "gen_ai.tool.call.id": str(event.call_id),
                        "loopd.session": event.session,
                    },
                )
            case SubagentStarted():
                with self._lock:
                    span = self._tools.get((event.session, event.call_id))
                if span is not None:
                    span.set_attribute("loopd.child", event.child)
                    span.set_attribute("loopd.child.agent", event.agent)
            case ToolCallFinished():
                with self._lock:
                    span = self._tools.pop((event.session, event.call_id), None)
                if span is not None:
                    if event.denied:
                        span.set_status(Status(StatusCode.ERROR, "denied"))
                        span.set_attribute("error.type", "denied")
                    span.end()
            case TurnEnded():
                self._turn_ended(event)
            case ApprovalRequested() | ApprovalSettled():
                # A call that waits for a person: an event on its span, which stays open.
                with self._lock:
                    span = self._tools.get((event.session, event.call_id))
                if span is not None:
                    if isinstance(event, ApprovalRequested):
                        span.add_event(
                            "loopd.approval.requested", {"loopd.untrusted": event.untrusted}
                        )
                    else:
                        span.add_event("loopd.approval.settled", {"loopd.approved": event.approved})
            case _:
                pass

    def _turn_started(self, event: TurnStarted, carrier: Trace | None) -> None:
        parent = propagate.extract(carrier or {})
        with self._lock:
            self._agents[event.session] = event.agent
        span = self._tracer.start_span(
            f"invoke_agent {event.session}",
            context=parent,
            kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": event.agent,  # the profile; the session is the conversation
                "gen_ai.conversation.id": event.session,
                "gen_ai.request.model": self.model_of(event.session),
                "loopd.session": event.session,
                **({} if event.slot is None else {"loopd.slot": event.slot}),
            },
        )
        with self._lock:
            old = self._turns.pop(event.session, None)
            self._turns[event.session] = span
        if old is not None:  # a turn that never reported its end
            old.end()

    def _child_span(
        self,
        table: dict[tuple[str, int], Span],
        key: tuple[str, int],
        name: str,
        kind: SpanKind,
        attributes: dict[str, Any],
    ) -> None:
        with self._lock:
            turn = self._turns.get(key[0])
        context = trace.set_span_in_context(turn) if turn is not None else propagate.extract({})
        span = self._tracer.start_span(name, context=context, kind=kind, attributes=attributes)
        with self._lock:
            table[key] = span

    def _model_answered(self, event: ModelAnswered) -> None:
        with self._lock:
            span = self._models.pop((event.session, event.step), None)
        if span is None:
            return
        span.set_attribute(
            "gen_ai.response.finish_reasons", ["tool_calls" if event.tools else "stop"]
        )
        usage = event.usage
        if usage.requests:  # the server reported the tokens (requests is 0 when it did not)
            span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
        span.end()

    def _turn_ended(self, event: TurnEnded) -> None:
        with self._lock:
            turn = self._turns.pop(event.session, None)
            self._agents.pop(event.session, None)
            # Whatever is still open of this session's turn ends with it (a model error, a cancel).
            left = [
                table.pop(key)
                for table in (self._models, self._tools)
                for key in [k for k in table if k[0] == event.session]
            ]
        for span in left:
            span.set_status(Status(StatusCode.ERROR, "the turn ended first"))
        if turn is not None:  # None: refused before it began (busy, store error), no span
            if not event.completed:
                reason = str(event.reason) if event.reason is not None else "failed"
                turn.set_attribute("error.type", reason)
                turn.set_status(Status(StatusCode.ERROR, event.detail or reason))
            left.append(turn)
        _end_all(left)


def _end_all(spans: list[Span]) -> None:
    """End every span, even when a span processor raises at one of them; the first error is
    raised after the others have ended (the runtime's tracer guard logs it)."""
    failed: BaseException | None = None
    for span in spans:
        try:
            span.end()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # SystemExit too: the other spans still end
            failed = failed or exc
    if failed is not None:
        raise failed
