"""``python -m actors.testing.chat_server``: the fake server on its own, from a script file.

The file's format is described in :mod:`actors.testing.script_file` (and in the user guide's
section on tests).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from actors.testing.chat_server.server import ChatServer
from actors.testing.script_file import load_script

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Serve a script until SIGINT or SIGTERM; exit 2 for a bad script, port or log file."""
    parser = argparse.ArgumentParser(
        prog="python -m actors.testing.chat_server",
        description="A fake OpenAI-compatible chat-completions server on 127.0.0.1.",
    )
    parser.add_argument(
        "--script",
        required=True,
        help="a JSON file of answers: an array used in order, or an object that keys them "
        "by the conversation's first user message (see docs/guide.md)",
    )
    parser.add_argument("--port", type=int, default=0, help="the port (default: a free one)")
    parser.add_argument(
        "--log",
        metavar="FILE",
        help="write one JSON line per request received to FILE (emptied first)",
    )
    args = parser.parse_args(argv)
    try:
        script = load_script(args.script)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    server = ChatServer(script, log=args.log)
    try:
        server.start(args.port)
    except OSError as exc:
        if args.log is not None and exc.filename == args.log:
            print(f"error: cannot write the log {args.log}: {exc.strerror or exc}", file=sys.stderr)
        else:
            why = exc.strerror or exc
            print(f"error: cannot listen on port {args.port}: {why}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"serving {server.base_url} ({script.describe()})", flush=True)
    try:
        stop.wait()
    finally:
        server.stop()
    print(f"stopped after {len(server.requests)} request(s)", flush=True)
    for error in server.errors:
        print(f"error: {error}", file=sys.stderr)
    return 0
