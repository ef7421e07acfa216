"""``--tools package.module:name``: port tools loaded by import path for the command line."""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from actors.tools.tool import PortTool

__all__ = ["load_tools"]


def load_tools(specs: Iterable[str]) -> list[PortTool]:
    """The tools named by ``specs``, each ``package.module:name`` naming a :class:`PortTool` or
    a list of them. ``ValueError`` saying which spec is wrong and why; the same tool name twice
    is refused."""
    tools: list[PortTool] = []
    for spec in specs:
        module_name, colon, attribute = spec.partition(":")
        if not colon or not module_name or not attribute:
            raise ValueError(f"--tools {spec}: expected package.module:name")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(f"--tools {spec}: cannot import {module_name}: {exc}") from None
        try:
            found = getattr(module, attribute)
        except AttributeError:
            raise ValueError(f"--tools {spec}: {module_name} has no {attribute}") from None
        items = [found] if isinstance(found, PortTool) else found
        if isinstance(items, str | bytes) or not isinstance(items, Iterable):
            raise ValueError(f"--tools {spec}: {attribute} is not a port tool or a list of them")
        for item in items:
            if not isinstance(item, PortTool):
                raise ValueError(
                    f"--tools {spec}: {item!r} is not a port tool (decorate it with @port_tool)"
                )
            tools.append(item)
    names = [tool.name for tool in tools]
    for name in names:
        if names.count(name) > 1:
            raise ValueError(f"--tools: the tool {name} is given twice")
    return tools
