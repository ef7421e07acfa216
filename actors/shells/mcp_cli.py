"""``loopd mcp``: each ``[mcp.NAME]`` server's state, seen from a shell.

It starts the configured servers the way ``Runtime.start`` does (one MCP service, each server
given its ``timeout_s``, all at once), reads what each said (up with its tools and the names
it left out, or down and why), stops them all and prints the table, or one JSON line a server
with ``--json``. No runtime, store or home is touched, so it works beside a running one. Exit
0 when every server came up, 1 otherwise (2 for a config it cannot read, as every command).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from actors.core.config import Config
    from messages import McpServerDown, McpServerUp

__all__ = ["add_commands", "cmd_mcp", "server_states"]

ConfigOf = Callable[[argparse.Namespace], "Config"]
State: TypeAlias = "McpServerUp | McpServerDown | None"


def server_states(config: Config) -> dict[str, State]:
    """Start ``config``'s MCP servers, wait for each as ``Runtime.start`` does, stop them, and
    return each one's state by name (None: still starting when the wait ended)."""
    # Here, not above: building the ``loopd`` parser imports this module.
    from actors.core.dispatch import Registry
    from actors.core.mcp_tools import McpCatalog
    from actors.dispatcher.directory import Directory
    from actors.runtime.parts import _mcp_service

    service = _mcp_service(config, Registry(mcp=McpCatalog(config.mcp)), Directory())
    if service is None:
        return {}
    service.start()
    try:
        service.wait_ready(max(s.timeout_s for s in config.mcp.values()))
        found = service.servers()
    finally:
        service.stop()
    return {name: found.get(name) for name in sorted(config.mcp)}


def _row(name: str, state: State) -> dict[str, Any]:
    """One line of ``loopd mcp --json``."""
    from messages import McpServerUp

    if isinstance(state, McpServerUp):
        return {"server": name, "state": "up", "tools": state.tools, "skipped": state.skipped}
    why = "it did not come up within its timeout_s" if state is None else state.detail
    return {"server": name, "state": "down", "why": why}


def cmd_mcp(args: argparse.Namespace, config: Config) -> int:
    """Print each MCP server's state; 0 if all are up, 1 otherwise."""
    import msgspec

    from actors.core.text import escape_controls

    rows = [_row(name, state) for name, state in server_states(config).items()]
    if args.json:
        for row in rows:
            print(msgspec.json.encode(row).decode())
    elif not rows:
        print("no MCP servers: the config has no [mcp.NAME] table")
    else:
        from actors.shells.render import table

        cells = [
            [r["server"], "up", ", ".join(r["tools"]) or "no tools", ", ".join(r["skipped"])]
            if r["state"] == "up"
            else [r["server"], "down", r["why"], ""]
            for r in rows
        ]
        print(escape_controls(table(cells, ["NAME", "STATE", "TOOLS / WHY", "SKIPPED"])))
    return 0 if all(r["state"] == "up" for r in rows) else 1


def add_commands(
    sub: Any, common: Callable[[argparse.ArgumentParser], None], config_of: ConfigOf
) -> None:
    """Add ``loopd mcp`` to the ``loopd`` parser's subcommands ``sub``."""
    p = sub.add_parser("mcp", help="start each [mcp.NAME] server briefly and show its state")
    common(p)
    p.add_argument("--json", action="store_true", help="one JSON object per server")
    p.set_defaults(fn=lambda args: cmd_mcp(args, config_of(args)))
