"""loopd's runtime: the actors, the model client, tools, the store, the CLI and the test kit.

Embed it with :class:`Runtime`::

    from actors import Config, ModelConfig, Runtime
    with Runtime.start(Config(home=path, model=ModelConfig(base_url=url, name="local"))) as rt:
        reply = rt.run_turn("mm-thread", "hello", timeout=120)

The names below are imported on first use, so ``import actors.<something>`` (the ``loopd``
command among them) does not pay for the runtime, the model client and their libraries.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from actors.core.config import (
        AgentConfig,
        CompactConfig,
        Config,
        ConfigError,
        LoopConfig,
        ModelConfig,
        SlotsConfig,
        SubagentsConfig,
    )
    from actors.core.mcp_config import McpServerConfig
    from actors.dispatcher.directory import Directory
    from actors.models.base import AsyncChatModel, ChatModel, ModelFailure
    from actors.models.http import HttpChatModel
    from actors.runtime import Runtime
    from actors.runtime.collector import tune_collector
    from actors.stores.lock import HomeInUse
    from actors.stores.memory import FileMemory, MemoryFailure, MemorySource
    from actors.tools.tool import PortTool, ToolContext, ToolOutput
    from actors.tools.typed import port_tool

_WHERE = {
    "AgentConfig": "actors.core.config",
    "AsyncChatModel": "actors.models.base",
    "ChatModel": "actors.models.base",
    "CompactConfig": "actors.core.config",
    "Config": "actors.core.config",
    "ConfigError": "actors.core.config",
    "Directory": "actors.dispatcher.directory",
    "FileMemory": "actors.stores.memory",
    "HomeInUse": "actors.stores.lock",
    "HttpChatModel": "actors.models.http",
    "LoopConfig": "actors.core.config",
    "McpServerConfig": "actors.core.mcp_config",
    "MemoryFailure": "actors.stores.memory",
    "MemorySource": "actors.stores.memory",
    "ModelConfig": "actors.core.config",
    "ModelFailure": "actors.models.base",
    "PortTool": "actors.tools.tool",
    "Runtime": "actors.runtime",
    "SlotsConfig": "actors.core.config",
    "SubagentsConfig": "actors.core.config",
    "ToolContext": "actors.tools.tool",
    "ToolOutput": "actors.tools.tool",
    "port_tool": "actors.tools.typed",
    "tune_collector": "actors.runtime.collector",
}
"""Where each public name lives."""

__all__ = [
    "AgentConfig",
    "AsyncChatModel",
    "ChatModel",
    "CompactConfig",
    "Config",
    "ConfigError",
    "Directory",
    "FileMemory",
    "HomeInUse",
    "HttpChatModel",
    "LoopConfig",
    "McpServerConfig",
    "MemoryFailure",
    "MemorySource",
    "ModelConfig",
    "ModelFailure",
    "PortTool",
    "Runtime",
    "SlotsConfig",
    "SubagentsConfig",
    "ToolContext",
    "ToolOutput",
    "port_tool",
    "tune_collector",
]


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use (and keep it here)."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'actors' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, the lazy ones included."""
    return sorted({*globals(), *_WHERE})
