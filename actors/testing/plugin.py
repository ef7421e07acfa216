"""The pytest plugin of loopd's test kit (registered through the ``pytest11`` entry point)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pykka
import pytest

from actors.config import Config
from actors.directory import Directory
from actors.memory import MemorySource
from actors.port import PortTool
from actors.runtime import Runtime
from actors.testing.chat_server import ChatServer
from actors.testing.model import ScriptedModel
from actors.testing.probe import Probe
from actors.testing.script import Answer, RawResponse

__all__ = ["chat_server", "loopd_config", "loopd_runtime", "probe", "pytest_sessionfinish"]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop every actor still running, so a failed test cannot keep the process alive.

    pykka's actor threads are not daemons: one left behind by a test that failed half-way would
    make the interpreter wait for it forever after the last test.
    """
    pykka.ActorRegistry.stop_all(block=True, timeout=10)


@pytest.fixture
def loopd_config(tmp_path: Path) -> Config:
    """A Config whose home is this test's temporary folder."""
    return Config(home=str(tmp_path / "home"))


def _with(config: Config, overrides: dict[str, dict[str, Any]]) -> Config:
    changes = {
        section: msgspec.structs.replace(getattr(config, section), **values)
        for section, values in overrides.items()
    }
    return config.replace(**changes)


@pytest.fixture
def loopd_runtime(loopd_config: Config) -> Iterator[Callable[..., Runtime]]:
    """A factory of started runtimes, each stopped when the test ends::

    rt = loopd_runtime([reply("hi")])                      # a ScriptedModel from a list
    rt = loopd_runtime(script_fn, loop={"max_steps": 2})   # config sections overridden
    rt = loopd_runtime(model=my_model, tools=[my_tool])
    """
    started: list[Runtime] = []

    def start(
        script: Sequence[Answer] | Callable[..., Answer] | None = None,
        *,
        model: Any = None,
        tools: Iterable[PortTool] | None = None,
        memory_source: MemorySource | None = None,
        config: Config | None = None,
        **sections: dict[str, Any],
    ) -> Runtime:
        if model is None and script is not None:
            model = ScriptedModel(script)
        cfg = _with(config or loopd_config, sections)
        rt = Runtime.start(cfg, model=model, tools=tools, memory=memory_source)
        started.append(rt)
        return rt

    yield start
    for rt in reversed(started):
        rt.stop()


@pytest.fixture
def chat_server() -> Iterator[Callable[..., ChatServer]]:
    """A factory of fake OpenAI-compatible servers on 127.0.0.1, stopped when the test ends."""
    servers: list[ChatServer] = []

    def start(
        script: Sequence[Answer | RawResponse] | Callable[[dict[str, Any]], Answer | RawResponse],
    ) -> ChatServer:
        server = ChatServer(script).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def probe() -> Iterator[Callable[..., Probe]]:
    """A factory of probes (``probe(rt.directory)``), stopped when the test ends."""
    probes: list[Probe] = []

    def start(directory: Directory | None = None, name: str = "probe") -> Probe:
        p = Probe.start(directory, name)
        probes.append(p)
        return p

    yield start
    for p in probes:
        p.stop()
