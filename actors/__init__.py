"""loopd's runtime: the actors, the model client, tools, the store, the CLI and the test kit.

Embed it with :class:`Runtime`::

    from actors import Config, ModelConfig, Runtime
    with Runtime.start(Config(home=path, model=ModelConfig(base_url=url, name="local"))) as rt:
        reply = rt.run_turn("mm-thread", "hello", timeout=120)
"""

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
