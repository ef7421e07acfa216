"""The core: loopd's own decisions and vocabulary, as plain functions and small state classes.

What lives here: the configuration and its checks (``config``), tool dispatch and the id rules
(``dispatch``: routes, argument checks, child ids, depth and descent), agent profiles
(``agents``), a turn's state machine (``turn``), the spawn rules (``spawn``), the token budget
(``budget``), usage sums (``usage``), the slot table (``slots``), which idle sessions to
passivate (``passivation``), text hygiene (``text``), capped file reads (``files``), the
``[mcp.NAME]`` table (``mcp_config``) and the MCP tools listed now (``mcp_tools``).

Nothing here owns a thread, a socket or a database, and nothing talks to an actor: a test drives
it without threads. It imports only ``messages``, itself and small libraries (msgspec, croniter).
"""
