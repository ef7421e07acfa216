"""The pytest plugin of loopd's test kit (registered through the ``pytest11`` entry point)."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
import pykka
import pytest

from actors.core.config import Config
from actors.dispatcher.directory import Directory
from actors.models.offline import forbid_real_models
from actors.runtime import Runtime
from actors.stores.memory import MemorySource
from actors.testing.chat_server import ChatServer, ScriptFunction, Step
from actors.testing.model import ScriptedModel
from actors.testing.probe import Probe
from actors.testing.script import Answer
from actors.tools.tool import PortTool
from actors.tracing.base import Tracer

__all__ = [
    "STOP_TIMEOUT_S",
    "chat_server",
    "loopd_config",
    "loopd_runtime",
    "probe",
    "pytest_addoption",
    "pytest_configure",
    "pytest_sessionfinish",
]

STOP_TIMEOUT_S = 10.0
"""How long the kit waits for what it stops, one runtime or every actor left at the end, unless
the ini option ``loopd_stop_timeout`` says otherwise."""


def pytest_addoption(parser: pytest.Parser) -> None:
    """The kit's options: the ini ``loopd_stop_timeout`` (seconds), and
    ``--loopd-no-real-model`` (ini ``loopd_no_real_model``): any runtime that would talk to a
    real model fails loudly."""
    parser.addini(
        "loopd_stop_timeout",
        "seconds loopd's test kit waits for the runtimes and actors it stops",
        default=str(STOP_TIMEOUT_S),
    )
    help_text = (
        "fail any test whose runtime would send requests to a real model endpoint "
        "(the kit's ScriptedModel and ChatServer stay allowed)"
    )
    parser.addoption("--loopd-no-real-model", action="store_true", help=help_text)
    parser.addini("loopd_no_real_model", help_text, type="bool", default=False)


def pytest_configure(config: pytest.Config) -> None:
    """Turn the real-model switch on when the option or the ini key asks for it."""
    if config.getoption("loopd_no_real_model", False) or config.getini("loopd_no_real_model"):
        forbid_real_models()


def _stop_timeout(config: pytest.Config) -> float:
    try:
        return float(config.getini("loopd_stop_timeout"))
    except (TypeError, ValueError):
        return STOP_TIMEOUT_S


class LoopdCleanupWarning(pytest.PytestWarning):
    """The test kit could not stop something a test left running; the run still passes."""


def _warn(text: str) -> None:
    warnings.warn(LoopdCleanupWarning(text), stacklevel=2)


_left_behind: list[pykka.ActorRef[Any]] = []
"""Actors of the kit's own runtimes and probes that were still alive after their fixture
stopped them: the only actors the kit stops again at the end of the run."""


def _runtime_actors(rt: Runtime) -> list[pykka.ActorRef[Any]]:
    """The actors of ``rt`` still in pykka's registry: its own refs, and every actor that
    answers at its directory (sessions, the Context, pool workers, the store). A cluster
    runtime's actors live in its shards' processes: none are here."""
    own = set(getattr(rt, "_refs", {}).values())
    home = getattr(rt, "directory", None)
    if not own and home is None:
        return []
    found = []
    for ref in pykka.ActorRegistry.get_all():
        actor = ref._actor_weakref()
        env = getattr(actor, "env", None)
        directory = getattr(actor, "directory", None) or getattr(env, "directory", None)
        if ref in own or (home is not None and directory is home):
            found.append(ref)
    return found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop what the kit's own fixtures started and could not stop when their test ended.

    Only those: a test suite's own actors, and runtimes a test started by itself, are the
    suite's business. They are told to stop at once and waited for together, within the
    ``loopd_stop_timeout``; what is still running then is reported as a warning, never as an
    error: the kit does not fail a run by itself.
    """
    left = [ref for ref in _left_behind if ref.is_alive()]
    _left_behind.clear()
    if not left:
        return
    stopping = []
    for ref in left:
        try:
            stopping.append((ref, ref.stop(block=False)))
        except Exception:  # one actor that cannot be told must not keep the rest running
            continue
    limit = _stop_timeout(session.config)
    deadline = time.monotonic() + limit
    stuck = []
    for ref, future in stopping:
        try:
            future.get(timeout=max(0.0, deadline - time.monotonic()))
        except pykka.Timeout:
            stuck.append(ref)
        except Exception:  # an actor that died while stopping is stopped
            continue
    if stuck:
        names = ", ".join(sorted({ref.actor_class.__name__ for ref in stuck}))
        _warn(
            f"loopd's test kit could not stop {len(stuck)} actor(s) of its fixtures within "
            f"{limit} s at the end of the run ({names}): a test left work in flight, such as "
            "a tool that never returns"
        )


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
def loopd_runtime(
    loopd_config: Config, pytestconfig: pytest.Config
) -> Iterator[Callable[..., Runtime]]:
    """A factory of started runtimes, each stopped when the test ends::

    rt = loopd_runtime([reply("hi")])                      # a ScriptedModel from a list
    rt = loopd_runtime(script_fn, loop={"max_steps": 2})   # config sections overridden
    rt = loopd_runtime(model=my_model, tools=[my_tool], memory=my_memory, clock=fixed_clock)

    It takes ``Runtime.start``'s keyword arguments by the same names (``model``, ``tools``,
    ``memory``, ``clock``, ``tracer``, ``subscribe``), plus ``config`` and sections to
    override (a dict given as ``memory`` is the ``[memory]`` section).
    """
    started: list[Runtime] = []

    def start(
        script: Sequence[Answer] | Callable[..., Answer] | None = None,
        *,
        model: Any = None,
        tools: Iterable[PortTool] | None = None,
        memory: MemorySource | dict[str, Any] | None = None,
        clock: Callable[[], datetime] | None = None,
        tracer: Tracer | None = None,
        config: Config | None = None,
        memory_source: MemorySource | None = None,
        subscribe: Iterable[Callable[[Any], Any]] = (),
        **sections: dict[str, Any],
    ) -> Runtime:
        if model is None and script is not None:
            model = ScriptedModel(script)
        if isinstance(memory, dict):  # the [memory] config section, not a memory source
            sections["memory"], memory = memory, None
        cfg = _with(config or loopd_config, sections)
        options: dict[str, Any] = {} if clock is None else {"clock": clock}
        memory = memory if memory is not None else memory_source  # the older name
        rt = Runtime.start(
            cfg,
            model=model,
            tools=tools,
            memory=memory,
            tracer=tracer,
            subscribe=subscribe,
            **options,
        )
        started.append(rt)
        return rt

    yield start
    for rt in reversed(started):
        try:
            rt.stop(timeout=_stop_timeout(pytestconfig))
        except Exception as exc:  # reported, not raised: the test itself decides pass or fail
            _warn(f"loopd's test kit could not stop a runtime: {type(exc).__name__}: {exc}")
        _left_behind.extend(_runtime_actors(rt))


@pytest.fixture
def chat_server() -> Iterator[Callable[..., ChatServer]]:
    """A factory of fake OpenAI-compatible servers on 127.0.0.1, stopped when the test ends:
    ``chat_server(script, total_slots=..., log=...)`` takes :class:`ChatServer`'s arguments."""
    servers: list[ChatServer] = []

    def start(
        script: Sequence[Step] | ScriptFunction | Mapping[str, Sequence[Step] | ScriptFunction],
        **options: Any,
    ) -> ChatServer:
        server = ChatServer(script, **options).start()
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
        try:
            p.stop()
        except Exception as exc:  # reported, not raised, like a runtime that will not stop
            _warn(f"loopd's test kit could not stop a probe: {type(exc).__name__}: {exc}")
        if p.ref.is_alive():
            _left_behind.append(p.ref)
