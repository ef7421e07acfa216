"""The session plane: the Context actor and the session actors, on the shared dispatcher.

``context`` (:class:`ContextActor`, the shell of ``actors.core.context_state``: holds, spawns,
routing of outcomes) and ``session`` (:class:`SessionActor`, the shell of ``actors.core.turn``:
one session's turns), and ``remote`` (:class:`RemoteSessionActor`, a child that is a proxy of
one remote A2A task). They carry out what ``actors.core`` decides and talk to the services only
by address and message.

Imports: ``core``, ``dispatcher``, the adapters' protocols (``tracing``, ``stores``) and
``messages``; never ``actors.services``.
"""
