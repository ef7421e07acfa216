"""The service's A2A endpoint (``[a2a] serve = true``), built with the official SDK (the
``a2a`` extra, ``pip install '.[a2a]'``), imported only when configured.

- ``mapping``: what a turn is in A2A terms, as plain functions (no SDK, no I/O): a session is a
  context, a turn a task, a call waiting for a person ``INPUT_REQUIRED``.
- ``store``: the SDK's task store over the session store's ``a2a_tasks`` table.
- ``executor``: the SDK's executor: a task's turn, followed from the runtime's events.
- ``endpoint``: the agent card, the JSON-RPC route, the bounded door and the checks a message
  passes first; :func:`~actors.shells.service.a2a.endpoint.mount_a2a` mounts them.

Imports: the SDK, and anything below the shells.
"""
