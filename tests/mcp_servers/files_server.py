"""A small MCP server on the SDK's ``MCPServer``, started by the tests over stdio or HTTP.

``python -m tests.mcp_servers.files_server`` serves stdio; ``--http PORT`` streamable HTTP on
127.0.0.1; ``--exit-at-start`` exits at once with status 3; ``--mute`` never answers anything
(it reads its stdin and waits). Its tools say on stderr what they do, so a test reads in
loopd's log that a call reached the server (and that its cancellation did).
"""

from __future__ import annotations

import os
import sys

if "--exit-at-start" in sys.argv:  # before the SDK's imports: a quick death
    print("exiting at start", file=sys.stderr, flush=True)
    sys.exit(3)

if "--mute" in sys.argv:  # before the SDK's imports too: mute at once, however busy the machine
    print(f"mute {os.getpid()}", file=sys.stderr, flush=True)
    for _ in sys.stdin:  # reads and never answers, until stdin closes
        pass
    sys.exit(0)

import anyio
from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("files")


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@server.tool(description="Read a file by its path.")
def read(path: str) -> str:
    say(f"read {path}")
    return f"contents of {path}"


@server.tool(description="Search for a word.")
def search(word: str, limit: int = 3) -> str:
    return "\n".join(f"{word} {i}" for i in range(limit))


@server.tool(description="Always fails.")
def broken() -> str:
    raise ToolError("the disk is on fire")


@server.tool(description="A tiny picture.")
def picture() -> Image:
    return Image(data=b"\x89PNG" + bytes(96), format="png")


@server.tool(description="The server's process id.")
def pid() -> int:
    return os.getpid()


@server.tool(description="A variable of the server's environment ('' if unset).")
def getenv(name: str) -> str:
    return os.environ.get(name, "")


@server.tool(description="A header of the HTTP request that called this tool.")
def header(name: str, ctx: Context) -> str:
    request = ctx.request_context.request
    return "" if request is None else str(request.headers.get(name, ""))


@server.tool(description="Works for a while.")
async def slow(seconds: float = 30.0) -> str:
    say(f"slow started in {os.getpid()}")
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        say("slow cancelled")
        raise
    return "slow finished"


@server.tool(description="Reports its progress in three steps.")
async def steps(ctx: Context) -> str:
    for done in (1, 2, 3):
        await ctx.report_progress(done, 3, f"step {done}")
    return "three steps"


@server.tool(description="Writes a flood of lines on stderr.")
def flood(lines: int = 1000) -> str:
    for i in range(lines):
        print(f"flood line {i} " + "x" * 50, file=sys.stderr)
    sys.stderr.flush()
    return "flooded"


@server.tool(description="Adds the tool `extra` and says its list changed.")
async def grow(ctx: Context) -> str:
    def extra() -> str:
        return "extra answers"

    server.add_tool(extra, name="extra", description="Added later.")
    await ctx.request_context.session.send_tool_list_changed()
    return "grown"


def _too_long() -> str:
    return "never listed"


server.add_tool(_too_long, name="t" * 70, description="Its joined name is too long.")


def main() -> None:
    args = sys.argv[1:]
    if "--http" in args:
        port = int(args[args.index("--http") + 1])
        server.run("streamable-http", host="127.0.0.1", port=port)
        return
    say(f"serving stdio in {os.getpid()}")  # tests that kill a live server read its pid here
    server.run()


if __name__ == "__main__":
    main()
