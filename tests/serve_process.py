"""A ``loopd serve --listen 127.0.0.1:0`` process for the tests: started on a TOML config,
its address read from its own log line, stopped with SIGTERM (SIGKILL if it hangs)."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

__all__ = ["ServeProcess"]


class ServeProcess:
    """``loopd serve`` on ``config`` (TOML text written to ``tmp/name``), in ``tmp``, with
    ``env`` added to the environment; ``url`` once it listens and runs."""

    def __init__(
        self, tmp: Path, config: str, env: dict[str, str], wait: float, name: str = "loopd.toml"
    ) -> None:
        path = tmp / name
        path.write_text(config)
        self.wait = wait
        args = ["serve", "--config", str(path), "--listen", "127.0.0.1:0"]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "actors.shells.cli", *args],
            cwd=tmp,
            env=dict(os.environ, HOME=str(tmp), **env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self.url = self.until("loopd serve: listening on ").rsplit(" ", 1)[1].strip()
        self.until("loopd serve: running on")

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)

    def until(self, text: str) -> str:
        """The next line of its log that holds ``text``, within ``wait`` seconds."""
        deadline = time.monotonic() + self.wait
        while True:
            left = deadline - time.monotonic()
            try:
                line = self.lines.get(timeout=max(0.0, left))
            except queue.Empty:
                raise AssertionError(f"loopd serve never said {text!r}") from None
            self.seen.append(line)
            if text in line:
                return line

    def rest(self) -> str:
        """Every line of its log seen, and those still queued (read once it has ended)."""
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return "".join(self.seen)

    def stop(self) -> int:
        """SIGTERM, then SIGKILL if it does not end within ``wait``; its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(self.wait)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(self.wait)

    def kill(self) -> None:
        """SIGKILL: the process ends nothing."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(self.wait)
