"""A hostile MCP server on the SDK's ``MCPServer``, for tests/hostile/test_hostile_mcp.py.

Flags (several may be given):

- ``--tools N``: lists N extra tools ``t0`` ... (each with a small schema);
- ``--huge-schema N``: lists a tool ``huge`` whose input schema has N properties;
- ``--odd-names``: lists a tool named ``""`` and ``read`` a second time;
- ``--line-first N``: writes a line of N bytes on stdout before it serves (before the
  handshake's answer);
- ``--junk-first N``: writes N lines that are not JSON on stdout before it serves.

Tools: ``read`` (answers at once), ``big(size)`` (answers ``size`` characters), ``hang``
(never answers), ``junk(lines)`` (writes lines that are not JSON on stdout, then answers),
``deep`` (answers itself, raw, with a result nested 5,000 deep), ``storm(seconds)`` (says its
list changed as fast as it can, for ``seconds``), ``child`` (starts a child process that
sleeps, answers its pid), ``pid``. Its stderr says what it does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import Tool

args = sys.argv[1:]
WIRE = os.dup(1)  # the real stdout: once it serves, the SDK points fd 1 at stderr


def _flag(name: str, default: int = 0) -> int:
    return int(args[args.index(name) + 1]) if name in args else default


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Hostile(MCPServer):
    """Lists what the flags ask for besides its own tools."""

    lists = 0  # how many tools/list requests it answered

    async def list_tools(self) -> list[Tool]:
        Hostile.lists += 1
        tools = await super().list_tools()
        schema = {"type": "object", "properties": {"a": {"type": "string"}}}
        if "--huge-schema" in args:
            props = {f"p{i}": {"type": "string"} for i in range(_flag("--huge-schema"))}
            tools.append(Tool(name="huge", input_schema={"type": "object", "properties": props}))
        tools += [Tool(name=f"t{i}", input_schema=schema) for i in range(_flag("--tools"))]
        if "--odd-names" in args:
            tools.append(Tool(name="", input_schema={"type": "object"}))
            tools.append(Tool(name="read", input_schema={"type": "object"}))
        return tools


server = Hostile("hostile")


@server.tool(description="Answers at once.")
def read(path: str) -> str:
    return f"contents of {path}"


@server.tool(description="The server's process id.")
def pid() -> int:
    return os.getpid()


@server.tool(description="Answers size characters.", structured_output=False)
def big(size: int) -> str:
    say(f"big {size}")
    return "b" * size


@server.tool(description="Never answers.")
async def hang() -> str:
    say(f"hang started in {os.getpid()}")
    await anyio.sleep_forever()
    return "never"


@server.tool(description="Writes lines that are not JSON on stdout, then answers.")
async def junk(lines: int) -> str:
    for i in range(lines):  # each line one write, so never inside one of the SDK's messages
        os.write(WIRE, b"not json %d\n" % i)
    return "junked"


@server.tool(description="Answers itself with a result nested 5,000 deep, then never again.")
async def deep(ctx: Context) -> str:
    ident = json.dumps(ctx.request_id)
    body = '{"a":' * 5000 + "1" + "}" * 5000
    line = f'{{"jsonrpc": "2.0", "id": {ident}, "result": {body}}}\n'
    os.write(WIRE, line.encode())  # one write of under 64 KiB: never inside another message
    await anyio.sleep_forever()
    return "never"


@server.tool(description="Says its tool list changed, again and again, for a while.")
async def storm(ctx: Context, seconds: float = 5.0) -> str:
    end = time.monotonic() + seconds
    sent = 0
    while time.monotonic() < end:
        await ctx.request_context.session.send_tool_list_changed()
        sent += 1
        await anyio.sleep(0)
    say(f"storm sent {sent}")
    return f"stormed {sent}, listed {Hostile.lists}"


@server.tool(description="Starts a child process that sleeps; answers its pid.")
def child() -> int:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    say(f"child {process.pid}")
    return process.pid


def main() -> None:
    if "--line-first" in args:
        size = _flag("--line-first")
        block = b"x" * (1 << 20)
        for _ in range(size >> 20):
            os.write(1, block)
        os.write(1, b"x" * (size & ((1 << 20) - 1)) + b"\n")
    if "--junk-first" in args:
        os.write(1, b"".join(b"junk %d\n" % i for i in range(_flag("--junk-first"))))
    say(f"serving stdio in {os.getpid()}")
    server.run()


if __name__ == "__main__":
    main()
