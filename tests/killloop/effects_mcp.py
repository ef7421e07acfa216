"""The kill loop's MCP server: two side-effecting tools on the SDK's ``MCPServer``, over stdio.

    python effects_mcp.py EFFECTS RUN

The driver configures it as ``[mcp.fx]``, so the model sees ``fx__effect`` and ``fx__deploy``
(the driver lists ``fx__deploy`` in ``[approvals] tools``: a person must say yes first). Each
call appends one JSON line to EFFECTS, the side-effect log the driver's port tools write too,
and syncs it (``fdatasync``) before it answers. The server does not know loopd's session or
call id, so the model passes a ``key`` unique to the call, which the line records: the checks
count a key seen twice as a call run twice.

It ends when its stdin closes: when the driver is SIGKILLed, the pipe's other end goes with
it, so no server outlives its driver. This is a helper script, not a test module.
"""

from __future__ import annotations

import json
import os
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("fx")
_fd = -1
_run = "?"


def record(tool: str, key: str) -> str:
    """Append the call's line to the log and sync it, then answer."""
    line = json.dumps({"run": _run, "tool": f"fx__{tool}", "key": key}).encode() + b"\n"
    os.write(_fd, line)
    os.fdatasync(_fd)
    return f"fx__{tool} done for {key}"


@server.tool(description="Change something in the world, once. Pass a key unique to the call.")
def effect(key: str) -> str:
    return record("effect", key)


@server.tool(description="Deploy; a person must say yes first. Pass a key unique to the call.")
def deploy(key: str, what: str) -> str:
    return record("deploy", key)


def main() -> None:
    global _fd, _run
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    _fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    _run = sys.argv[2]
    server.run()  # MCP over stdin and stdout, until stdin closes
    # Every line is synced already: skip the teardown of the SDK's modules (about 0.15 s), so
    # a stopping runtime does not wait for it.
    os._exit(0)


if __name__ == "__main__":
    main()
