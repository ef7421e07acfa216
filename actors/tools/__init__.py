"""Port tools: the external tools a runtime is given, and what a tool sees of its call.

``tool`` (:class:`PortTool` and the pool's job handlers for it), ``context`` (:class:`ToolContext`
and the ticket a call travels with), ``typed`` (``@port_tool`` on typed functions) and ``loader``
(``--tools module:NAME``). The worker actors that run them are in ``actors.services.pool``.
``mcp`` is the adapter to MCP servers (the ``mcp`` SDK, extra ``loopd[mcp]``); the MCP service
in ``actors.services.mcp`` drives it.

Imports: ``core`` and ``messages``; never an actor plane.
"""
