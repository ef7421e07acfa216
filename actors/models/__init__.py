"""Model clients: the adapter between a model request and an OpenAI-compatible server.

``base`` is the interface (:class:`ChatModel`, :class:`AsyncChatModel`, :class:`ModelFailure`);
beside it ``wire`` (request bodies and answers, sans I/O), ``stream`` (server-sent events to an
answer, sans I/O), ``http`` (the HTTP client, on aiohttp),
``endpoints`` (one client per profile endpoint), ``llama`` (what llama.cpp says of itself) and
``offline`` (the test switch that forbids real models).

Imports: ``core`` and ``messages``; never an actor plane.
"""
