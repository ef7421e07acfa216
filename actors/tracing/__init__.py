"""Tracing: how a runtime reports its turns to a tracer.

``base`` is the interface (:class:`Tracer`, :class:`NoTracer`, ``Trace``); ``otel`` the
OpenTelemetry implementation (the ``otel`` extra), which the runtime picks when it is installed.

Imports: ``core`` and ``messages``; never an actor plane.
"""
