"""The service plane: the actors that own a resource and serve the sessions by message.

``store`` (the one writer of the session store), ``model_service`` (every model request a task
of one asyncio loop), ``pool`` (the port tools' workers) with ``tool_loop`` (the event loop of
``async def`` tools: its own, or the application's), ``events`` (the event bus), ``scheduler``
(cron jobs and the heartbeat), ``mcp`` (every MCP server's session, one asyncio loop;
imported only with ``[mcp]``) and ``a2a`` (every remote A2A agent's task, one asyncio loop;
imported only with ``[agents.NAME] a2a_url``).

Imports: ``core``, ``dispatcher``, the adapters (``models``, ``stores``, ``tools``) and
``messages``; never ``actors.sessions``.
"""
