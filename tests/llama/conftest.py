"""A real llama-server for the tests in this folder (``tox -e llama``).

The server is built once per machine by ``.ci/build-llama-server`` (cached under
``~/.cache/loopd-llama``, or ``$LOOPD_LLAMA_CACHE``) and started once per test session with four
slots of 4,096 tokens each, as docs/llama.md says: ``-np 4 -c 16384 --jinja`` and the Qwen2.5
chat template, with which SmolLM2-135M emits OpenAI tool calls (see ``llama_server``).
``$LOOPD_LLAMA_THREADS`` sets ``-t`` (default 2; on a machine shared with other work, 1 is
faster: llama.cpp's threads wait for each other).
Figures the tests measure are written to ``$LOOPD_LLAMA_FIGURES`` (default
``.tox/llama-figures.txt``) for docs/performance.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from llama_proxy import Proxy
from llama_server import ROOT, running_server

SLOTS = 4
CONTEXT = 16384
SLOT_CONTEXT = CONTEXT // SLOTS


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The root URL of a started llama-server (``http://127.0.0.1:<port>``)."""
    log_path = tmp_path_factory.mktemp("llama") / "server.log"
    with running_server(SLOTS, CONTEXT, log_path) as server:
        yield server.url


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
