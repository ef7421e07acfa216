"""The core: loopd's own decisions and vocabulary, as plain functions and small state classes.

What lives here: the configuration and its checks (``config``, the door, with its tables in
``config_base``, ``config_model``, ``config_tables`` and ``config_jobs``; the ``[mcp.NAME]``
table in ``mcp_config``), tool dispatch and the id rules (``dispatch``: routes, argument checks,
child ids, depth and descent), the MCP tools listed now (``mcp_tools``), agent profiles
(``agents``), a turn's state machine (``turn``, its effects in ``turn_effects``, its limits in
``limits``, the session state it works on in ``session_state``), typed results (``output``),
the Context's decisions (``context_state``, its effects in ``context_effects``, the hold table
in ``holds``, background subagents in ``background``), the spawn rules (``spawn``), the token
budget (``budget``), usage sums (``usage``), the slot table (``slots``), which idle sessions to
passivate (``passivation``), which scheduled jobs are due (``schedule``), text hygiene
(``text``), a remote A2A child's decisions (``remote``), capped file reads (``files``) and
the bounded decode every door uses (``bounded``: size, depth, int64, valid Unicode).

Nothing here owns a thread, a socket or a database, and nothing talks to an actor: a test drives
it without threads. It imports only ``messages``, itself and small libraries (msgspec, croniter).
"""
