"""A real llama-server for the tests in this folder (``tox -e llama``).

The server is built once per machine by ``.ci/build-llama-server`` (cached under
``~/.cache/loopd-llama``, or ``$LOOPD_LLAMA_CACHE``) and started once per test session with two
slots, as docs/llama.md says: ``-np 2 -c 8192 --jinja`` and the Qwen2.5 chat template, with
which SmolLM2-135M emits OpenAI tool calls. ``$LOOPD_LLAMA_THREADS`` sets ``-t`` (default 2; on
a machine shared with other work, 1 is faster: llama.cpp's threads wait for each other).
Figures the tests measure are written to ``$LOOPD_LLAMA_FIGURES`` (default
``.tox/llama-figures.txt``) for docs/performance.md.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from llama_proxy import Proxy

ROOT = Path(__file__).resolve().parents[2]
SLOTS = 2
CONTEXT = 8192
SLOT_CONTEXT = CONTEXT // SLOTS


def _server_dir() -> Path:
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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The root URL of a started llama-server (``http://127.0.0.1:<port>``)."""
    folder = _server_dir()
    port = _free_port()
    log_path = tmp_path_factory.mktemp("llama") / "server.log"
    command = [
        str(folder / "bin" / "llama-server"),
        "-m", str(folder / "model.gguf"),
        "--host", "127.0.0.1",
        "--port", str(port),
        "-np", str(SLOTS),
        "-c", str(CONTEXT),
        "-t", os.environ.get("LOOPD_LLAMA_THREADS", "2"),
        "--jinja",
        "--chat-template-file", str(folder / "template.jinja"),
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
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture
def proxy(llama_server: str) -> Iterator[Proxy]:
    """A recording proxy in front of the server, stopped after the test."""
    started = Proxy(llama_server).start()
    yield started
    started.stop()


@pytest.fixture(scope="session")
def figures() -> Iterator[list[str]]:
    """Lines of measured figures; written to ``$LOOPD_LLAMA_FIGURES`` after the session."""
    lines: list[str] = []
    yield lines
    path = Path(os.environ.get("LOOPD_LLAMA_FIGURES", ROOT / ".tox" / "llama-figures.txt"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
