"""Start a real llama-server for the llama lane: the tests' fixture and ``bench/bench_llama.py``.

The binary, the model and the chat template come from ``.ci/build-llama-server`` (built once per
machine, cached under ``~/.cache/loopd-llama`` or ``$LOOPD_LLAMA_CACHE``), or from the folder
``$LOOPD_LLAMA_DIR`` names (``bin/llama-server``, ``model.gguf``, ``template.jinja``). The server
runs as docs/llama.md says: ``-np`` explicit, ``--jinja`` and the Qwen2.5 template, with which
SmolLM2-135M emits OpenAI tool calls. ``$LOOPD_LLAMA_THREADS`` sets ``-t`` (default 2; on a
machine shared with other work, 1 is faster: llama.cpp's threads wait for each other).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

__all__ = ["Server", "running_server", "server_dir", "threads"]

ROOT = Path(__file__).resolve().parents[2]


def server_dir() -> Path:
    """The folder holding ``bin/llama-server``, ``model.gguf`` and ``template.jinja``."""
    given = os.environ.get("LOOPD_LLAMA_DIR")
    if given:
        return Path(given)
    built = subprocess.run(
        ["bash", str(ROOT / ".ci" / "build-llama-server")],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(built.stdout.strip().splitlines()[-1])


def threads() -> int:
    """The server's ``-t``: ``$LOOPD_LLAMA_THREADS``, default 2."""
    return int(os.environ.get("LOOPD_LLAMA_THREADS", "2"))


@dataclass(frozen=True)
class Server:
    """A started llama-server: its root URL and its process."""

    url: str
    process: subprocess.Popen[bytes]

    def cpu_s(self) -> float:
        """The CPU seconds the server has used so far (user and system, from ``/proc``)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def running_server(
    slots: int,
    context: int,
    log_path: Path,
    extra: Sequence[str] = (),
    cpu_threads: int | None = None,
) -> Iterator[Server]:
    """A llama-server with ``slots`` slots sharing ``context`` tokens and ``cpu_threads``
    threads (default :func:`threads`), healthy (its root URL is ``http://127.0.0.1:<port>``);
    stopped after."""
    folder = server_dir()
    port = _free_port()
    command = [
        str(folder / "bin" / "llama-server"),
        "-m", str(folder / "model.gguf"),
        "--host", "127.0.0.1",
        "--port", str(port),
        "-np", str(slots),
        "-c", str(context),
        "-t", str(cpu_threads or threads()),
        "--jinja",
        "--chat-template-file", str(folder / "template.jinja"),
        *extra,
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"llama-server exited: {log_path.read_text()[-2000:]}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama-server not healthy in 120 s; see {log_path}")
            # Between two polls, wait for the server process: a crash ends the wait at once.
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(timeout=0.5)
        yield Server(url, server)
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
