"""loopd as a service: the HTTP API over a running runtime (``loopd serve --listen``).

- ``settings``: what the service runs with, checked before anything starts (no web imports).
- ``events``: the fan-out of turn events to SSE clients, with a bounded replay buffer.
- ``auth``: the bearer-token gate.
- ``app``: the Starlette app over an :class:`~actors.aio.AsyncRuntime`.
- ``openapi``: the ``/v1/openapi.json`` document.
- ``server``: uvicorn on its own thread, started and stopped by ``loopd serve``.
- ``a2a``: the A2A endpoint under ``/a2a/`` (``[a2a] serve``; the ``a2a`` extra).

Starlette and uvicorn are the ``serve`` extra (``pip install '.[serve]'``); only ``settings``
imports without them.

Imports: anything below the shells.
"""
