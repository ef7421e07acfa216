"""What the MCP tests share: the test server's command, a scripted model that calls what the
user text names, a watcher of loopd's log, and an HTTP server process on 127.0.0.1."""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from actors.core.mcp_config import McpServerConfig
from actors.testing.script import Answer, call, reply
from messages import ModelRequest

WAIT = 20.0
SERVER = str(Path(__file__).parent / "mcp_servers" / "files_server.py")


def stdio(*flags: str, **options: Any) -> McpServerConfig:
    """The test server over stdio (``flags`` for its command line)."""
    options.setdefault("timeout_s", WAIT)
    return McpServerConfig(command=(sys.executable, SERVER, *flags), **options)


def calls_what_it_is_told(request: ModelRequest) -> Answer:
    """A model whose user text (its last line) is ``<tool> <json arguments>``: it calls that
    tool, then answers the tool's text; ``say:<word>`` is answered ``<word>``."""
    last = request.messages[-1]
    if last.role == "user":
        lines = (last.content or "").splitlines() or [""]
        name, _, arguments = lines[-1].partition(" ")  # a child's task is after its date line
        if name.startswith("say:"):
            return reply(name[4:])
        return call(name, arguments.strip() or "{}")
    return reply(last.content or "")


class LogWatch(logging.Handler):
    """Records loopd's MCP log lines and lets a test wait for one matching a pattern."""

    def __init__(self, logger: str = "actors") -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._logger = logging.getLogger(logger)

    def __enter__(self) -> LogWatch:
        self._logger.addHandler(self)
        self._level = self._logger.level
        self._logger.setLevel(logging.DEBUG)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)

    def emit(self, record: logging.LogRecord) -> None:
        with self._cond:
            self.lines.append(record.getMessage())
            self._cond.notify_all()

    def wait_for(self, pattern: str, timeout: float = WAIT) -> re.Match[str]:
        """The first line matching ``pattern``, waiting for it up to ``timeout`` s."""
        found: list[re.Match[str]] = []

        def match() -> bool:
            for line in self.lines:
                m = re.search(pattern, line)
                if m:
                    found.append(m)
                    return True
            return False

        with self._cond:
            if not self._cond.wait_for(match, timeout):
                raise AssertionError(f"no log line matched {pattern!r} within {timeout} s")
        return found[0]

    def wait_for_count(self, pattern: str, n: int, timeout: float = WAIT) -> None:
        """Wait until ``n`` lines match ``pattern``."""
        with self._cond:
            if not self._cond.wait_for(
                lambda: sum(bool(re.search(pattern, line)) for line in self.lines) >= n, timeout
            ):
                raise AssertionError(f"fewer than {n} log lines matched {pattern!r}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class HttpServer:
    """The test server over streamable HTTP on 127.0.0.1, in a process of its own; started
    once its log says it listens."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.process = subprocess.Popen(
            [sys.executable, SERVER, "--http", str(self.port)],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        ready = threading.Event()

        def read() -> None:
            assert self.process.stderr is not None
            for line in self.process.stderr:
                if "Uvicorn running on" in line:
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(WAIT):
            self.stop()
            raise AssertionError("the MCP HTTP test server did not start")

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(WAIT)


def process_alive(pid: int) -> bool:
    """True if ``pid`` is a running process (a zombie nobody reaped yet counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")
