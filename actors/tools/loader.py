"""``--tools package.module:name``: port tools loaded by import path for the command line."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterable, Iterator

from actors.tools.tool import PortTool

__all__ = ["load_tools", "working_folder_on_path"]


@contextlib.contextmanager
def working_folder_on_path() -> Iterator[None]:
    """The working folder first on ``sys.path`` while the block runs, as ``python -m`` puts it
    (the ``loopd`` script's own path is its bin folder, where no tool module lives)."""
    here = os.getcwd()
    if any(os.path.abspath(entry or os.curdir) == here for entry in sys.path):
        yield  # already there (python -m, PYTHONPATH=.): leave the path as it is
        return
    sys.path.insert(0, here)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):  # a tool module that took it off itself
            sys.path.remove(here)


def load_tools(specs: Iterable[str]) -> list[PortTool]:
    """The tools named by ``specs``, each ``package.module:name`` naming a :class:`PortTool` or
    a list of them. ``ValueError`` saying which spec is wrong and why; the same tool name twice
    is refused. A module in the working folder imports, as it would with ``python -m``."""
    tools: list[PortTool] = []
    for spec in specs:
        module_name, colon, attribute = spec.partition(":")
        if not colon or not module_name or not attribute:
            raise ValueError(f"--tools {spec}: expected package.module:name")
        try:
            with working_folder_on_path():
                module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(f"--tools {spec}: cannot import {module_name}: {exc}") from None
        except Exception as exc:  # a module that breaks while it loads (a SyntaxError...)
            raise ValueError(
                f"--tools {spec}: cannot import {module_name}: {type(exc).__name__}: {exc}"
            ) from None
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
